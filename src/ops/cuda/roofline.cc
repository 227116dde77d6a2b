// GPU roofline measurement (contract: roofline.h).
#include "ops/cuda/roofline.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_buffer.h"
#include "ops/cuda/gemm.h"

namespace moefold::cuda {
namespace {

using Clock = std::chrono::steady_clock;

/// Median host time of `runs` calls of f after `warmup` calls, each bracketed by device synchronisation.
template <class F>
double median_seconds(int warmup, int runs, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < warmup + runs; ++i) {
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = Clock::now();
    f();
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    if (i >= warmup) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

Roofline measure_roofline(int64_t gemm_n) {
  Roofline r;
  cudaDeviceProp prop{};
  int dev = 0;
  MOEFOLD_CUDA_CHECK(cudaGetDevice(&dev));
  MOEFOLD_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  r.device = prop.name;
  {
    const size_t bytes = size_t(2) << 30;
    DeviceBuffer<uint8_t> a(bytes), b(bytes);
    a.fill_bytes(1);
    const double s = median_seconds(2, 10, [&] {
      MOEFOLD_CUDA_CHECK(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
    });
    r.copy_bytes_per_s = 2.0 * double(bytes) / s;
  }
  {
    const int64_t n = gemm_n;
    std::vector<float> h(size_t(n * n));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    for (auto& v : h) v = d(rng);
    auto a = to_device_bf16(h), w = to_device_bf16(h);
    DeviceBuffer<__nv_bfloat16> y(size_t(n * n));
    const double s = median_seconds(2, 10, [&] { gemm_bf16(a.data(), w.data(), nullptr, y.data(), n, n, n, nullptr); });
    r.gemm_flops_per_s = 2.0 * double(n) * double(n) * double(n) / s;
  }
  r.copy_method = "cudaMemcpy device-to-device of 2 GiB, median of 10, bytes read + written";
  r.gemm_method = "cuBLASLt bf16 GEMM (gemm_bf16) " + std::to_string(gemm_n) + "^3, median of 10";
  return r;
}

}  // namespace moefold::cuda
