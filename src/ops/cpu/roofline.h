// The measured ceilings a kernel's speed is compared with: copy bandwidth (bytes read + written per
// second) and dense GEMM rate (FLOP/s), measured on the device in use at the start of a command. This
// file has the struct and the CPU measurement; the GPU one is src/ops/cuda/roofline.h.
#pragma once
#include <string>

namespace moefold {

/// Ceilings of one device, measured in this process.
struct Roofline {
  double copy_bytes_per_s = 0;  ///< bytes read + written per second by a large copy
  double gemm_flops_per_s = 0;  ///< FLOP/s of a large dense GEMM (2 per multiply-add)
  std::string device;           ///< what was measured, e.g. "cpu (2 threads)" or "NVIDIA H200"
  std::string copy_method;      ///< how, e.g. "memcpy 64 MiB, median of 7"
  std::string gemm_method;      ///< how, e.g. "OpenBLAS sgemm 1024^3, median of 5"
};

/// The CPU's ceilings: std::memcpy of a 64 MiB buffer and OpenBLAS sgemm (fp32) at n^3, medians after
/// a warm-up. Takes about a second on two cores. n >= 64.
Roofline measure_cpu_roofline(int gemm_n = 1024);

}  // namespace moefold
