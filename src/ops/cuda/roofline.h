// The GPU's measured ceilings (the Roofline struct: src/ops/cpu/roofline.h): device-to-device copy
// bandwidth and the cuBLASLt bf16 GEMM rate, measured the way `moefold bench` measures them.
#pragma once
#include <cstdint>

#include "ops/cpu/roofline.h"

namespace moefold::cuda {

/// Ceilings of the current CUDA device: cudaMemcpy device-to-device of 2 GiB (bytes read + written per
/// second, median of 10 after 2 warm-ups) and gemm_bf16 (cuBLASLt, bf16 in, fp32 accumulate) at
/// gemm_n^3 on random data (median of 10 after 2 warm-ups). Needs ~4 GiB + 3 gemm_n^2 * 2 bytes of
/// device memory; takes about a second on an H200. The launches it makes count in the kernel
/// registry: callers that check launch counts reset them afterwards (prof::reset_launch_counts).
/// Throws moefold::Error on a CUDA failure.
Roofline measure_roofline(int64_t gemm_n = 8192);

}  // namespace moefold::cuda
