// CPU roofline measurement (contract: roofline.h).
#include "ops/cpu/roofline.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"

namespace moefold {
namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double median_seconds(int warmup, int runs, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < warmup + runs; ++i) {
    const auto t0 = Clock::now();
    f();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= warmup) t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

Roofline measure_cpu_roofline(int gemm_n) {
  MOEFOLD_CHECK(gemm_n >= 64, "measure_cpu_roofline: gemm size {} is below 64", gemm_n);
  Roofline r;
  const size_t bytes = size_t(64) << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  volatile char sink = 0;
  const double copy_s = median_seconds(2, 7, [&] {
    std::memcpy(b.data(), a.data(), bytes);
    sink = b[bytes / 2];  // keep the copy observable
  });
  r.copy_bytes_per_s = 2.0 * double(bytes) / copy_s;
  const int n = gemm_n;
  std::vector<float> x(size_t(n) * size_t(n)), w(x.size()), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float(int(i % 17) - 8) * 0.125f;
    w[i] = float(int(i % 13) - 6) * 0.25f;
  }
  const double gemm_s = median_seconds(1, 5, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, x.data(), n, w.data(), n, 0.0f, y.data(), n);
  });
  r.gemm_flops_per_s = 2.0 * double(n) * double(n) * double(n) / gemm_s;
  r.device = "cpu (" + std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " hardware threads)";
  r.copy_method = "memcpy of 64 MiB, median of 7, bytes read + written";
  r.gemm_method = "OpenBLAS sgemm " + std::to_string(n) + "^3 fp32, median of 5";
  return r;
}

}  // namespace moefold
