// Helpers for the GPU contract tests: fast seeded random inputs (never zeros), bf16 rounding so the
// fp32 CPU reference sees exactly the kernel's inputs, device upload / download, bitwise checks
// that padding rows stayed untouched, and a parallel_for for the slower CPU references.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/device_buffer.h"
#include "test_util.h"

namespace moefold::test {

using cuda::DeviceBuffer;
using bf16 = __nv_bfloat16;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// An order of the pages [0, pages) for block tables: cut into runs of 1 .. max_run consecutive pages
/// (random lengths), the runs shuffled; so some key tiles cover consecutive pages and others do not
/// (the ws kernels' tall-box and piece-wise loads). max_run >= pages: one run (identity order).
inline std::vector<int32_t> page_runs(int pages, int max_run, uint64_t seed) {
  std::vector<std::pair<int32_t, int32_t>> runs;  // first page, length
  for (int p = 0; p < pages;) {
    const int len = std::min(pages - p, 1 + int(mix64(seed * 31 + uint64_t(p)) % uint64_t(std::max(max_run, 1))));
    runs.push_back({p, len});
    p += len;
  }
  for (size_t i = runs.size(); i > 1; --i) std::swap(runs[i - 1], runs[mix64(seed + 7777 + i) % i]);
  std::vector<int32_t> order;
  for (auto [first, len] : runs)
    for (int j = 0; j < len; ++j) order.push_back(first + j);
  return order;
}

/// n values uniform in [-amp, -amp/64] U [amp/64, amp] (never zero or tiny), already rounded to
/// bf16 (exactly representable), from a counter-based hash: fast enough for 10^8 elements.
inline std::vector<float> rand_bf16(size_t n, uint64_t seed, float amp = 1.0f) {
  std::vector<float> v(n);
  const uint64_t base = mix64(seed * 0x9E3779B97F4A7C15ULL + 12345);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = mix64(base + i);
    float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    u = 1.0f / 64 + u * (1 - 1.0f / 64);
    const float x = (r & 1) ? amp * u : -amp * u;
    v[i] = bf16_to_f32(f32_to_bf16(x));
  }
  return v;
}

/// Rounds every element to bf16 in place (what a bf16 device copy of it holds).
inline void round_bf16(std::vector<float>& v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
}

inline DeviceBuffer<bf16> dev_bf16(const std::vector<float>& v) { return cuda::to_device_bf16(v); }
inline std::vector<float> host_f32(const DeviceBuffer<bf16>& d) { return cuda::download_f32(d); }

/// Raw bf16 bits of a device buffer (bitwise comparisons).
inline std::vector<uint16_t> host_bits(const DeviceBuffer<bf16>& d) {
  auto h = d.download();
  std::vector<uint16_t> b(h.size());
  std::memcpy(b.data(), h.data(), h.size() * 2);
  return b;
}

/// Number of elements in [from, to) whose bits are not all-ones (the 0xFF poison).
inline size_t touched(const std::vector<uint16_t>& bits, size_t from, size_t to) {
  size_t n = 0;
  for (size_t i = from; i < to && i < bits.size(); ++i) n += bits[i] != 0xFFFF;
  return n;
}

/// Elements [from, to) of a fp32 view (for rel_err over the live part).
inline std::vector<float> slice(const std::vector<float>& v, size_t from, size_t to) {
  return std::vector<float>(v.begin() + ptrdiff_t(from), v.begin() + ptrdiff_t(to));
}

/// fp32 -> bf16 -> fp32 of every element (what the kernel's single output rounding gives).
inline std::vector<float> bf16_rounded(std::vector<float> v) {
  round_bf16(v);
  return v;
}

/// Runs f(i) for i in [0, n) on all hardware threads (dynamic scheduling).
inline void parallel_for(size_t n, const std::function<void(size_t)>& f) {
  const size_t nt = std::max<size_t>(1, std::min<size_t>(n, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::vector<std::thread> th;
  for (size_t t = 0; t < nt; ++t)
    th.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) f(i);
    });
  for (auto& t : th) t.join();
}

inline std::string join_ints(const std::vector<int>& v, size_t max_items = 6) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? "+" : "") + std::to_string(v[i]);
  if (v.size() > max_items) s += "+..";
  return s;
}

/// Median time in microseconds of f() (which enqueues work on the default stream) over `iters`
/// runs after `warmup` runs, each timed with CUDA events. For the DISABLED_*Perf* tests only.
inline double time_us(const std::function<void()>& f, int warmup = 3, int iters = 20) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[size_t(i)], a, b);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3;
}

/// One timing line: "PERF kernel=<k> shape=<s> us=<t> <metric>" (scripts/gpu/run_tests.sh --perf
/// tabulates them). metric e.g. "TB/s=3.1" or "TFLOP/s=420".
inline void perf_line(const std::string& kernel, const std::string& shape, double us, const std::string& metric) {
  std::printf("PERF kernel=%s shape=%s us=%.1f %s\n", kernel.c_str(), shape.c_str(), us, metric.c_str());
  std::fflush(stdout);
}

}  // namespace moefold::test
