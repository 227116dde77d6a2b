// The decode GEMM's launch configurations (decode_gemm.h, DecodeGemmCfg) give the same bits.
// NewEqualsOld: for the fixtures' shapes (S = 1, 2, 8, 32; bf16 and fp32 out; bias; strides) and the
// 35B projections (S = 2, 8, 16, 4, 2), every max_rows 1..256: the new configurations' output
// buffers (poisoned 0xFF before each call, padding rows and stride gaps included) equal the old
// one's byte for byte; device live counts below max_rows (live rows equal a max_rows = live call of
// the old config, the rest stays poisoned); accuracy against fp64 on sampled rows (so the two do not
// agree on something wrong).
// DISABLED_Perf: old vs new vs new_nopf vs new_nocl per 35B shape at M = 1, 4, 16, 64, in the order
// old new nopf nocl nocl nopf new old (A B B A), weights rotated over > 300 MB so each call streams from HBM;
// us per call back to back (PDL on, as in a step), TB/s against a device copy measured here, and the
// same after a one-block 6 us kernel (as a norm before a projection: the L2 prefetch overlaps it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/pdl.cuh"
#include "spin_wait.cuh"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

__global__ void count_diff_bytes(const unsigned char* a, const unsigned char* b, size_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += a[i] != b[i];
  if (c) atomicAdd(out, c);
}

/// Bytes of y outside rows [0, live) x columns [0, row_bytes) (pitch bytes per row) that are not 0xFF.
__global__ void count_unpoisoned(const unsigned char* y, size_t rows, size_t pitch, size_t row_bytes, size_t live,
                                 unsigned long long* out) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < rows * pitch; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / pitch, b = i % pitch;
    if (r < live && b < row_bytes) continue;
    c += y[i] != 0xFF;
  }
  if (c) atomicAdd(out, c);
}

struct Shape {
  int64_t N, K;
  bool f32out, bias;
  int64_t x_pad, y_pad;
};

template <class OutT>
struct Case {
  using BiasT = std::conditional_t<sizeof(OutT) == 4, float, bf16>;
  static constexpr int64_t kMax = cu::kDecodeGemmMaxRows;
  Shape s;
  int64_t xs, ys;
  std::vector<float> x, w, b;
  DeviceBuffer<bf16> dx, dw;
  DeviceBuffer<BiasT> db;
  DeviceBuffer<unsigned char> ws;
  DeviceBuffer<OutT> y_old, y_new;
  DeviceBuffer<unsigned long long> cnt;

  Case(const Shape& sh, uint64_t seed) : s(sh), xs(sh.K + sh.x_pad), ys(sh.N + sh.y_pad) {
    x = rand_bf16(size_t(kMax * xs), seed, 1.0f);
    w = rand_bf16(size_t(s.N * s.K), seed + 1, 0.05f);
    b = rand_bf16(size_t(s.N), seed + 2, 0.5f);
    dx = dev_bf16(x);
    dw = dev_bf16(w);
    if constexpr (sizeof(OutT) == 4) db = cu::to_device(b);
    else db = dev_bf16(b);
    ws = DeviceBuffer<unsigned char>(std::max<size_t>(cu::decode_gemm_workspace_bytes(kMax, s.N, s.K), 16));
    ws.fill_bytes(0);
    y_old = DeviceBuffer<OutT>(size_t(kMax * ys));
    y_new = DeviceBuffer<OutT>(size_t(kMax * ys));
    cnt = DeviceBuffer<unsigned long long>(2);
    cnt.fill_bytes(0);
    sync();
  }
  void gemm(cu::DecodeGemmCfg cfg, OutT* y, int64_t max_rows, const int32_t* live) {
    const BiasT* bp = s.bias ? db.data() : nullptr;
    if constexpr (sizeof(OutT) == 4)
      cu::decode_gemm_bf16_f32out(dx.data(), dw.data(), bp, y, max_rows, s.K, s.N, live, ws.data(), nullptr, xs, ys,
                                  cfg);
    else
      cu::decode_gemm_bf16(dx.data(), dw.data(), bp, y, max_rows, s.K, s.N, live, ws.data(), nullptr, xs, ys, cfg);
  }
  /// Adds to the device counters the bytes where y_new differs from y_old (cnt[0]) and the poison
  /// bytes of y_new outside its first `live` rows' N columns that were written (cnt[1]).
  void compare(int64_t live) {
    const size_t bytes = size_t(kMax * ys) * sizeof(OutT);
    count_diff_bytes<<<264, 256>>>(reinterpret_cast<const unsigned char*>(y_new.data()),
                                   reinterpret_cast<const unsigned char*>(y_old.data()), bytes, cnt.data());
    MOEFOLD_CUDA_CHECK(cudaGetLastError());
    count_unpoisoned<<<264, 256>>>(reinterpret_cast<const unsigned char*>(y_new.data()), size_t(kMax),
                                   size_t(ys) * sizeof(OutT), size_t(s.N) * sizeof(OutT), size_t(live), cnt.data() + 1);
    MOEFOLD_CUDA_CHECK(cudaGetLastError());
  }
  float out_f32(const std::vector<OutT>& y, size_t i) const {
    if constexpr (sizeof(OutT) == 4) {
      return y[i];
    } else {
      uint16_t h;
      std::memcpy(&h, &y[i], 2);
      return bf16_to_f32(h);
    }
  }
  /// rel err of y_new's rows 0, M/2, M-1 against fp64 at ~64 columns.
  double err(int64_t M) const {
    std::vector<OutT> y(size_t(M * ys));
    y_new.download(y.data(), y.size());
    std::vector<double> o, r;
    const int64_t cstep = std::max<int64_t>(1, s.N / 64);
    for (int64_t i : {int64_t(0), M / 2, M - 1})
      for (int64_t n = 0; n < s.N; n += cstep) {
        double acc = s.bias ? double(b[size_t(n)]) : 0.0;
        for (int64_t k = 0; k < s.K; ++k) acc += double(x[size_t(i * xs + k)]) * double(w[size_t(n * s.K + k)]);
        r.push_back(acc);
        o.push_back(double(out_f32(y, size_t(i * ys + n))));
      }
    return rel_err(o, r);
  }
};

template <class OutT>
void check(const Shape& sh, uint64_t seed) {
  Case<OutT> C(sh, seed);
  const std::string shape = "N=" + std::to_string(sh.N) + ",K=" + std::to_string(sh.K) +
                            ",S=" + std::to_string(cu::decode_gemm_splits(sh.N, sh.K)) + (sh.bias ? ",bias" : "") +
                            (sh.x_pad || sh.y_pad ? ",strided" : "") + (sh.f32out ? ",f32out" : "");
  const std::pair<cu::DecodeGemmCfg, const char*> cfgs[] = {{cu::DecodeGemmCfg::New, "new"},
                                                            {cu::DecodeGemmCfg::NewNoPrefetch, "new_nopf"},
                                                            {cu::DecodeGemmCfg::NewNoCluster, "new_nocl"}};
  for (auto [cfg, name] : cfgs) {
    C.cnt.fill_bytes(0);
    double e = 0;
    for (int64_t M = 1; M <= Case<OutT>::kMax; ++M) {
      C.y_old.fill_bytes(0xFF);
      C.y_new.fill_bytes(0xFF);
      C.gemm(cu::DecodeGemmCfg::Old, C.y_old.data(), M, nullptr);
      C.gemm(cfg, C.y_new.data(), M, nullptr);
      C.compare(M);
      if (M == 16 || M == 200) e = std::max(e, C.err(M));
    }
    // Device live counts below max_rows: compared with an old call of max_rows = live.
    const std::pair<int64_t, int32_t> lives[] = {{16, 1}, {16, 9}, {64, 17}, {64, 1}, {256, 100}, {256, 0}, {128, 128}};
    for (auto [max_rows, lv] : lives) {
      DeviceBuffer<int32_t> live = cu::to_device(std::vector<int32_t>{lv});
      C.y_old.fill_bytes(0xFF);
      C.y_new.fill_bytes(0xFF);
      C.gemm(cu::DecodeGemmCfg::Old, C.y_old.data(), lv, nullptr);
      C.gemm(cfg, C.y_new.data(), max_rows, live.data());
      C.compare(lv);
    }
    sync();
    const std::vector<unsigned long long> c = C.cnt.download();
    const std::string k = std::string("decode_gemm:") + name;
    EXPECT_TRUE(contract_exact(k + "_equals_old", shape + ",max_rows=1..256,live=1,9,17,100,0,128", size_t(c[0])));
    EXPECT_TRUE(contract_exact(k + "_padding_untouched", shape, size_t(c[1])));
    const double tol = sh.f32out ? 1e-5 * std::max(1.0, double(sh.K) / 1024.0) : 1e-2;
    EXPECT_TRUE(contract(k, shape + ",M=16,200", e, tol));
  }
}

const std::vector<Shape> kShapes = {
    // the fixtures' shapes (invariant_gemm_test) and awkward splits
    {128, 256, false, false, 0, 0},  // S = 2
    {128, 160, false, false, 0, 0},  // S = 1
    {512, 128, false, true, 0, 0},   // S = 1, bias
    {384, 128, true, false, 0, 0},   // S = 1, fp32 out
    {200, 1024, false, true, 8, 3},  // S = 8, bias, strided, odd y stride
    {384, 1024, true, true, 0, 1},   // S = 8, fp32 out, bias
    {130, 8136, false, true, 0, 0},  // S = 32: the workspace combine in the new config too
    // the 35B projections
    {12352, 2048, false, false, 0, 0},
    {9216, 2048, false, false, 0, 0},
    {2048, 4096, false, false, 0, 0},
    {1024, 2048, false, false, 0, 0},  // S = 16: a cluster of 16 where the device schedules one
    {2048, 512, false, false, 0, 0},
};

TEST(DecodeGemmCfg, NewEqualsOld) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    if (s.f32out) check<float>(s, seed);
    else check<bf16>(s, seed);
    seed += 10;
  }
}

// A small case for compute-sanitizer (memcheck, racecheck): the cluster combine (S = 8 and 2), the
// workspace combine (S = 32) and S = 1 at a few max_rows and live counts.
TEST(DecodeGemmCfg, SanitizerSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (const Shape& s : std::vector<Shape>{{200, 1024, false, true, 8, 3}, {128, 256, false, false, 0, 0},
                                           {130, 8136, false, true, 0, 0}, {512, 128, false, true, 0, 0}}) {
    Case<bf16> C(s, 7);
    for (int64_t M : {int64_t(1), int64_t(17), int64_t(100)}) {
      C.y_old.fill_bytes(0xFF);
      C.y_new.fill_bytes(0xFF);
      C.gemm(cu::DecodeGemmCfg::Old, C.y_old.data(), M, nullptr);
      C.gemm(cu::DecodeGemmCfg::New, C.y_new.data(), M, nullptr);
      C.compare(M);
    }
    sync();
    const std::vector<unsigned long long> c = C.cnt.download();
    EXPECT_TRUE(contract_exact("decode_gemm:new_equals_old_small", "N=" + std::to_string(s.N) + ",K=" +
                                   std::to_string(s.K) + ",M=1,17,100", size_t(c[0] + c[1])));
  }
}

TEST(DecodeGemmCfg, EnvResolves) {
  // Whatever MOEFOLD_DECODE_GEMM_CFG says in this process, Env resolves to one concrete configuration.
  const cu::DecodeGemmCfg c = cu::decode_gemm_cfg();
  EXPECT_NE(c, cu::DecodeGemmCfg::Env);
}

// ---- perf ----------------------------------------------------------------------------------------

__global__ void fill_weights(bf16* w, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = float(h >> 8) * (1.0f / 16777216.0f);
    w[i] = __float2bfloat16((h & 1 ? 1.0f : -1.0f) * 0.05f * (0.02f + u));
  }
}

/// One block that waits ~ns nanoseconds (a stand-in for a one-block norm kernel before a projection);
/// it releases its dependents at once (pdl_begin), as every kernel of the backend does.
__global__ void spin_kernel(long long ns) {
  cu::pdl_begin();
  moefold::test::spin_ns(ns);
}

double events_us(const std::function<void(int)>& f, int iters) {
  for (int i = 0; i < 3; ++i) f(i);
  sync();
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  MOEFOLD_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f(i);
  MOEFOLD_CUDA_CHECK(cudaEventRecord(b));
  MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  MOEFOLD_CUDA_CHECK(cudaEventDestroy(a));
  MOEFOLD_CUDA_CHECK(cudaEventDestroy(b));
  return double(ms) * 1e3 / iters;
}

TEST(DecodeGemmCfgPerf, DISABLED_Perf) {
  MOEFOLD_REQUIRE_GPU();
  constexpr size_t kPool = size_t(384) << 20;  // bytes of weights rotated over (> 7x L2)
  DeviceBuffer<bf16> pool(kPool / 2);
  fill_weights<<<1024, 256>>>(pool.data(), pool.size(), 12345u);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
  const DeviceBuffer<bf16> x = dev_bf16(rand_bf16(size_t(64) * 4096, 9, 1.0f));
  DeviceBuffer<bf16> y(size_t(64) * 12352);
  DeviceBuffer<unsigned char> ws(size_t(32) << 20);
  ws.fill_bytes(0);
  DeviceBuffer<unsigned char> c0(size_t(256) << 20), c1(size_t(256) << 20);
  c0.fill_bytes(1);
  sync();
  const double copy_us = events_us(
      [&](int) { MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(c1.data(), c0.data(), c0.bytes(), cudaMemcpyDeviceToDevice)); }, 10);
  const double copy_tbs = 2.0 * double(c0.bytes()) / copy_us * 1e-6;
  std::printf("copy: %.1f us for 2 x %zu MB = %.2f TB/s\n", copy_us, c0.bytes() >> 20, copy_tbs);
  constexpr long long kSpinNs = 6000;
  const double spin_us = events_us([&](int) { cu::launch_pdl(spin_kernel, dim3(1), dim3(32), 0, nullptr, kSpinNs); }, 50);

  struct S {
    int64_t N, K;
  };
  const std::vector<S> shapes{{12352, 2048}, {9216, 2048}, {2048, 4096}, {1024, 2048}, {2048, 512}};
  constexpr int kV = 4;
  const cu::DecodeGemmCfg cfg_of[kV] = {cu::DecodeGemmCfg::Old, cu::DecodeGemmCfg::New,
                                        cu::DecodeGemmCfg::NewNoPrefetch, cu::DecodeGemmCfg::NewNoCluster};
  const char* names[kV] = {"old", "new", "new_nopf", "new_nocl"};
  std::vector<std::string> table;
  char line[256];
  for (const S& s : shapes)
    for (int64_t M : {int64_t(1), int64_t(4), int64_t(16), int64_t(64)}) {
      const size_t wel = size_t(s.N * s.K);
      const int copies = int(pool.size() / wel);
      auto gemm = [&](int v, int i) {
        cu::decode_gemm_bf16(x.data(), pool.data() + size_t(i % copies) * wel, nullptr, y.data(), M, s.K, s.N, nullptr,
                             ws.data(), nullptr, 0, 0, cfg_of[v]);
      };
      double us[kV] = {}, after[kV] = {};
      for (int v : {0, 1, 2, 3, 3, 2, 1, 0}) {  // A B C D D C B A
        us[v] += 0.5 * events_us([&](int i) { gemm(v, i); }, 60);
        after[v] += 0.5 * (events_us(
                               [&](int i) {
                                 cu::launch_pdl(spin_kernel, dim3(1), dim3(32), 0, nullptr, kSpinNs);
                                 gemm(v, i);
                               },
                               40) -
                           spin_us);
      }
      const double mb = double(wel) * 2 * 1e-6;
      const std::string sh = std::to_string(s.N) + "x" + std::to_string(s.K);
      for (int v = 0; v < kV; ++v)
        perf_line(std::string("decode_gemm:") + names[v], sh + ",M=" + std::to_string(M), us[v],
                  "TB/s=" + std::to_string(mb / us[v]) + " of_copy=" + std::to_string(mb / us[v] / copy_tbs) +
                      " after_1block_kernel_us=" + std::to_string(after[v]));
      std::snprintf(line, sizeof line,
                    "%-10s %2lld | %6.2f %6.2f %6.2f %6.2f | %4.2f %4.2f %4.2f %4.2f | %6.2f %6.2f %6.2f %6.2f",
                    sh.c_str(), (long long)M, us[0], us[1], us[2], us[3], mb / us[0], mb / us[1], mb / us[2],
                    mb / us[3], after[0], after[1], after[2], after[3]);
      table.emplace_back(line);
    }
  std::printf("\ncopy %.2f TB/s; spin kernel alone %.2f us; after = (spin + gemm) - spin\n", copy_tbs, spin_us);
  std::printf("%-10s %2s | %6s %6s %6s %6s | %4s %4s %4s %4s | %6s %6s %6s %6s\n", "shape", "M", "old", "new", "nopf",
              "nocl", "TB/s", "new", "nopf", "nocl", "after", "new", "nopf", "nocl");
  for (const std::string& l : table) std::printf("%s\n", l.c_str());
}

}  // namespace
