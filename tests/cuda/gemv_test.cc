// Contract tests of the decode GEMV kernels (src/ops/cuda/gemv.h) against a CPU fp64 reference on
// bf16-exact random inputs: every variant (bf16 out, fp32 out, SwiGLU epilogue, residual epilogue), batch
// sizes 1..32, live counts below capacity, awkward N / K (odd, < 8, K % 8 != 0), strided and misaligned
// rows (the element-wise fallback path), padding rows poisoned and checked untouched (and, with the x
// allocation cut after the live rows, never read: compute-sanitizer memcheck runs the *Small* tests),
// bitwise batch invariance (a row alone == the same row inside batches of 2, 7, 16, 32, at any position
// and live count, on either load path), bitwise equality with the unfused chain (gemv_bf16 + swiglu,
// gemv_bf16 + residual_add), and host-side argument errors. Skips without a GPU (the error test runs
// everywhere: it never reaches the device).
//
// GemvPerf.DISABLED_Shapes (scripts/gpu/run_tests.sh --perf) times the model's decode shapes against a
// device-to-device copy and cuBLASLt measured in the same binary.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"

namespace moefold::test {
namespace {

namespace cu = moefold::cuda;

constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32 = 1e-5;

enum class Var { Bf16, F32, Swiglu, Residual };

const char* var_name(Var v) {
  switch (v) {
    case Var::Bf16: return "gemv_bf16";
    case Var::F32: return "gemv_bf16_f32out";
    case Var::Swiglu: return "gemv_swiglu_bf16";
    case Var::Residual: return "gemv_residual_bf16";
  }
  return "?";
}

void sync_ok() {
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<bf16> bits_to_bf16(const std::vector<uint16_t>& b) {
  std::vector<bf16> v(b.size());
  std::memcpy(static_cast<void*>(v.data()), b.data(), b.size() * 2);
  return v;
}

uint16_t bf16_bits(float f) {
  const bf16 h = __float2bfloat16_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

float bits_to_f32(uint32_t b, bool f32) {
  if (!f32) return bf16_to_f32(uint16_t(b));
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

/// One weight matrix (host values bf16-exact, and its device copies).
struct Weights {
  int64_t rows = 0, K = 0;
  std::vector<float> w, bias;  // bias empty when absent
  DeviceBuffer<bf16> dw, db;
  DeviceBuffer<bf16> dw_shift;  // the same weight one element into its allocation (not 16-byte aligned)
  DeviceBuffer<float> dbf;      // fp32 copy of the bias (gemv_bf16_f32out)
  Weights(int64_t rows_, int64_t K_, bool with_bias, uint64_t seed) : rows(rows_), K(K_) {
    w = rand_bf16(size_t(rows * K), seed, 1.0f);
    dw = dev_bf16(w);
    dw_shift = DeviceBuffer<bf16>(w.size() + 1);
    dw_shift.upload(cu::to_bf16_host(w), 1);
    if (with_bias) {
      bias = rand_bf16(size_t(rows), seed + 7, 2.0f);
      db = dev_bf16(bias);
      dbf = cu::to_device(bias);
    }
  }
};

/// A batch: x rows [max_rows, xs] (rows >= live never uploaded when tight), the residual [max_rows, ys].
struct Batch {
  int64_t max_rows = 1, live = 1, xs = 0, ys = 0;
  int64_t x_offset = 0;    // x starts this many elements into its allocation (odd: not 16-byte aligned)
  bool tight_x = false;    // the x allocation ends after the last live row
  bool live_null = false;  // pass live_rows = nullptr (then live must equal max_rows)
  bool res_alias = true;   // residual variant: residual == y (in place) or a separate buffer
  bool w_shift = false;    // use Weights::dw_shift (element-wise weight loads)
  std::vector<float> x, res;
};

/// Runs `v` on the GPU; returns every element of y ([max_rows, ys], raw bits: bf16 in the low 16 bits
/// or fp32), poisoned (all-ones) before the call. N: output columns (I for SwiGLU).
std::vector<uint32_t> run_gpu(Var v, const Weights& W, int64_t N, const Batch& b, int warps_k = 0) {
  const int64_t K = W.K;
  const bool f32 = v == Var::F32;
  const int64_t xrows = b.tight_x ? b.live : b.max_rows;
  const size_t xn = size_t(b.x_offset + (xrows > 0 ? (xrows - 1) * b.xs + K : 0));
  std::vector<uint16_t> xh(std::max<size_t>(xn, 1), 0xFFFF);  // padding rows / gaps: NaN
  for (int64_t r = 0; r < b.live; ++r)
    for (int64_t k = 0; k < K; ++k) xh[size_t(b.x_offset + r * b.xs + k)] = bf16_bits(b.x[size_t(r * b.xs + k)]);
  DeviceBuffer<bf16> dx(xh.size());
  dx.upload(bits_to_bf16(xh));
  const bf16* xp = dx.data() + b.x_offset;
  DeviceBuffer<int32_t> dlive(1);
  const int32_t nl = int32_t(b.live);
  dlive.upload(&nl, 1);
  const int32_t* live = b.live_null ? nullptr : dlive.data();
  const bf16* wp = b.w_shift ? W.dw_shift.data() + 1 : W.dw.data();
  const size_t yn = size_t(b.max_rows * b.ys);
  std::vector<uint32_t> out(yn);
  if (f32) {
    DeviceBuffer<float> dy(yn);
    dy.fill_bytes(0xFF);
    cu::gemv_bf16_f32out(xp, wp, W.bias.empty() ? nullptr : W.dbf.data(), dy.data(), b.max_rows, K, N, live,
                         nullptr, b.xs, b.ys, warps_k);
    sync_ok();
    const auto h = dy.download();
    std::memcpy(out.data(), h.data(), yn * 4);
    return out;
  }
  DeviceBuffer<bf16> dy(yn), dres;
  dy.fill_bytes(0xFF);
  const bf16* bias = W.bias.empty() ? nullptr : W.db.data();
  if (v == Var::Residual) {
    std::vector<uint16_t> rh(yn, 0xFFFF);
    for (int64_t r = 0; r < b.live; ++r)
      for (int64_t n = 0; n < N; ++n) rh[size_t(r * b.ys + n)] = bf16_bits(b.res[size_t(r * b.ys + n)]);
    if (b.res_alias) {
      dy.upload(bits_to_bf16(rh));
    } else {
      dres = DeviceBuffer<bf16>(yn);
      dres.upload(bits_to_bf16(rh));
    }
    const bf16* res = b.res_alias ? dy.data() : dres.data();
    cu::gemv_residual_bf16(xp, wp, bias, res, dy.data(), b.max_rows, K, N, live, nullptr, b.xs, b.ys, b.ys);
  } else if (v == Var::Swiglu) {
    cu::gemv_swiglu_bf16(xp, wp, bias, dy.data(), b.max_rows, K, N, live, nullptr, b.xs, b.ys);
  } else {
    cu::gemv_bf16(xp, wp, bias, dy.data(), b.max_rows, K, N, live, nullptr, b.xs, b.ys, warps_k);
  }
  sync_ok();
  const auto bits = host_bits(dy);
  for (size_t i = 0; i < yn; ++i) out[i] = bits[i];
  return out;
}

/// fp64 reference of the live part [live, N] (dense).
std::vector<double> reference(Var v, const Weights& W, int64_t N, const Batch& b) {
  const int64_t K = W.K;
  auto dot = [&](int64_t r, int64_t n) {
    double s = 0;
    const float* xr = &b.x[size_t(r * b.xs)];
    const float* wr = &W.w[size_t(n * K)];
    for (int64_t k = 0; k < K; ++k) s += double(xr[k]) * double(wr[k]);
    return s + (W.bias.empty() ? 0.0 : double(W.bias[size_t(n)]));
  };
  std::vector<double> ref(size_t(b.live * N));
  const int64_t chunk = 64, nchunks = (N + chunk - 1) / chunk;
  parallel_for(size_t(nchunks), [&](size_t c) {
    for (int64_t n = int64_t(c) * chunk; n < std::min(N, int64_t(c + 1) * chunk); ++n)
      for (int64_t r = 0; r < b.live; ++r) {
        double o;
        if (v == Var::Swiglu) {
          const double g = dot(r, n), u = dot(r, N + n);
          o = g / (1.0 + std::exp(-g)) * u;
        } else {
          o = dot(r, n);
          if (v == Var::Residual) o += double(b.res[size_t(r * b.ys + n)]);
        }
        ref[size_t(r * N + n)] = o;
      }
  });
  return ref;
}

Batch make_batch(int64_t max_rows, int64_t live, int64_t K, int64_t N, int64_t xs, int64_t ys, uint64_t seed) {
  Batch b;
  b.max_rows = max_rows;
  b.live = live;
  b.xs = xs ? xs : K;
  b.ys = ys ? ys : N;
  b.x = rand_bf16(size_t(max_rows * b.xs), seed, 1.0f);
  b.res = rand_bf16(size_t(max_rows * b.ys), seed + 1, 4.0f);
  return b;
}

std::string shape_of(const Batch& b, int64_t K, int64_t N, bool bias) {
  std::string s = fmt::format("M={},live={},K={},N={}", b.max_rows, b.live, K, N);
  if (bias) s += ",bias";
  if (b.xs != K) s += fmt::format(",xs={}", b.xs);
  if (b.ys != N) s += fmt::format(",ys={}", b.ys);
  if (b.x_offset) s += fmt::format(",xoff={}", b.x_offset);
  if (b.tight_x) s += ",tight_x";
  if (b.live_null) s += ",live=null";
  return s;
}

/// Runs one case: accuracy against the fp64 reference and untouched padding (rows >= live, and the
/// columns [N, ys) of live rows). Returns the output bits.
std::vector<uint32_t> check_case(Var v, const Weights& W, int64_t N, const Batch& b) {
  const auto out = run_gpu(v, W, N, b);
  const auto ref = reference(v, W, N, b);
  const bool f32 = v == Var::F32;
  std::vector<float> got(size_t(b.live * N));
  for (int64_t r = 0; r < b.live; ++r)
    for (int64_t n = 0; n < N; ++n) got[size_t(r * N + n)] = bits_to_f32(out[size_t(r * b.ys + n)], f32);
  const std::string shape = shape_of(b, W.K, N, !W.bias.empty());
  EXPECT_TRUE(contract(var_name(v), shape, rel_err(got, ref), f32 ? kTolF32 : kTolBf16));
  const uint32_t poison = f32 ? 0xFFFFFFFFu : 0xFFFFu;
  size_t touched_pad = 0;
  for (int64_t r = 0; r < b.max_rows; ++r)
    for (int64_t n = r < b.live ? N : 0; n < b.ys; ++n) touched_pad += out[size_t(r * b.ys + n)] != poison;
  EXPECT_TRUE(contract_exact(std::string(var_name(v)) + "_padding", shape, touched_pad));
  return out;
}

/// Every row count of the brief at one shape, each with a live count below capacity too.
void check_rows(Var v, int64_t K, int64_t N, bool bias, uint64_t seed, std::initializer_list<int64_t> rows) {
  const Weights W(v == Var::Swiglu ? 2 * N : N, K, bias, seed);
  for (int64_t M : rows) {
    check_case(v, W, N, make_batch(M, M, K, N, 0, 0, seed + 100 + uint64_t(M)));
    if (M > 1) check_case(v, W, N, make_batch(M, M / 2, K, N, 0, 0, seed + 200 + uint64_t(M)));
  }
}

constexpr Var kAllVars[] = {Var::Bf16, Var::F32, Var::Swiglu, Var::Residual};

// ---- bitwise batch invariance -------------------------------------------------------------------------

/// Rows of a fixed pool computed alone (max_rows = 1) and inside batches of several sizes, positions,
/// live counts and load paths must have identical bits.
void check_invariance(Var v, int64_t K, int64_t N, uint64_t seed) {
  const Weights W(v == Var::Swiglu ? 2 * N : N, K, true, seed);
  constexpr int64_t kPool = 32;
  const Batch pool = make_batch(kPool, kPool, K, N, 0, 0, seed + 1);
  auto pick = [&](const std::vector<int64_t>& ids, int64_t max_rows, int64_t xs) {
    Batch b;
    b.max_rows = max_rows;
    b.live = int64_t(ids.size());
    b.xs = xs;
    b.ys = N;
    b.x.assign(size_t(max_rows * xs), 0.5f);
    b.res.assign(size_t(max_rows * N), 0.25f);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::copy_n(&pool.x[size_t(ids[i] * K)], K, &b.x[i * size_t(xs)]);
      std::copy_n(&pool.res[size_t(ids[i] * N)], N, &b.res[i * size_t(N)]);
    }
    return b;
  };
  std::vector<std::vector<uint32_t>> alone(kPool);
  for (int64_t p = 0; p < kPool; ++p) alone[size_t(p)] = run_gpu(v, W, N, pick({p}, 1, K));

  size_t mismatches = 0, cases = 0;
  auto compare = [&](const Batch& b, const std::vector<int64_t>& ids) {
    const auto out = run_gpu(v, W, N, b);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t n = 0; n < N; ++n) mismatches += out[i * size_t(N) + size_t(n)] != alone[size_t(ids[i])][size_t(n)];
    ++cases;
  };
  for (int64_t B : {2, 7, 16, 32}) {  // 32: two batch tiles
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < B; ++i) ids.push_back((i * 5 + B) % kPool);
    compare(pick(ids, B, K), ids);
  }
  {  // one 16-row buffer at changing live counts
    std::vector<int64_t> all;
    for (int64_t i = 0; i < 16; ++i) all.push_back((i * 7 + 3) % kPool);
    for (int64_t live : {1, 3, 7, 15, 16, 2}) {
      const std::vector<int64_t> ids(all.begin(), all.begin() + live);
      compare(pick(ids, 16, K), ids);
    }
    // live = 5 of a 32-row capacity (the two-tile kernel with its second tile all padding)
    const std::vector<int64_t> ids(all.begin(), all.begin() + 5);
    compare(pick(ids, 32, K), ids);
  }
  {  // the element-wise x path: odd row stride, odd start (not 16-byte aligned), live_rows = nullptr
    std::vector<int64_t> ids = {9, 4, 31, 0, 17, 22, 5};
    Batch b = pick(ids, 7, K + 3);
    b.x_offset = 1;
    b.live_null = true;
    compare(b, ids);
    b.w_shift = true;  // and element-wise weight loads
    compare(b, ids);
  }
  EXPECT_TRUE(contract_exact(std::string(var_name(v)) + "_batch_invariance",
                             fmt::format("K={},N={},cases={}", K, N, cases), mismatches));
}

// ---- equality with the unfused chain ------------------------------------------------------------------

/// gemv_swiglu_bf16 == gemv_bf16 into [rows, 2I] + cuda::swiglu; gemv_residual_bf16 == gemv_bf16 +
/// cuda::residual_add; bf16(gemv_bf16_f32out) == gemv_bf16 (same bias values): all bitwise.
void check_chain(int64_t M, int64_t live, int64_t K, int64_t N, uint64_t seed) {
  const Weights Wgu(2 * N, K, true, seed), W(N, K, true, seed + 1);
  const Batch b = make_batch(M, live, K, N, 0, 0, seed + 2);
  auto dx = dev_bf16(b.x);
  DeviceBuffer<int32_t> dlive(1);
  const int32_t nl = int32_t(live);
  dlive.upload(&nl, 1);
  size_t mism = 0;
  {
    DeviceBuffer<bf16> gu(size_t(M * 2 * N)), a(size_t(M * N)), f(size_t(M * N));
    for (auto* d : {&gu, &a, &f}) d->fill_bytes(0xFF);
    cu::gemv_bf16(dx.data(), Wgu.dw.data(), Wgu.db.data(), gu.data(), M, K, 2 * N, dlive.data(), nullptr);
    cu::swiglu(gu.data(), a.data(), M, N, dlive.data(), nullptr);
    cu::gemv_swiglu_bf16(dx.data(), Wgu.dw.data(), Wgu.db.data(), f.data(), M, K, N, dlive.data(), nullptr);
    sync_ok();
    const auto ba = host_bits(a), bf = host_bits(f);
    for (size_t i = 0; i < ba.size(); ++i) mism += ba[i] != bf[i];
  }
  EXPECT_TRUE(contract_exact("gemv_swiglu_vs_chain", fmt::format("M={},live={},K={},I={}", M, live, K, N), mism));
  mism = 0;
  {
    auto h1 = dev_bf16(b.res), h2 = dev_bf16(b.res);
    DeviceBuffer<bf16> y(size_t(M * N));
    y.fill_bytes(0xFF);
    cu::gemv_bf16(dx.data(), W.dw.data(), W.db.data(), y.data(), M, K, N, dlive.data(), nullptr);
    cu::residual_add(h1.data(), y.data(), M, N, dlive.data(), nullptr);
    cu::gemv_residual_bf16(dx.data(), W.dw.data(), W.db.data(), h2.data(), h2.data(), M, K, N, dlive.data(), nullptr);
    sync_ok();
    const auto b1 = host_bits(h1), b2 = host_bits(h2);
    for (size_t i = 0; i < b1.size(); ++i) mism += b1[i] != b2[i];
  }
  EXPECT_TRUE(contract_exact("gemv_residual_vs_chain", fmt::format("M={},live={},K={},N={}", M, live, K, N), mism));
  mism = 0;
  {
    DeviceBuffer<bf16> y(size_t(M * N));
    DeviceBuffer<float> yf(size_t(M * N));
    y.fill_bytes(0xFF);
    yf.fill_bytes(0xFF);
    cu::gemv_bf16(dx.data(), W.dw.data(), W.db.data(), y.data(), M, K, N, dlive.data(), nullptr);
    cu::gemv_bf16_f32out(dx.data(), W.dw.data(), W.dbf.data(), yf.data(), M, K, N, dlive.data(), nullptr);
    sync_ok();
    const auto b1 = host_bits(y);
    const auto f = yf.download();
    for (int64_t i = 0; i < live * N; ++i) mism += b1[size_t(i)] != bf16_bits(f[size_t(i)]);
  }
  EXPECT_TRUE(contract_exact("gemv_f32out_vs_bf16", fmt::format("M={},live={},K={},N={}", M, live, K, N), mism));
}

}  // namespace

// ---- small cases (compute-sanitizer runs these) ----------------------------------------------------------

TEST(GemvSmall, FixtureShapesAllVariants) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 1000;
  // (K, N): the fixtures' hidden sizes, N not a multiple of 8 / 16, N < 8, K % 8 != 0 (element-wise path)
  // (2048, 40): 16 warps of 4 steps each, so the unguarded 4-step main loop runs under the sanitizer too.
  const std::pair<int64_t, int64_t> shapes[] = {{72, 49}, {64, 64}, {576, 192}, {75, 7}, {130, 1}, {33, 17}, {2048, 40}};
  for (Var v : kAllVars)
    for (auto [K, N] : shapes) {
      const bool bias = seed % 2 == 0;
      check_rows(v, K, N, bias, seed++, {1, 3, 16});
    }
  for (Var v : kAllVars) check_rows(v, 576, 49, true, seed++, {2, 7, 15, 17, 32});
}

TEST(GemvSmall, PaddingNeverReadOrWritten) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (Var v : kAllVars) {
    const int64_t K = 200, N = 37;
    const Weights W(v == Var::Swiglu ? 2 * N : N, K, true, seed++);
    for (auto [M, live] : {std::pair<int64_t, int64_t>{16, 3}, {16, 1}, {7, 6}, {32, 19}, {8, 0}}) {
      Batch b = make_batch(M, live, K, N, 264, N + 5, seed++);  // strided x and y rows
      b.tight_x = true;  // x ends after the last live row: a padding-row read is out of bounds
      if (v == Var::Residual) b.res_alias = live % 2 == 1;
      check_case(v, W, N, b);
    }
    Batch b = make_batch(5, 5, K, N, 0, 0, seed++);  // misaligned x start: element-wise x loads
    b.x_offset = 3;
    b.live_null = true;
    b.tight_x = true;
    check_case(v, W, N, b);
  }
}

TEST(GemvSmall, BatchInvariantBitwise) {
  MOEFOLD_REQUIRE_GPU();
  for (Var v : kAllVars) check_invariance(v, 576, 49, 3000 + uint64_t(v));
}

TEST(GemvSmall, MatchesUnfusedChainBitwise) {
  MOEFOLD_REQUIRE_GPU();
  check_chain(16, 5, 576, 96, 4000);
  check_chain(3, 3, 64, 72, 4001);
}

TEST(GemvSmall, ArgumentErrors) {  // host-side checks: no GPU needed
  auto* p = reinterpret_cast<bf16*>(uintptr_t(256));
  auto* pf = reinterpret_cast<float*>(uintptr_t(256));
  auto expect_error = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { cu::gemv_bf16(p, p, nullptr, p, 33, 64, 64, nullptr, nullptr); }, "max_rows 33");
  expect_error([&] { cu::gemv_bf16(p, p, nullptr, p, -1, 64, 64, nullptr, nullptr); }, "max_rows -1");
  expect_error([&] { cu::gemv_bf16(p, p, nullptr, p, 1, 0, 64, nullptr, nullptr); }, "bad sizes");
  expect_error([&] { cu::gemv_bf16_f32out(p, p, nullptr, pf, 1, 64, 0, nullptr, nullptr); }, "bad sizes");
  expect_error([&] { cu::gemv_bf16(p, p, nullptr, p, 2, 64, 64, nullptr, nullptr, 63); }, "bad strides");
  expect_error([&] { cu::gemv_swiglu_bf16(p, p, nullptr, p, 2, 64, 64, nullptr, nullptr, 0, 10); }, "bad strides");
  expect_error([&] { cu::gemv_residual_bf16(p, p, nullptr, p, p, 2, 64, 64, nullptr, nullptr, 0, 64, 32); },
               "bad strides");
  expect_error([&] { cu::gemv_bf16(p, p, nullptr, p, 1, 64, 64, nullptr, nullptr, 0, 0, 17); }, "warps_k 17");
  expect_error([&] { cu::gemv_bf16(nullptr, p, nullptr, p, 1, 64, 64, nullptr, nullptr); }, "null pointer");
  expect_error([&] { cu::gemv_residual_bf16(p, p, nullptr, nullptr, p, 1, 64, 64, nullptr, nullptr); },
               "null pointer");
  // max_rows = 0 is a no-op (no launch, pointers not used).
  EXPECT_NO_THROW(cu::gemv_bf16(nullptr, nullptr, nullptr, nullptr, 0, 64, 64, nullptr, nullptr));
  // The default K split depends only on the shape.
  EXPECT_EQ(cu::gemv_default_warps_k(2048, 4096), cu::gemv_default_warps_k(2048, 4096));
  EXPECT_GE(cu::gemv_default_warps_k(49, 72), 1);
  EXPECT_LE(cu::gemv_default_warps_k(49, 72), 3);  // K = 72 has 3 steps of 32
}

// ---- the model's decode shapes ---------------------------------------------------------------------------

TEST(Gemv, ModelShapes) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 5000;
  const std::initializer_list<int64_t> rows = {1, 2, 3, 7, 15, 16};
  // Qwen3.6-35B-A3B (hidden 2048): fused q|gate|k|v, q|gate, fused DeltaNet qkv|z|b|a, in_proj_z,
  // o_proj / out_proj, shared expert down; SwiGLU: shared expert gate_up (I = 512); residual: o_proj.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{9216, 2048}, {8192, 2048}, {12352, 2048}, {4096, 2048},
                      {2048, 4096}, {2048, 512}, {32, 2048}})
    check_rows(Var::Bf16, K, N, false, seed++, rows);
  check_rows(Var::Swiglu, 2048, 512, false, seed++, rows);
  check_rows(Var::Residual, 4096, 2048, false, seed++, rows);
  check_rows(Var::F32, 2048, 248320, false, seed++, {1, 16});  // lm_head logits
}

TEST(Gemv, BatchInvariantBitwiseModelShapes) {
  MOEFOLD_REQUIRE_GPU();
  check_invariance(Var::Bf16, 2048, 2000, 6000);
  check_invariance(Var::Bf16, 4096, 2048, 6001);
  check_invariance(Var::Swiglu, 2048, 512, 6002);
  check_invariance(Var::F32, 2048, 4000, 6003);
}

TEST(Gemv, MatchesUnfusedChainBitwiseModelShapes) {
  MOEFOLD_REQUIRE_GPU();
  check_chain(16, 16, 2048, 512, 7000);
  check_chain(1, 1, 4096, 2048, 7001);
}

// ---- timings ------------------------------------------------------------------------------------------

namespace {

/// Median time (us) of one call of `launch(i)` (i cycles over `copies` weight copies so the weights
/// come from HBM, not L2), from a CUDA graph of `copies` launches replayed on the default stream.
double graph_time_us(cudaStream_t s, int copies, const std::function<void(int)>& launch) {
  launch(0);  // warm-up outside capture (cuBLASLt's plan and workspace)
  MOEFOLD_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < copies; ++i) launch(i);
  MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double us = time_us([&] { cudaGraphLaunch(ge, nullptr); }, 3, 15);
  MOEFOLD_CUDA_CHECK(cudaGetLastError());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return us / copies;
}

}  // namespace

TEST(GemvPerf, DISABLED_Shapes) {
  MOEFOLD_REQUIRE_GPU();
  cudaStream_t s;
  MOEFOLD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Copy ceiling: a 1 GiB device-to-device copy, bytes read + written.
  double copy_tbs = 0;
  {
    const size_t n = size_t(1) << 30;
    DeviceBuffer<uint8_t> a(n), b(n);
    a.fill_bytes(0x5A);
    const double us = time_us([&] { cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, nullptr); }, 3, 15);
    copy_tbs = 2.0 * double(n) / us * 1e-6;
    perf_line("d2d_copy", "bytes=1GiB", us, fmt::format("TB/s={:.3f}", copy_tbs));
  }
  struct Shape {
    const char* name;
    int64_t N, K;  // weight rows (2I for swiglu), K
    Var var;
  };
  const Shape shapes[] = {
      {"qkv_fused", 9216, 2048, Var::Bf16},     {"q_gate", 8192, 2048, Var::Bf16},
      {"gdn_in_fused", 12352, 2048, Var::Bf16}, {"gdn_z", 4096, 2048, Var::Bf16},
      {"o_proj", 2048, 4096, Var::Bf16},        {"o_proj_resid", 2048, 4096, Var::Residual},
      {"square2048", 2048, 2048, Var::Bf16},    {"shared_gate_up", 1024, 2048, Var::Swiglu},
      {"shared_down", 2048, 512, Var::Bf16},    {"lm_head", 248320, 2048, Var::F32},
  };
  const double l2_defeat = 384.0 * (1 << 20);
  for (const Shape& sh : shapes) {
    const double wbytes = double(sh.N) * double(sh.K) * 2;
    const int copies = int(std::clamp(std::ceil(l2_defeat / wbytes), 1.0, 128.0));
    std::vector<DeviceBuffer<bf16>> ws;
    {
      const auto w0 = dev_bf16(rand_bf16(size_t(sh.N * sh.K), 42, 1.0f));  // random data, never zeros
      for (int i = 0; i < copies; ++i) {
        ws.emplace_back(size_t(sh.N * sh.K));
        MOEFOLD_CUDA_CHECK(cudaMemcpy(ws.back().data(), w0.data(), w0.bytes(), cudaMemcpyDeviceToDevice));
      }
    }
    const int64_t maxM = 32;
    const auto x = dev_bf16(rand_bf16(size_t(maxM * sh.K), 43, 1.0f));
    DeviceBuffer<bf16> y(size_t(maxM * sh.N)), res = dev_bf16(rand_bf16(size_t(maxM * sh.N), 44, 1.0f));
    DeviceBuffer<float> yf(size_t(maxM * sh.N));
    const int64_t nout = sh.var == Var::Swiglu ? sh.N / 2 : sh.N;
    for (int64_t M : {1, 2, 4, 8, 16, 32}) {
      auto gemv = [&](int i, int wk) {
        const bf16* w = ws[size_t(i)].data();
        switch (sh.var) {
          case Var::Bf16: cu::gemv_bf16(x.data(), w, nullptr, y.data(), M, sh.K, sh.N, nullptr, s, 0, 0, wk); break;
          case Var::F32: cu::gemv_bf16_f32out(x.data(), w, nullptr, yf.data(), M, sh.K, sh.N, nullptr, s, 0, 0, wk); break;
          case Var::Swiglu: cu::gemv_swiglu_bf16(x.data(), w, nullptr, y.data(), M, sh.K, nout, nullptr, s); break;
          case Var::Residual:
            cu::gemv_residual_bf16(x.data(), w, nullptr, res.data(), y.data(), M, sh.K, sh.N, nullptr, s);
            break;
        }
      };
      const double us = graph_time_us(s, copies, [&](int i) { gemv(i, 0); });
      const double cub = graph_time_us(s, copies, [&](int i) {
        if (sh.var == Var::F32) cu::gemm_bf16_f32out(x.data(), ws[size_t(i)].data(), nullptr, yf.data(), M, sh.K, sh.N, s);
        else cu::gemm_bf16(x.data(), ws[size_t(i)].data(), nullptr, y.data(), M, sh.K, sh.N, s);
      });
      const double tbs = wbytes / us * 1e-6;
      const int wk = cu::gemv_default_warps_k(nout, sh.K, sh.var == Var::Swiglu ? 8 : 16);
      perf_line(var_name(sh.var), fmt::format("{}:N={},K={},M={},wk={}", sh.name, sh.N, sh.K, M, wk), us,
                fmt::format("TB/s={:.3f} copy_frac={:.3f} cublas_us={:.2f} cublas_frac={:.3f} speedup={:.2f}", tbs,
                            tbs / copy_tbs, cub, wbytes / cub * 1e-6 / copy_tbs, cub / us));
      // K-split sweep (tuning data for the default choice): plain and fp32 variants at M = 1 and 16.
      if ((M == 1 || M == 16) && (sh.var == Var::Bf16 || sh.var == Var::F32))
        for (int k : {1, 2, 4, 8, 16}) {
          const double t = graph_time_us(s, copies, [&](int i) { gemv(i, k); });
          perf_line(std::string(var_name(sh.var)) + "_wk", fmt::format("{}:N={},K={},M={},wk={}", sh.name, sh.N, sh.K, M, k),
                    t, fmt::format("TB/s={:.3f} copy_frac={:.3f}", wbytes / t * 1e-6, wbytes / t * 1e-6 / copy_tbs));
        }
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace moefold::test
