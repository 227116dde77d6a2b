// Contract of the batch-invariant projection for any row count (ops/cuda/invariant_gemm.h): the same
// input rows computed inside calls of M = 1, 17, 64, 257, 300 and 4096 rows (at row offsets 0 and 5,
// so a row sits at different positions of the 16-row and 128-row tiles) give bitwise equal outputs,
// across the 256-row switch from the decode GEMM to the prefill GEMM, for the fixtures' split shapes
// and the 35B projection shapes, bf16 and fp32 output, with bias and strides; accurate against an fp64
// reference on sampled rows; rows past a device live count stay untouched.
// Before this kernel the executor ran cuBLASLt above 256 rows: CublasAbove256IsNotInvariant shows
// that path breaks the same contract (the dense Qwen3 prefix-cache failure on the H200).
// DISABLED_Perf: prefill GEMM vs cuBLASLt's free heuristic at 512, 4096 and 16384 rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/decode_gemm.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/invariant_gemm.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

constexpr int kRows = 4096 + 5;  // the largest M at offset 5
const std::vector<int> kMs = {1, 17, 64, 257, 300, 4096};

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

template <class OutT>
struct Problem {
  using BiasT = std::conditional_t<sizeof(OutT) == 4, float, bf16>;
  int64_t N, K, xs, ys;
  bool has_bias;
  std::vector<float> x, w, b;
  DeviceBuffer<bf16> dx, dw;
  DeviceBuffer<BiasT> db;
  DeviceBuffer<unsigned char> ws;
  DeviceBuffer<OutT> dy;

  Problem(int64_t N_, int64_t K_, bool bias, int64_t x_pad, int64_t y_pad, uint64_t seed)
      : N(N_), K(K_), xs(K_ + x_pad), ys(N_ + y_pad), has_bias(bias) {
    x = rand_bf16(size_t(kRows) * size_t(xs), seed, 1.0f);
    w = rand_bf16(size_t(N * K), seed + 1, 0.05f);
    b = rand_bf16(size_t(N), seed + 2, 0.5f);
    dx = dev_bf16(x);
    dw = dev_bf16(w);
    if constexpr (sizeof(OutT) == 4) db = cu::to_device(b);
    else db = dev_bf16(b);
    const size_t bytes = cu::decode_gemm_workspace_bytes(cu::kDecodeGemmMaxRows, N, K);
    ws = DeviceBuffer<unsigned char>(std::max<size_t>(bytes, 16));
    ws.fill_bytes(0);
    dy = DeviceBuffer<OutT>(size_t(kRows) * size_t(ys));
    sync();
  }
  /// Rows [row0, row0 + M) through `gemm` (the invariant dispatch by default); y downloaded (M rows).
  template <class F>
  std::vector<OutT> run(F&& gemm, int64_t M, int64_t row0, const int32_t* live = nullptr) {
    dy.fill_bytes(0xFF);
    gemm(dx.data() + row0 * xs, dw.data(), has_bias ? db.data() : nullptr, dy.data(), M, live);
    sync();
    std::vector<OutT> h(size_t(M) * size_t(ys));
    dy.download(h.data(), h.size());
    return h;
  }
  std::vector<OutT> run(int64_t M, int64_t row0, const int32_t* live = nullptr) {
    return run(
        [&](const bf16* xp, const bf16* wp, const BiasT* bp, OutT* yp, int64_t m, const int32_t* l) {
          if constexpr (sizeof(OutT) == 4)
            cu::invariant_gemm_bf16_f32out(xp, wp, bp, yp, m, K, N, l, ws.data(), nullptr, xs, ys);
          else
            cu::invariant_gemm_bf16(xp, wp, bp, yp, m, K, N, l, ws.data(), nullptr, xs, ys);
        },
        M, row0, live);
  }
  /// The executor's dispatch before the prefill GEMM: the decode GEMM up to 256 rows, cuBLASLt above.
  std::vector<OutT> run_old(int64_t M, int64_t row0) {
    return run(
        [&](const bf16* xp, const bf16* wp, const BiasT* bp, OutT* yp, int64_t m, const int32_t*) {
          if constexpr (sizeof(OutT) == 4) {
            if (m <= cu::kDecodeGemmMaxRows)
              cu::decode_gemm_bf16_f32out(xp, wp, bp, yp, m, K, N, nullptr, ws.data(), nullptr, xs, ys);
            else
              cu::gemm_bf16_f32out(xp, wp, bp, yp, m, K, N, nullptr, false, xs, ys);
          } else {
            if (m <= cu::kDecodeGemmMaxRows)
              cu::decode_gemm_bf16(xp, wp, bp, yp, m, K, N, nullptr, ws.data(), nullptr, xs, ys);
            else
              cu::gemm_bf16(xp, wp, bp, yp, m, K, N, nullptr, false, xs, ys);
          }
        },
        M, row0);
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
  /// rel err of y (rows of input row0..) against fp64 on a few rows and ~64 columns.
  double err(const std::vector<OutT>& y, int64_t M, int64_t row0) const {
    std::vector<double> o, r;
    const int64_t cstep = std::max<int64_t>(1, N / 64);
    for (int64_t i : {int64_t(0), M / 2, M - 1})
      for (int64_t n = 0; n < N; n += cstep) {
        const float* xr = x.data() + (row0 + i) * xs;
        const float* wr = w.data() + n * K;
        double s = has_bias ? double(b[size_t(n)]) : 0.0;
        for (int64_t k = 0; k < K; ++k) s += double(xr[k]) * double(wr[k]);
        r.push_back(s);
        o.push_back(double(out_f32(y, size_t(i * ys + n))));
      }
    return rel_err(o, r);
  }
};

/// Rows of `a` (M rows) whose first N elements differ from rows [base0, base0 + M) of `base`.
template <class OutT>
size_t rows_differing(const std::vector<OutT>& a, const std::vector<OutT>& base, int64_t M, int64_t base0, int64_t N,
                      int64_t ys) {
  size_t n = 0;
  for (int64_t r = 0; r < M; ++r)
    n += std::memcmp(a.data() + r * ys, base.data() + (base0 + r) * ys, size_t(N) * sizeof(OutT)) != 0;
  return n;
}

template <class OutT>
void check_shape(int64_t N, int64_t K, bool bias, int64_t x_pad, int64_t y_pad, uint64_t seed) {
  const std::string kname = sizeof(OutT) == 4 ? "invariant_gemm_bf16_f32out" : "invariant_gemm_bf16";
  Problem<OutT> P(N, K, bias, x_pad, y_pad, seed);
  const std::string shape = "N=" + std::to_string(N) + ",K=" + std::to_string(K) +
                            ",S=" + std::to_string(cu::decode_gemm_splits(N, K)) + (bias ? ",bias" : "") +
                            (x_pad || y_pad ? ",strided" : "");
  // Baseline: all kRows rows in one call (prefill GEMM); every other call's rows must equal its rows.
  const std::vector<OutT> full = P.run(kRows, 0);
  const double tol = sizeof(OutT) == 4 ? 1e-5 * std::max(1.0, double(K) / 1024.0) : 1e-2;
  EXPECT_TRUE(contract(kname, shape + ",M=" + std::to_string(kRows), P.err(full, kRows, 0), tol));
  size_t mism = 0;
  for (int M : kMs)
    for (int64_t off : {int64_t(0), int64_t(5)}) {
      const std::vector<OutT> y = P.run(M, off);
      mism += rows_differing(y, full, M, off, N, P.ys);
    }
  for (int64_t r : {int64_t(1), int64_t(255), int64_t(256), int64_t(300), int64_t(4095)})
    mism += rows_differing(P.run(1, r), full, 1, r, N, P.ys);  // rows alone
  EXPECT_TRUE(contract_exact(kname + "_invariance", shape + ",M=1,17,64,257,300,4096,off=0,5", mism));

  // A device live count below max_rows: the live rows equal, the rest stay poisoned.
  DeviceBuffer<int32_t> live = cu::to_device(std::vector<int32_t>{1000});
  const std::vector<OutT> y = P.run(4096, 0, live.data());
  size_t bad = rows_differing(y, full, 1000, 0, N, P.ys);
  for (size_t i = size_t(1000) * P.ys; i < y.size(); ++i) {
    const unsigned char* c = reinterpret_cast<const unsigned char*>(&y[i]);
    for (size_t k = 0; k < sizeof(OutT); ++k) bad += c[k] != 0xFF;
  }
  EXPECT_TRUE(contract_exact(kname + "_live", shape + ",max_rows=4096,live=1000", bad));
}

// The fixtures' shapes: the dense Qwen3 o_proj (128 x 256, S = 2; the failing prefix-cache case), its
// down_proj (128 x 160), a fused q/k/v, an lm_head with fp32 logits, a strided split shape.
TEST(InvariantGemm, FixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  check_shape<bf16>(128, 256, false, 0, 0, 1);
  check_shape<bf16>(128, 160, false, 0, 0, 2);
  check_shape<bf16>(512, 128, true, 0, 0, 3);
  check_shape<float>(384, 128, false, 0, 0, 4);
  check_shape<bf16>(200, 1024, true, 8, 3, 5);
}

// The 35B projection shapes: fused q/k/v 9216x2048, o_proj 2048x4096, shared expert 1024x2048 and
// 2048x512, DeltaNet fused in_proj 12352x2048.
TEST(InvariantGemm, ModelShapes) {
  MOEFOLD_REQUIRE_GPU();
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{9216, 2048}, {2048, 4096}, {1024, 2048}, {2048, 512},
                                                               {12352, 2048}})
    check_shape<bf16>(N, K, false, 0, 0, 10 + uint64_t(N));
}

TEST(InvariantGemm, Errors) {
  MOEFOLD_REQUIRE_GPU();
  DeviceBuffer<bf16> x(64 * 64), w(64 * 64), y(64 * 64);
  EXPECT_THROW(cu::prefill_gemm_bf16(x.data(), w.data(), nullptr, y.data(), 300, 60, 64, nullptr, nullptr), Error);
  EXPECT_THROW(cu::prefill_gemm_bf16(x.data(), w.data(), nullptr, y.data(), -1, 64, 64, nullptr, nullptr), Error);
  EXPECT_THROW(cu::prefill_gemm_bf16(x.data() + 1, w.data(), nullptr, y.data(), 300, 64, 64, nullptr, nullptr), Error);
  EXPECT_THROW(cu::prefill_gemm_bf16(x.data(), w.data(), nullptr, y.data(), 300, 64, 64, nullptr, nullptr, 60), Error);
  EXPECT_NO_THROW(cu::prefill_gemm_bf16(x.data(), w.data(), nullptr, y.data(), 0, 64, 64, nullptr, nullptr));
}

// The dispatch the executor had (cuBLASLt above 256 rows) breaks the contract: rows of a call above the
// switch differ from the same rows in a 256-row call (the decode GEMM). Asserted at the 35B o_proj
// (2048 x 4096, S = 8: 238 of 256 rows differ on the H200 at M = 300, 464, 1024 and 4096); printed for
// the fixture's o_proj (128 x 256), which cuBLASLt happened to match at those M on the H200.
TEST(InvariantGemm, CublasAbove256IsNotInvariant) {
  MOEFOLD_REQUIRE_GPU();
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{128, 256}, {2048, 4096}}) {
    Problem<bf16> P(N, K, false, 0, 0, 77);
    const std::vector<bf16> small = P.run_old(256, 0);
    for (int64_t M : {int64_t(300), int64_t(464), int64_t(1024), int64_t(4096)}) {
      const size_t d = rows_differing(small, P.run_old(M, 0), 256, 0, N, P.ys);
      std::printf("OLD-DISPATCH N=%lld K=%lld M=%lld rows_of_256_differing=%zu\n", (long long)N, (long long)K,
                  (long long)M, d);
      if (N == 2048 && M == 300) EXPECT_GT(d, 0u) << "cuBLASLt reproduced the decode GEMM's split order";
    }
  }
}

double time_us_of(const std::function<void()>& f, int iters) {
  for (int i = 0; i < 2; ++i) f();
  sync();
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  MOEFOLD_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  MOEFOLD_CUDA_CHECK(cudaEventRecord(b));
  MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  MOEFOLD_CUDA_CHECK(cudaEventDestroy(a));
  MOEFOLD_CUDA_CHECK(cudaEventDestroy(b));
  return double(ms) * 1e3 / iters;
}

// Prefill GEMM (the batch-invariant path above 256 rows) vs cuBLASLt's free heuristic, 35B shapes.
// Prints one PERF line per (shape, M) and a per-M total over the five shapes (one of each).
TEST(InvariantGemmPerf, DISABLED_Perf) {
  MOEFOLD_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> shapes{{9216, 2048}, {2048, 4096}, {1024, 2048}, {2048, 512},
                                                        {12352, 2048}};
  constexpr int64_t kMaxM = 16384;
  DeviceBuffer<bf16> x(size_t(kMaxM) * 4096), y(size_t(kMaxM) * 12352), w(size_t(12352) * 4096);
  x.fill_bytes(0x3C);
  w.fill_bytes(0x3B);
  std::printf("%-14s %6s %10s %10s %10s %7s %8s\n", "shape", "M", "pinned_us", "unpipe_us", "cublas_us", "ratio",
              "TFLOP/s");
  for (int64_t M : {int64_t(512), int64_t(4096), kMaxM}) {
    double tp = 0, tc = 0, tu = 0;
    for (auto [N, K] : shapes) {
      const int iters = M >= 4096 ? 5 : 20;
      const double p = time_us_of(
          [&] { cu::prefill_gemm_bf16(x.data(), w.data(), nullptr, y.data(), M, K, N, nullptr, nullptr); }, iters);
      const double u = time_us_of(
          [&] { cu::prefill_gemm_bf16_unpipelined(x.data(), w.data(), nullptr, y.data(), M, K, N, nullptr, nullptr); },
          iters);
      const double c = time_us_of([&] { cu::gemm_bf16(x.data(), w.data(), nullptr, y.data(), M, K, N, nullptr); }, iters);
      tp += p;
      tu += u;
      tc += c;
      const std::string sh = std::to_string(N) + "x" + std::to_string(K);
      const double tf = 2.0 * double(M) * double(N) * double(K) / p * 1e-6;
      std::printf("%-14s %6lld %10.1f %10.1f %10.1f %7.3f %8.0f\n", sh.c_str(), (long long)M, p, u, c, p / c, tf);
      perf_line("prefill_gemm_bf16", sh + ",M=" + std::to_string(M), p,
                "cublas_us=" + std::to_string(c) + " ratio=" + std::to_string(p / c));
    }
    std::printf("%-14s %6lld %10.1f %10.1f %10.1f %7.3f\n", "all5", (long long)M, tp, tu, tc, tp / tc);
  }
}

}  // namespace
