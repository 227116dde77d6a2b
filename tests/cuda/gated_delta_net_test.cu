// Contract tests of the CUDA Gated DeltaNet kernels (causal_conv1d.h, gated_delta_net.h) against the CPU
// references in src/ops/cpu/gated_delta_net.h, on random bf16 inputs (converted to fp32 for the CPU) and
// random non-zero initial states. Outputs and unused state slots are poisoned (NaN bytes) before each run;
// padding rows / slots must stay byte-identical, and live rows must equal an unpadded run's. Tests named
// *Small use the small shape (Hk=2, Hv=4, dk=dv=32) and short sequences: the compute-sanitizer pass.
#include "ops/cuda/cuda_check.h"  // first: sets up fmt for nvcc

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/gated_delta_net.h"
#include "ops/cuda/causal_conv1d.h"
#include "ops/cuda/gated_delta_net.h"
#include "test_util.h"

namespace {

using moefold::bf16_to_f32;
using moefold::f32_to_bf16;
using moefold::cuda::GdnArgs;
using moefold::cuda::GdnDims;
using moefold::cuda::GdnSnapshot;
using moefold::test::contract;
using moefold::test::contract_exact;
using moefold::test::rel_err;

constexpr double kTolState = 1e-3;  // fp32 state paths
constexpr double kTolBf16 = 1e-2;   // bf16 outputs
constexpr int kConvK = 4;
constexpr GdnDims kSmall{2, 4, 32, 32};
constexpr GdnDims kReal{16, 32, 128, 128};
constexpr GdnDims kTc{1, 2, 128, 32};  // smallest shape on the tensor-core prefill path (dk 128, dv 32)

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { MOEFOLD_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void up(const std::vector<T>& h) {
    if (h.size() != n) moefold::fail("Dev::up: size {} != {}", h.size(), n);
    if (n) MOEFOLD_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> down() const {
    std::vector<T> h(n);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    if (n) MOEFOLD_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { MOEFOLD_CUDA_CHECK(cudaMemset(p, 0xFF, std::max<size_t>(n, 1) * sizeof(T))); }
  __nv_bfloat16* bf() const { return reinterpret_cast<__nv_bfloat16*>(p); }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

template <class T>
std::vector<T> slice(const std::vector<T>& v, size_t off, size_t n) {
  return std::vector<T>(v.begin() + long(off), v.begin() + long(off + n));
}
/// Number of elements in [off, off + n) whose bytes differ between a and b.
template <class T>
size_t byte_mismatches(const std::vector<T>& a, const std::vector<T>& b, size_t off, size_t n) {
  size_t bad = 0;
  for (size_t i = off; i < off + n; ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}
/// Number of elements in [off, off + n) that are not all-0xFF bytes (the poison).
template <class T>
size_t unpoisoned(const std::vector<T>& v, size_t off, size_t n) {
  T p;
  std::memset(&p, 0xFF, sizeof(T));
  size_t bad = 0;
  for (size_t i = off; i < off + n; ++i) bad += std::memcmp(&v[i], &p, sizeof(T)) != 0;
  return bad;
}

std::string dims_str(const GdnDims& d) {
  return "Hk=" + std::to_string(d.num_k_heads) + ",Hv=" + std::to_string(d.num_v_heads) +
         ",dk=" + std::to_string(d.k_dim) + ",dv=" + std::to_string(d.v_dim);
}
std::string lens_str(const std::vector<int>& lens) {
  std::string s;
  for (size_t i = 0; i < lens.size(); ++i) s += (i ? "+" : "") + std::to_string(lens[i]);
  return s;
}

std::vector<int32_t> cu_of(const std::vector<int>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

/// cu_seqlens of capacity cap (>= live): padding entries point past the live rows (never data).
std::vector<int32_t> cu_padded(const std::vector<int>& lens, int cap, int cap_rows) {
  auto cu = cu_of(lens);
  const int rows = cu.back();
  for (int s = int(lens.size()) + 1; s <= cap; ++s) cu.push_back(std::min(cap_rows, rows + 2 * (s - int(lens.size()))));
  return cu;
}

int64_t conv_dim(const GdnDims& d) { return 2LL * d.num_k_heads * d.k_dim + int64_t(d.num_v_heads) * d.v_dim; }

// ---------------------------------------------------------------------------------------------------
// Delta-rule problem: rows [T, conv_dim] (q | k | v, bf16-rounded), a/b rows [T, 2*Hv] (a then b),
// per-head A_log / dt_bias (fp32).
struct Problem {
  GdnDims d;
  int64_t stride, T;
  std::vector<float> qkv, ab, A_log, dt_bias;

  Problem(const GdnDims& dims, int64_t rows, uint64_t seed) : d(dims), stride(conv_dim(dims)), T(rows) {
    const int Hv = d.num_v_heads;
    qkv = round_bf16(moefold::test::randn(size_t(T * stride), seed));
    auto a = moefold::test::randn(size_t(T * Hv), seed + 1);
    auto b = moefold::test::randn(size_t(T * Hv), seed + 2, 1.5f);
    ab.resize(size_t(T * 2 * Hv));
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < Hv; ++h) {
        ab[size_t(t * 2 * Hv + h)] = a[size_t(t * Hv + h)];
        ab[size_t(t * 2 * Hv + Hv + h)] = b[size_t(t * Hv + h)];
      }
    ab = round_bf16(ab);
    // Per-token decays from ~0.999 to ~0.1 across heads and tokens.
    A_log = moefold::test::uniform(size_t(Hv), seed + 3, -3.0f, 1.0f);
    dt_bias = moefold::test::uniform(size_t(Hv), seed + 4, -3.0f, 0.5f);
  }
  int64_t state_elems() const { return int64_t(d.num_v_heads) * d.k_dim * d.v_dim; }
  int64_t out_row() const { return int64_t(d.num_v_heads) * d.v_dim; }

  /// CPU reference over rows [r0, r0 + n) of `rows` (default: qkv): state [Hv, dk, dv] in place, out [n, Hv, dv].
  void reference(int64_t r0, int64_t n, float* state, float* out, const std::vector<float>* rows = nullptr) const {
    const std::vector<float>& X = rows ? *rows : qkv;
    const int Hk = d.num_k_heads, Hv = d.num_v_heads, dk = d.k_dim, dv = d.v_dim;
    std::vector<float> q(size_t(n * Hk * dk)), k(q.size()), v(size_t(n * Hv * dv)), a(size_t(n * Hv)), b(a.size()),
        g(a.size()), beta(a.size());
    for (int64_t t = 0; t < n; ++t) {
      const float* row = X.data() + (r0 + t) * stride;
      std::copy(row, row + Hk * dk, q.begin() + t * Hk * dk);
      std::copy(row + Hk * dk, row + 2 * Hk * dk, k.begin() + t * Hk * dk);
      std::copy(row + 2 * Hk * dk, row + 2 * Hk * dk + Hv * dv, v.begin() + t * Hv * dv);
      const float* abr = ab.data() + (r0 + t) * 2 * Hv;
      std::copy(abr, abr + Hv, a.begin() + t * Hv);
      std::copy(abr + Hv, abr + 2 * Hv, b.begin() + t * Hv);
    }
    moefold::cpu::gdn_gating(a.data(), b.data(), A_log.data(), dt_bias.data(), g.data(), beta.data(), n, Hv);
    moefold::cpu::gated_delta_rule_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), state, out, n,
                                             {Hk, Hv, dk, dv});
  }
};

/// Device copy of a Problem's inputs; args() points GdnArgs at them from row `row0` (q/k/v taken from
/// `qkv_override` when given, e.g. a conv output).
struct DevProblem {
  const Problem& P;
  Dev<uint16_t> qkv, ab;
  Dev<float> A_log, dt_bias;
  explicit DevProblem(const Problem& prob)
      : P(prob), qkv(to_bf16(prob.qkv)), ab(to_bf16(prob.ab)), A_log(prob.A_log), dt_bias(prob.dt_bias) {}
  GdnArgs args(int64_t row0, float* pool, const int32_t* slots, const int32_t* num_seqs, uint16_t* out,
               const uint16_t* qkv_override = nullptr, bool offset_out = true) const {
    const int64_t kd = int64_t(P.d.num_k_heads) * P.d.k_dim;
    const uint16_t* base = qkv_override ? qkv_override : qkv.p;
    GdnArgs a{};
    a.q = reinterpret_cast<const __nv_bfloat16*>(base) + row0 * P.stride;
    a.k = a.q + kd;
    a.v = a.q + 2 * kd;
    a.row_stride = P.stride;
    a.a = ab.bf() + row0 * 2 * P.d.num_v_heads;
    a.b = a.a + P.d.num_v_heads;
    a.ab_stride = 2 * P.d.num_v_heads;
    a.A_log = A_log.p;
    a.dt_bias = dt_bias.p;
    a.state_pool = pool;
    a.state_slots = slots;
    a.num_seqs = num_seqs;
    a.out = reinterpret_cast<__nv_bfloat16*>(offset_out ? out + row0 * P.out_row() : out);
    a.max_rows = P.T - row0;  // the rows from row0 on (an upper bound on every launch's rows)
    return a;
  }
};

/// Pool of nslots states: random (std 0.5) in the `used` slots, NaN bytes elsewhere.
std::vector<float> make_pool(int64_t nslots, int64_t elems, const std::vector<int32_t>& used, uint64_t seed) {
  std::vector<float> pool(size_t(nslots * elems));
  std::memset(pool.data(), 0xFF, pool.size() * sizeof(float));
  for (size_t i = 0; i < used.size(); ++i) {
    auto r = moefold::test::randn(size_t(elems), seed + 17 * i, 0.5f);
    std::copy(r.begin(), r.end(), pool.begin() + used[i] * elems);
  }
  return pool;
}

// ---------------------------------------------------------------------------------------------------
// Causal conv1d, varlen prefill: live sequences `lens` in a launch of capacity lens+3 sequences and
// rows+37 rows, distinct non-identity slots, random initial conv state.
void conv_prefill_case(int C, const std::vector<int>& lens, uint64_t seed) {
  const int S = int(lens.size()), cap = S + 3, Km1 = kConvK - 1;
  const auto cu = cu_of(lens);
  const int rows = cu[size_t(S)], cap_rows = rows + 37;
  const auto w = round_bf16(moefold::test::randn(size_t(C) * kConvK, seed, 0.5f));
  const auto x = round_bf16(moefold::test::randn(size_t(cap_rows) * C, seed + 1));
  const int nslots = 2 * cap + 1;
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = nslots - 1 - 2 * s;
  const auto st0 = to_bf16(moefold::test::randn(size_t(nslots) * C * Km1, seed + 2));
  const size_t se = size_t(C) * Km1;

  Dev<uint16_t> dx(to_bf16(x)), dw(to_bf16(w)), dy(size_t(cap_rows) * C), dst(st0);
  Dev<int32_t> dcu(cu_padded(lens, cap, cap_rows)), dslots(slots), dns(std::vector<int32_t>{S});
  dy.poison();
  moefold::cuda::causal_conv1d_silu_prefill(dx.bf(), dw.bf(), dcu.p, dslots.p, dns.p, cap_rows, dst.bf(), dy.bf(), C,
                                            kConvK, nullptr);
  const auto y = dy.down();
  const auto st = dst.down();

  std::vector<float> yref(size_t(rows) * C), stref = from_bf16(st0);
  for (int s = 0; s < S; ++s)
    moefold::cpu::causal_conv1d_silu(x.data() + size_t(cu[size_t(s)]) * C, w.data(),
                                     stref.data() + size_t(slots[size_t(s)]) * se,
                                     yref.data() + size_t(cu[size_t(s)]) * C, lens[size_t(s)], C, kConvK);
  const std::string shape = "C=" + std::to_string(C) + ",K=4,lens=" + lens_str(lens) + ",cap_rows=" +
                            std::to_string(cap_rows) + ",cap_seqs=" + std::to_string(cap);
  EXPECT_TRUE(contract("conv1d_prefill.y", shape, rel_err(from_bf16(slice(y, 0, size_t(rows) * C)), yref), kTolBf16));
  // The new state is a copy of bf16 inputs: exact. Slots of padding sequences stay untouched.
  size_t bad_state = 0;
  const auto stref_bf = to_bf16(stref);
  for (int s = 0; s < nslots; ++s) bad_state += byte_mismatches(st, stref_bf, size_t(s) * se, se);
  EXPECT_TRUE(contract_exact("conv1d_prefill.state+padding_slots", shape, bad_state));
  EXPECT_TRUE(contract_exact("conv1d_prefill.padding_rows", shape,
                             unpoisoned(y, size_t(rows) * C, size_t(cap_rows - rows) * C)));
  // Unpadded run (capacity = live) gives the same bytes.
  Dev<uint16_t> dy2(size_t(rows) * C), dst2(st0);
  Dev<int32_t> dcu2(cu), dslots2(slice(slots, 0, size_t(S)));
  dy2.poison();
  moefold::cuda::causal_conv1d_silu_prefill(dx.bf(), dw.bf(), dcu2.p, dslots2.p, dns.p, rows, dst2.bf(), dy2.bf(), C,
                                            kConvK, nullptr);
  const auto y2 = dy2.down();
  const auto st2 = dst2.down();
  EXPECT_TRUE(contract_exact("conv1d_prefill.unpadded_equal", shape,
                             byte_mismatches(y, y2, 0, size_t(rows) * C) + byte_mismatches(st, st2, 0, st.size())));
  // x read in place from a wider row (a fused projection's output): the same bytes.
  const int xs = C + 40;
  std::vector<uint16_t> xw(size_t(cap_rows) * xs, 0xFFFF);
  const auto xb = to_bf16(x);
  for (int r = 0; r < cap_rows; ++r) std::copy_n(xb.begin() + size_t(r) * C, C, xw.begin() + size_t(r) * xs);
  Dev<uint16_t> dxw(xw), dy3(size_t(cap_rows) * C), dst3(st0);
  dy3.poison();
  moefold::cuda::causal_conv1d_silu_prefill(dxw.bf(), dw.bf(), dcu.p, dslots.p, dns.p, cap_rows, dst3.bf(), dy3.bf(),
                                            C, kConvK, nullptr, xs);
  EXPECT_TRUE(contract_exact("conv1d_prefill.strided_x_equal", shape + ",x_stride=" + std::to_string(xs),
                             byte_mismatches(y, dy3.down(), 0, y.size()) + byte_mismatches(st, dst3.down(), 0, st.size())));
}

// Causal conv1d decode: batch `live` in capacity live+3.
void conv_decode_case(int C, int live, uint64_t seed) {
  const int cap = live + 3, Km1 = kConvK - 1, nslots = 2 * cap + 1;
  const size_t se = size_t(C) * Km1;
  const auto w = round_bf16(moefold::test::randn(size_t(C) * kConvK, seed, 0.5f));
  const auto x = round_bf16(moefold::test::randn(size_t(cap) * C, seed + 1));
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = (s * 2 + 1) % nslots;
  const auto st0 = to_bf16(moefold::test::randn(size_t(nslots) * se, seed + 2));
  Dev<uint16_t> dx(to_bf16(x)), dw(to_bf16(w)), dy(size_t(cap) * C), dst(st0);
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{live});
  dy.poison();
  moefold::cuda::causal_conv1d_silu_decode(dx.bf(), dw.bf(), dslots.p, dns.p, cap, dst.bf(), dy.bf(), C, kConvK,
                                           nullptr);
  const auto y = dy.down();
  const auto st = dst.down();
  std::vector<float> yref(size_t(live) * C), stref = from_bf16(st0);
  for (int s = 0; s < live; ++s)
    moefold::cpu::causal_conv1d_silu(x.data() + size_t(s) * C, w.data(), stref.data() + size_t(slots[size_t(s)]) * se,
                                     yref.data() + size_t(s) * C, 1, C, kConvK);
  const std::string shape = "C=" + std::to_string(C) + ",K=4,batch=" + std::to_string(live) + ",cap=" +
                            std::to_string(cap);
  EXPECT_TRUE(contract("conv1d_decode.y", shape, rel_err(from_bf16(slice(y, 0, size_t(live) * C)), yref), kTolBf16));
  EXPECT_TRUE(contract_exact("conv1d_decode.state+padding_slots", shape, byte_mismatches(st, to_bf16(stref), 0, st.size())));
  EXPECT_TRUE(contract_exact("conv1d_decode.padding_rows", shape, unpoisoned(y, size_t(live) * C, size_t(cap - live) * C)));
  Dev<uint16_t> dy2(size_t(live) * C), dst2(st0);
  dy2.poison();
  moefold::cuda::causal_conv1d_silu_decode(dx.bf(), dw.bf(), dslots.p, dns.p, live, dst2.bf(), dy2.bf(), C, kConvK,
                                           nullptr);
  EXPECT_TRUE(contract_exact("conv1d_decode.unpadded_equal", shape,
                             byte_mismatches(y, dy2.down(), 0, size_t(live) * C) +
                                 byte_mismatches(st, dst2.down(), 0, st.size())));
  // x read in place from a wider row (a fused projection's output): the same bytes.
  const int xs = C + 40;
  std::vector<uint16_t> xw(size_t(cap) * xs, 0xFFFF);
  const auto xb = to_bf16(x);
  for (int r = 0; r < cap; ++r) std::copy_n(xb.begin() + size_t(r) * C, C, xw.begin() + size_t(r) * xs);
  Dev<uint16_t> dxw(xw), dy3(size_t(cap) * C), dst3(st0);
  dy3.poison();
  moefold::cuda::causal_conv1d_silu_decode(dxw.bf(), dw.bf(), dslots.p, dns.p, cap, dst3.bf(), dy3.bf(), C, kConvK,
                                           nullptr, xs);
  EXPECT_TRUE(contract_exact("conv1d_decode.strided_x_equal", shape + ",x_stride=" + std::to_string(xs),
                             byte_mismatches(y, dy3.down(), 0, y.size()) + byte_mismatches(st, dst3.down(), 0, st.size())));
}

// ---------------------------------------------------------------------------------------------------
// Chunked prefill of several sequences in one launch (capacity lens+2 sequences, rows+5 rows), random
// initial states in distinct non-identity slots, against the CPU recurrence per sequence.
void prefill_case(const GdnDims& d, const std::vector<int>& lens, uint64_t seed) {
  const int S = int(lens.size()), cap = S + 2;
  const auto cu = cu_of(lens);
  const int rows = cu[size_t(S)], cap_rows = rows + 5;
  const Problem P(d, cap_rows, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  const int nslots = 2 * cap + 1;
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = nslots - 1 - 2 * s;
  const auto pool0 = make_pool(nslots, se, slice(slots, 0, size_t(S)), seed + 5);

  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t(cap_rows * orow));
  Dev<int32_t> dcu(cu_padded(lens, cap, cap_rows)), dslots(slots), dns(std::vector<int32_t>{S});
  dout.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), dcu.p, cap, nullptr, nullptr, 0, d,
                                     nullptr);
  const auto out = dout.down();
  const auto pool = dpool.down();

  std::vector<float> oref(size_t(rows * orow)), pref = pool0;
  for (int s = 0; s < S; ++s)
    P.reference(cu[size_t(s)], lens[size_t(s)], pref.data() + slots[size_t(s)] * se,
                oref.data() + cu[size_t(s)] * orow);
  std::vector<float> st_gpu, st_ref;
  for (int s = 0; s < S; ++s) {
    const auto a = slice(pool, size_t(slots[size_t(s)] * se), size_t(se));
    const auto b = slice(pref, size_t(slots[size_t(s)] * se), size_t(se));
    st_gpu.insert(st_gpu.end(), a.begin(), a.end());
    st_ref.insert(st_ref.end(), b.begin(), b.end());
  }
  size_t pad_slots = 0;
  for (int s = 0; s < nslots; ++s)
    if (std::find(slots.begin(), slots.begin() + S, s) == slots.begin() + S)
      pad_slots += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
  const std::string shape = dims_str(d) + ",lens=" + lens_str(lens) + ",cap_seqs=" + std::to_string(cap);
  EXPECT_TRUE(contract("gdn_prefill.out", shape, rel_err(from_bf16(slice(out, 0, size_t(rows * orow))), oref), kTolBf16));
  EXPECT_TRUE(contract("gdn_prefill.state", shape, rel_err(st_gpu, st_ref), kTolState));
  EXPECT_TRUE(contract_exact("gdn_prefill.padding", shape,
                             pad_slots + unpoisoned(out, size_t(rows * orow), size_t((cap_rows - rows) * orow))));
  // Unpadded run (capacity = live) gives the same bytes.
  Dev<float> dpool2(pool0);
  Dev<uint16_t> dout2(size_t(rows * orow));
  Dev<int32_t> dcu2(cu);
  dout2.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpool2.p, dslots.p, dns.p, dout2.p), dcu2.p, S, nullptr, nullptr, 0,
                                     d, nullptr);
  EXPECT_TRUE(contract_exact("gdn_prefill.unpadded_equal", shape,
                             byte_mismatches(out, dout2.down(), 0, size_t(rows * orow)) +
                                 byte_mismatches(pool, dpool2.down(), 0, pool.size())));
}

// GPU chunked prefill of T tokens == the GPU recurrent decode step run T times.
void chunked_vs_recurrent_case(const GdnDims& d, int T, uint64_t seed) {
  const Problem P(d, T, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  const std::vector<int32_t> slot0{0};
  const auto pool0 = make_pool(1, se, slot0, seed + 5);
  DevProblem dp(P);
  Dev<float> dpa(pool0), dpb(pool0);
  Dev<uint16_t> oa(size_t(T * orow)), ob(size_t(T * orow));
  Dev<int32_t> dcu(std::vector<int32_t>{0, T}), dslots(slot0), dns(std::vector<int32_t>{1});
  oa.poison();
  ob.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpa.p, dslots.p, dns.p, oa.p), dcu.p, 1, nullptr, nullptr, 0, d,
                                     nullptr);
  for (int t = 0; t < T; ++t)
    moefold::cuda::gdn_recurrent_decode(dp.args(t, dpb.p, dslots.p, dns.p, ob.p), 1, d, nullptr);
  const std::string shape = dims_str(d) + ",T=" + std::to_string(T);
  EXPECT_TRUE(contract("gdn_chunked_vs_steps.out", shape, rel_err(from_bf16(oa.down()), from_bf16(ob.down())), kTolBf16));
  EXPECT_TRUE(contract("gdn_chunked_vs_steps.state", shape, rel_err(dpa.down(), dpb.down()), kTolState));
}

// Conv + delta rule over T tokens in one launch == two launches split at n (conv and delta state carried).
void split_case(const GdnDims& d, int T, int n, uint64_t seed) {
  const Problem P(d, T, seed);  // P.qkv: raw (pre-conv) projections here
  const int64_t C = P.stride, se = P.state_elems(), orow = P.out_row(), ce = C * (kConvK - 1);
  const auto w = round_bf16(moefold::test::randn(size_t(C) * kConvK, seed + 7, 0.5f));
  const std::vector<int32_t> slot0{0};
  const auto pool0 = make_pool(1, se, slot0, seed + 5);
  const auto conv0 = to_bf16(moefold::test::randn(size_t(ce), seed + 6));
  DevProblem dp(P);
  Dev<uint16_t> dw(to_bf16(w));
  Dev<int32_t> dslots(slot0), dns(std::vector<int32_t>{1});
  auto run = [&](const std::vector<int>& parts, std::vector<uint16_t>& y, std::vector<uint16_t>& out,
                 std::vector<float>& state, std::vector<uint16_t>& conv) {
    Dev<float> dpool(pool0);
    Dev<uint16_t> dconv(conv0), dy(size_t(T * C)), dout(size_t(T * orow));
    dy.poison();
    dout.poison();
    int r0 = 0;
    for (int len : parts) {
      Dev<int32_t> dcu(std::vector<int32_t>{0, len});
      moefold::cuda::causal_conv1d_silu_prefill(dp.qkv.bf() + r0 * C, dw.bf(), dcu.p, dslots.p, dns.p, len, dconv.bf(),
                                                dy.bf() + r0 * C, int(C), kConvK, nullptr);
      moefold::cuda::gdn_chunked_prefill(dp.args(r0, dpool.p, dslots.p, dns.p, dout.p, dy.p), dcu.p, 1, nullptr,
                                         nullptr, 0, d, nullptr);
      r0 += len;
    }
    y = dy.down();
    out = dout.down();
    state = dpool.down();
    conv = dconv.down();
  };
  std::vector<uint16_t> y1, o1, c1, y2, o2, c2;
  std::vector<float> s1, s2;
  run({T}, y1, o1, s1, c1);
  run({n, T - n}, y2, o2, s2, c2);
  const std::string shape = dims_str(d) + ",T=" + std::to_string(T) + ",split=" + std::to_string(n);
  EXPECT_TRUE(contract_exact("gdn_split.conv_y+conv_state", shape,
                             byte_mismatches(y1, y2, 0, y1.size()) + byte_mismatches(c1, c2, 0, c1.size())));
  EXPECT_TRUE(contract("gdn_split.out", shape, rel_err(from_bf16(o2), from_bf16(o1)), kTolBf16));
  EXPECT_TRUE(contract("gdn_split.state", shape, rel_err(s2, s1), kTolState));
  // The whole pipeline against the CPU (conv, then the recurrence on the bf16 conv output).
  std::vector<float> yref(size_t(T * C)), cst = from_bf16(conv0), sref = pool0, oref(size_t(T * orow));
  moefold::cpu::causal_conv1d_silu(P.qkv.data(), w.data(), cst.data(), yref.data(), T, C, kConvK);
  EXPECT_TRUE(contract("gdn_split.conv_y_vs_cpu", shape, rel_err(from_bf16(y1), yref), kTolBf16));
  const auto ygpu = from_bf16(y1);
  P.reference(0, T, sref.data(), oref.data(), &ygpu);
  EXPECT_TRUE(contract("gdn_split.out_vs_cpu", shape, rel_err(from_bf16(o1), oref), kTolBf16));
  EXPECT_TRUE(contract("gdn_split.state_vs_cpu", shape, rel_err(s1, sref), kTolState));
}

// Snapshots at chunk boundaries of two sequences in one launch == CPU state of a prefill stopped there,
// and == a GPU prefill stopped there. Entries for padding sequences, chunks past the end and entries past
// the live snapshot count are ignored (their destination slots stay poisoned).
void snapshot_case(const GdnDims& d, int len0, int len1, uint64_t seed) {
  const std::vector<int> lens{len0, len1};
  const int S = 2, cap = 3, rows = len0 + len1;
  const Problem P(d, rows + 4, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  const std::vector<int32_t> slots{1, 0, 2};  // seq 2 is padding
  const auto pool0 = make_pool(12, se, {1, 0}, seed + 5);
  const int last0 = (len0 - 1) / 64, last1 = (len1 - 1) / 64;
  // {seq, chunk, dst}: live entries first, then ones that must be ignored.
  const std::vector<GdnSnapshot> snaps{{0, 0, 3},        {0, last0 > 1 ? 2 : last0, 4}, {0, last0, 5},
                                       {1, 1 <= last1 ? 1 : 0, 6}, {1, last1 + 1, 7},  {2, 0, 8},
                                       {0, 1, 9}};
  const int live_snaps = 6;
  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t((rows + 4) * orow));
  Dev<int32_t> dcu(cu_padded(lens, cap, rows + 4)), dslots(slots), dns(std::vector<int32_t>{S}),
      dnsnap(std::vector<int32_t>{live_snaps});
  Dev<GdnSnapshot> dsnaps(snaps);
  dout.poison();
  moefold::cuda::gdn_chunked_prefill(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), dcu.p, cap, dsnaps.p, dnsnap.p,
                                     int(snaps.size()), d, nullptr);
  const auto pool = dpool.down();
  const auto cu = cu_of(lens);
  for (int e = 0; e < live_snaps - 2; ++e) {  // the first four entries are valid
    const GdnSnapshot sn = snaps[size_t(e)];
    const int n = std::min(64 * (sn.chunk + 1), lens[size_t(sn.seq)]);
    std::vector<float> sref = slice(pool0, size_t(slots[size_t(sn.seq)] * se), size_t(se)), oref(size_t(n * orow));
    P.reference(cu[size_t(sn.seq)], n, sref.data(), oref.data());
    const std::string shape = dims_str(d) + ",lens=" + lens_str(lens) + ",seq=" + std::to_string(sn.seq) +
                              ",chunk=" + std::to_string(sn.chunk) + ",tokens=" + std::to_string(n);
    const auto got = slice(pool, size_t(sn.dst_slot * se), size_t(se));
    EXPECT_TRUE(contract("gdn_snapshot.vs_cpu", shape, rel_err(got, sref), kTolState));
    // GPU prefill of only those n tokens.
    Dev<float> dp2(pool0);
    Dev<uint16_t> do2(size_t(n * orow));
    Dev<int32_t> dcu2(std::vector<int32_t>{0, n}), ds2(std::vector<int32_t>{slots[size_t(sn.seq)]}),
        dn2(std::vector<int32_t>{1});
    moefold::cuda::gdn_chunked_prefill(dp.args(cu[size_t(sn.seq)], dp2.p, ds2.p, dn2.p, do2.p, nullptr, false), dcu2.p, 1, nullptr,
                                       nullptr, 0, d, nullptr);
    const auto pool2 = dp2.down();
    EXPECT_TRUE(contract("gdn_snapshot.vs_gpu_prefix", shape,
                         rel_err(got, slice(pool2, size_t(slots[size_t(sn.seq)] * se), size_t(se))), kTolState));
  }
  size_t untouched = 0;
  for (int s : {2, 7, 8, 9, 10, 11}) untouched += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
  EXPECT_TRUE(contract_exact("gdn_snapshot.ignored_entries", dims_str(d) + ",lens=" + lens_str(lens), untouched));
}

// Recurrent decode of `live` sequences in capacity live+3 against one CPU step per sequence.
void decode_case(const GdnDims& d, int live, uint64_t seed) {
  const int cap = live + 3, nslots = 2 * cap + 1;
  const Problem P(d, cap, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = 2 * cap - 2 * s;  // distinct, reversed, with gaps
  const auto pool0 = make_pool(nslots, se, slice(slots, 0, size_t(live)), seed + 5);
  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t(cap * orow));
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{live});
  dout.poison();
  moefold::cuda::gdn_recurrent_decode(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), cap, d, nullptr);
  const auto out = dout.down();
  const auto pool = dpool.down();
  std::vector<float> oref(size_t(live * orow)), pref = pool0, st_gpu, st_ref;
  for (int s = 0; s < live; ++s) {
    P.reference(s, 1, pref.data() + slots[size_t(s)] * se, oref.data() + s * orow);
    const auto a = slice(pool, size_t(slots[size_t(s)] * se), size_t(se));
    const auto b = slice(pref, size_t(slots[size_t(s)] * se), size_t(se));
    st_gpu.insert(st_gpu.end(), a.begin(), a.end());
    st_ref.insert(st_ref.end(), b.begin(), b.end());
  }
  size_t pad = unpoisoned(out, size_t(live * orow), size_t((cap - live) * orow));
  for (int s = 0; s < nslots; ++s)
    if (std::find(slots.begin(), slots.begin() + live, s) == slots.begin() + live)
      pad += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
  const std::string shape = dims_str(d) + ",batch=" + std::to_string(live) + ",cap=" + std::to_string(cap);
  EXPECT_TRUE(contract("gdn_decode.out", shape, rel_err(from_bf16(slice(out, 0, size_t(live * orow))), oref), kTolBf16));
  EXPECT_TRUE(contract("gdn_decode.state", shape, rel_err(st_gpu, st_ref), kTolState));
  EXPECT_TRUE(contract_exact("gdn_decode.padding", shape, pad));
  Dev<float> dpool2(pool0);
  Dev<uint16_t> dout2(size_t(live * orow));
  dout2.poison();
  moefold::cuda::gdn_recurrent_decode(dp.args(0, dpool2.p, dslots.p, dns.p, dout2.p), live, d, nullptr);
  EXPECT_TRUE(contract_exact("gdn_decode.unpadded_equal", shape,
                             byte_mismatches(out, dout2.down(), 0, size_t(live * orow)) +
                                 byte_mismatches(pool, dpool2.down(), 0, pool.size())));
}

// The decode kernels (detail::gdn_recurrent_decode_variant) that can run `d`: 0 (the former kernel) and
// 1 / 2 / 4 value columns a lane where dk and dv allow them.
std::vector<int> decode_variants(const GdnDims& d) {
  std::vector<int> v{0, 1};
  for (int c : {2, 4})
    if (d.k_dim <= 128 && d.v_dim % (32 * c) == 0) v.push_back(c);
  return v;
}

// Decode at capacity `cap`, at each live count of `lives`: every kernel variant gives the former
// kernel's bits (outputs and states); padding rows of out stay poisoned and the slots of padding
// sequences and unused slots keep their bytes; one sequence run alone (capacity 1) equals its row in the
// batch bit for bit; the first rows match the CPU.
void decode_live_case(const GdnDims& d, int cap, const std::vector<int>& lives, uint64_t seed) {
  const int nslots = cap + 2;
  const Problem P(d, cap, seed);
  const int64_t se = P.state_elems(), orow = P.out_row();
  std::vector<int32_t> slots(static_cast<size_t>(cap));
  for (int s = 0; s < cap; ++s) slots[size_t(s)] = cap - s;  // reversed; slots 0 and cap + 1 unused
  const auto pool0 = make_pool(nslots, se, slots, seed + 5);
  DevProblem dp(P);
  Dev<float> dpool(pool0);
  Dev<uint16_t> dout(size_t(cap * orow));
  Dev<int32_t> dslots(slots), dns(std::vector<int32_t>{cap});
  const std::vector<int> variants = decode_variants(d);
  for (int L : lives) {
    const std::string shape = dims_str(d) + ",cap=" + std::to_string(cap) + ",live=" + std::to_string(L);
    dns.up(std::vector<int32_t>{L});
    std::vector<uint16_t> out_ref;
    std::vector<float> pool_ref;
    for (int v : variants) {
      dpool.up(pool0);
      dout.poison();
      moefold::cuda::detail::gdn_recurrent_decode_variant(dp.args(0, dpool.p, dslots.p, dns.p, dout.p), cap, d, v,
                                                          nullptr);
      auto out = dout.down();
      auto pool = dpool.down();
      size_t pad = unpoisoned(out, size_t(L * orow), size_t((cap - L) * orow));
      for (int s = 0; s < nslots; ++s)
        if (std::find(slots.begin(), slots.begin() + L, s) == slots.begin() + L)
          pad += byte_mismatches(pool, pool0, size_t(s * se), size_t(se));
      EXPECT_TRUE(contract_exact("gdn_decode_live.padding", shape + ",variant=" + std::to_string(v), pad));
      if (v == 0) {
        out_ref = std::move(out);
        pool_ref = std::move(pool);
        continue;
      }
      EXPECT_TRUE(contract_exact("gdn_decode_live.variant_eq_former", shape + ",variant=" + std::to_string(v),
                                 byte_mismatches(out, out_ref, 0, out.size()) +
                                     byte_mismatches(pool, pool_ref, 0, pool.size())));
    }
    // One sequence alone (capacity 1, the automatic kernel) == its row in the batch.
    for (int t : {0, L - 1}) {
      Dev<float> dp1(pool0);
      Dev<uint16_t> do1(static_cast<size_t>(orow));
      Dev<int32_t> ds1(std::vector<int32_t>{slots[size_t(t)]}), dn1(std::vector<int32_t>{1});
      do1.poison();
      moefold::cuda::gdn_recurrent_decode(dp.args(t, dp1.p, ds1.p, dn1.p, do1.p, nullptr, false), 1, d, nullptr);
      const auto o1 = do1.down();
      const auto p1 = dp1.down();
      const size_t sl = size_t(slots[size_t(t)]);
      size_t mis = 0;
      for (int64_t e = 0; e < orow; ++e) mis += o1[size_t(e)] != out_ref[size_t(t * orow + e)];
      mis += byte_mismatches(p1, pool_ref, sl * se, size_t(se));
      EXPECT_TRUE(contract_exact("gdn_decode_live.one_row_eq_batch_row", shape + ",row=" + std::to_string(t), mis));
    }
    // The first two live rows against the CPU.
    for (int t = 0; t < std::min(L, 2); ++t) {
      std::vector<float> sref = slice(pool0, size_t(slots[size_t(t)] * se), size_t(se)), oref(static_cast<size_t>(orow));
      P.reference(t, 1, sref.data(), oref.data());
      const auto o = slice(out_ref, size_t(t * orow), size_t(orow));
      EXPECT_TRUE(contract("gdn_decode_live.out_vs_cpu", shape + ",row=" + std::to_string(t),
                           rel_err(from_bf16(o), oref), kTolBf16));
      EXPECT_TRUE(contract("gdn_decode_live.state_vs_cpu", shape + ",row=" + std::to_string(t),
                           rel_err(slice(pool_ref, size_t(slots[size_t(t)] * se), size_t(se)), sref), kTolState));
    }
  }
}

const std::vector<int> kLens{1, 2, 17, 63, 64, 65, 127, 1000, 4100};

}  // namespace

// ---------------------------------------------------------------------------------------------------

TEST(GdnConv, PrefillSmall) {
  MOEFOLD_REQUIRE_GPU();
  conv_prefill_case(int(conv_dim(kSmall)), {1, 0, 2, 3, 17, 64, 65, 130}, 101);
}

TEST(GdnConv, Prefill) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<int> lens = kLens;
  lens.insert(lens.begin() + 2, {0, 3});
  conv_prefill_case(int(conv_dim(kSmall)), lens, 111);
  conv_prefill_case(int(conv_dim(kReal)), lens, 121);
}

// C not a multiple of 8: the scalar prefill kernel (the others take the vectorised one).
TEST(GdnConv, PrefillScalarSmall) {
  MOEFOLD_REQUIRE_GPU();
  conv_prefill_case(100, {1, 0, 2, 3, 17, 64, 65, 130}, 131);
}

TEST(GdnConv, DecodeSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17}) conv_decode_case(int(conv_dim(kSmall)), b, 131 + uint64_t(b));
}

TEST(GdnConv, Decode) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17, 64}) {
    conv_decode_case(int(conv_dim(kSmall)), b, 141 + uint64_t(b));
    conv_decode_case(int(conv_dim(kReal)), b, 151 + uint64_t(b));
  }
}

TEST(GdnPrefill, BatchSmall) {
  MOEFOLD_REQUIRE_GPU();
  prefill_case(kSmall, {65, 1, 0, 17, 130, 64, 3}, 201);
}

TEST(GdnPrefill, SingleSequenceLengths) {
  MOEFOLD_REQUIRE_GPU();
  for (int T : kLens) prefill_case(kSmall, {T}, 211 + uint64_t(T));
  for (int T : {1, 64, 65, 1000}) prefill_case(kReal, {T}, 221 + uint64_t(T));
}

TEST(GdnPrefill, BatchAllLengths) {
  MOEFOLD_REQUIRE_GPU();
  std::vector<int> lens = kLens;
  lens.insert(lens.begin() + 3, 0);
  prefill_case(kSmall, lens, 231);
  prefill_case(kReal, lens, 241);
}

TEST(GdnPrefill, ChunkedEqualsRecurrentSmall) {
  MOEFOLD_REQUIRE_GPU();
  chunked_vs_recurrent_case(kSmall, 130, 301);
}

TEST(GdnPrefill, ChunkedEqualsRecurrent) {
  MOEFOLD_REQUIRE_GPU();
  chunked_vs_recurrent_case(kSmall, 1000, 311);
  chunked_vs_recurrent_case(kReal, 200, 321);
}

TEST(GdnPrefill, SplitEqualsWholeSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (int n : {1, 64, 65}) split_case(kSmall, 130, n, 401 + uint64_t(n));
}

TEST(GdnPrefill, SplitEqualsWhole) {
  MOEFOLD_REQUIRE_GPU();
  for (int n : {1, 63, 64, 65}) {
    split_case(kSmall, 200, n, 411 + uint64_t(n));
    split_case(kReal, 200, n, 421 + uint64_t(n));
  }
}

TEST(GdnPrefill, SnapshotsSmall) {
  MOEFOLD_REQUIRE_GPU();
  snapshot_case(kSmall, 200, 130, 501);
}

TEST(GdnPrefill, Snapshots) {
  MOEFOLD_REQUIRE_GPU();
  snapshot_case(kSmall, 1000, 65, 511);
  snapshot_case(kReal, 200, 130, 521);
}

TEST(GdnDecode, BatchesSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17}) decode_case(kSmall, b, 601 + uint64_t(b));
}

TEST(GdnDecode, Batches) {
  MOEFOLD_REQUIRE_GPU();
  for (int b : {1, 17, 64}) {
    decode_case(kSmall, b, 611 + uint64_t(b));
    decode_case(kReal, b, 621 + uint64_t(b));
  }
}

// Bucket 16 at 1, 2, 3, 7, 15, 16, 3 and bucket 128 at 1, 9, 33, 64, 113, 114, 127, 128, 2 (the decode
// graphs' buckets replayed at changing live counts), every kernel variant, the 35B shape and small ones.
TEST(GdnDecode, LiveCountsAllVariantsSmall) {
  MOEFOLD_REQUIRE_GPU();
  decode_live_case(kSmall, 16, {1, 2, 3, 7, 15, 16, 3}, 641);
  decode_live_case(GdnDims{2, 4, 32, 16}, 5, {5, 1}, 643);
}
TEST(GdnDecode, LiveCountsAllVariants) {
  MOEFOLD_REQUIRE_GPU();
  decode_live_case(kReal, 16, {1, 2, 3, 7, 15, 16, 3}, 651);
  // Bucket 128 with the 35B head sizes but 4 value heads (the grid's head axis does not change the paths;
  // the pool stays small enough to compare on the host).
  decode_live_case(GdnDims{2, 4, 128, 128}, 128, {1, 9, 33, 64, 113, 114, 127, 128, 2}, 652);
  decode_live_case(GdnDims{1, 2, 256, 64}, 7, {7, 2}, 653);  // dk 256: 32 rows a warp
  decode_live_case(GdnDims{2, 4, 128, 64}, 9, {9, 4}, 654);  // dv 64: 4 columns a lane do not fit
}

// The tensor-core prefill path (dk 128; the split chunk kernel + state pass, as args.max_rows is set) on a
// small shape: batches with 0/1-token sequences, a split, snapshots and chunked == recurrent (the
// compute-sanitizer pass of those kernels).
TEST(GdnPrefill, TensorCoreSmall) {
  MOEFOLD_REQUIRE_GPU();
  prefill_case(kTc, {65, 1, 0, 17, 130, 64, 3}, 251);
  split_case(kTc, 130, 65, 451);
  snapshot_case(kTc, 200, 130, 551);
  chunked_vs_recurrent_case(kTc, 130, 331);
}

/// Sets an environment variable for its lifetime (kernel variant switches read at each launch).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

// Every variant of the tensor-core prefill (the split path and the fused kernel, each with 16 or 32 value
// columns per block and one or two input stages; the fused one's long k loops rolled or unrolled; the
// launcher picks by shape, env variables force): same contract. dv = 16 takes the 16-column blocks by itself.
TEST(GdnPrefill, TensorCoreVariantsSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (const char* split : {"1", "0"})
    for (const char* bv : {"16", "32"})
      for (const char* st : {"1", "2"}) {
        ScopedEnv e0("MOEFOLD_GDN_TC_SPLIT", split), e1("MOEFOLD_GDN_TC_BV", bv), e2("MOEFOLD_GDN_TC_STAGES", st);
        prefill_case(kTc, {65, 1, 0, 130}, 281);
      }
  {
    ScopedEnv e0("MOEFOLD_GDN_TC_SPLIT", "0"), e("MOEFOLD_GDN_TC_UNROLL", "1");  // the rolled 32-column variant
    prefill_case(kTc, {65, 1, 0, 130}, 285);
  }
  {
    ScopedEnv e("MOEFOLD_GDN_TC_CHUNK_BLOCKS", "3");  // the chunk kernel's 3-blocks-per-SM register budget
    prefill_case(kTc, {65, 1, 0, 130}, 287);
  }
  {
    ScopedEnv e("MOEFOLD_GDN_TC_GROUP", "1");  // one value head per chunk-kernel block
    prefill_case(GdnDims{1, 2, 128, 32}, {65, 1, 0, 130}, 289);
  }
  prefill_case(GdnDims{1, 2, 128, 16}, {65, 1, 0, 130}, 291);
  chunked_vs_recurrent_case(GdnDims{1, 2, 128, 48}, 130, 341);
}

// The split path in windows of 1 and 3 global chunks (chunk kernel + state pass per window, the state
// carried through its slot, snapshots taken in later windows).
TEST(GdnPrefill, TensorCoreWindowsSmall) {
  MOEFOLD_REQUIRE_GPU();
  for (const char* w : {"1", "3"}) {
    ScopedEnv e("MOEFOLD_GDN_TC_WINDOW", w);
    prefill_case(kTc, {65, 1, 0, 17, 130, 64, 3}, 252);
    snapshot_case(kTc, 200, 130, 552);
  }
}

// The fused tensor-core kernel (the path when the row bound is unknown or the scratch cannot grow): the
// same contract.
TEST(GdnPrefill, TensorCoreFusedSmall) {
  MOEFOLD_REQUIRE_GPU();
  ScopedEnv e("MOEFOLD_GDN_TC_SPLIT", "0");
  prefill_case(kTc, {65, 1, 0, 17, 130, 64, 3}, 253);
  split_case(kTc, 130, 65, 453);
  snapshot_case(kTc, 200, 130, 553);
}

// The scalar prefill kernel stays the path for shapes the tensor-core one does not cover; keep it tested on
// the real shape too.
TEST(GdnPrefill, ScalarKernelReal) {
  MOEFOLD_REQUIRE_GPU();
  ScopedEnv scalar("MOEFOLD_GDN_TC", "0");
  prefill_case(kReal, {65, 1, 0, 130}, 261);
  prefill_case(kTc, {65, 1, 0, 130}, 271);
}

// Timings of the real shape (not a contract; run with --gtest_also_run_disabled_tests): median of 20
// launches after 3 warm-ups, CUDA events, inputs random.
template <class F>
double median_us(F&& f) {
  cudaEvent_t a, b;
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
  MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    MOEFOLD_CUDA_CHECK(cudaEventRecord(a));
    f();
    MOEFOLD_CUDA_CHECK(cudaEventRecord(b));
    MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

TEST(GdnPerf, DISABLED_Timing) {
  MOEFOLD_REQUIRE_GPU();
  const GdnDims d = kReal;
  const int C = int(conv_dim(d));
  for (auto [S, len] : {std::pair{1, 4096}, std::pair{8, 512}, std::pair{64, 1}, std::pair{1, 1}}) {
    const int rows = S * len;
    const Problem P(d, rows, 901);
    const int64_t se = P.state_elems();
    std::vector<int32_t> slots(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) slots[size_t(s)] = s;
    DevProblem dp(P);
    Dev<float> dpool(make_pool(S, se, slots, 902));
    Dev<uint16_t> dout(size_t(rows * P.out_row())), dy(size_t(rows) * C), dconv(size_t(S) * C * (kConvK - 1)),
        dw(to_bf16(moefold::test::randn(size_t(C) * kConvK, 903, 0.5f)));
    dconv.poison();
    MOEFOLD_CUDA_CHECK(cudaMemset(dconv.p, 0, dconv.n * 2));
    Dev<int32_t> dcu(cu_of(std::vector<int>(size_t(S), len))), dslots(slots), dns(std::vector<int32_t>{S});
    const auto args = dp.args(0, dpool.p, dslots.p, dns.p, dout.p);
    const double conv_us = median_us([&] {
      moefold::cuda::causal_conv1d_silu_prefill(dp.qkv.bf(), dw.bf(), dcu.p, dslots.p, dns.p, rows, dconv.bf(), dy.bf(),
                                                C, kConvK, nullptr);
    });
    const double pre_us = median_us(
        [&] { moefold::cuda::gdn_chunked_prefill(args, dcu.p, S, nullptr, nullptr, 0, d, nullptr); });
    double dec_us = 0, cdec_us = 0;
    if (len == 1) {
      dec_us = median_us([&] { moefold::cuda::gdn_recurrent_decode(args, S, d, nullptr); });
      cdec_us = median_us([&] {
        moefold::cuda::causal_conv1d_silu_decode(dp.qkv.bf(), dw.bf(), dslots.p, dns.p, S, dconv.bf(), dy.bf(), C,
                                                 kConvK, nullptr);
      });
    }
    std::printf("TIMING %s seqs=%d len=%d conv_prefill_us=%.1f gdn_prefill_us=%.1f gdn_decode_us=%.1f "
                "conv_decode_us=%.1f\n",
                dims_str(d).c_str(), S, len, conv_us, pre_us, dec_us, cdec_us);
  }
}

// The decode step at the 35B shape (Hk 16, Hv 32, dk = dv = 128: 2 MiB of fp32 state per sequence) for
// 1 .. 256 sequences: the former kernel (A) against the automatic choice (B) in the order A B B A, then
// every variant once. Each timing: a CUDA graph of R launches over R disjoint sets of state slots (R *
// batch * 2 MiB >= 256 MiB, so the states come from HBM, not the L2), median of 20 replays / R. The
// floor: the state read and written once (batch * 4 MiB) at the device-to-device copy rate (read + write)
// measured first in this binary.
TEST(GdnPerf, DISABLED_DecodeVariants) {
  MOEFOLD_REQUIRE_GPU();
  const GdnDims d = kReal;
  cudaStream_t st;
  MOEFOLD_CUDA_CHECK(cudaStreamCreate(&st));
  auto graph_us = [&](cudaGraphExec_t ex, int per) {
    for (int i = 0; i < 3; ++i) MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ex, st));
    cudaEvent_t a, b;
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
      MOEFOLD_CUDA_CHECK(cudaGraphLaunch(ex, st));
      MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
      MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return 1e3 * double(ms[ms.size() / 2]) / per;
  };
  auto capture = [&](const std::function<void()>& body) {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    MOEFOLD_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    MOEFOLD_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    MOEFOLD_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
    MOEFOLD_CUDA_CHECK(cudaGraphDestroy(g));
    return ex;
  };
  const size_t copy_bytes = size_t(1) << 30;
  float *ca = nullptr, *cb = nullptr;
  MOEFOLD_CUDA_CHECK(cudaMalloc(&ca, copy_bytes));
  MOEFOLD_CUDA_CHECK(cudaMalloc(&cb, copy_bytes));
  // The copy on the stream (not a graph node, which runs on the copy engines at ~2.7 TB/s on the H200):
  // the profiler's roofline method, bytes read + written.
  std::vector<float> cms;
  {
    cudaEvent_t a, b;
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&a));
    MOEFOLD_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 12; ++i) {
      MOEFOLD_CUDA_CHECK(cudaEventRecord(a, st));
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, st));
      MOEFOLD_CUDA_CHECK(cudaEventRecord(b, st));
      MOEFOLD_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      MOEFOLD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      if (i >= 2) cms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  std::sort(cms.begin(), cms.end());
  const double copy_gbs = 2.0 * double(copy_bytes) / (double(cms[cms.size() / 2]) * 1e-3) / 1e9;
  cudaFree(ca);
  cudaFree(cb);
  moefold::test::perf_line("device_copy", "bytes=1GiB", 2.0 * double(copy_bytes) / copy_gbs / 1e3,
                           "GB/s=" + std::to_string(int(copy_gbs)));
  const int64_t se = int64_t(d.num_v_heads) * d.k_dim * d.v_dim;
  for (int S : {1, 2, 8, 16, 64, 256}) {
    const int R = std::max(1, int((int64_t(256) << 20) / (int64_t(S) * se * 4)));
    const Problem P(d, S, 961);
    DevProblem dp(P);
    Dev<float> dpool(size_t(int64_t(R) * S * se));
    MOEFOLD_CUDA_CHECK(cudaMemset(dpool.p, 0, dpool.n * sizeof(float)));
    std::vector<std::unique_ptr<Dev<int32_t>>> dslots;
    for (int r = 0; r < R; ++r) {
      std::vector<int32_t> sl(static_cast<size_t>(S));
      for (int s = 0; s < S; ++s) sl[size_t(s)] = r * S + s;
      dslots.push_back(std::make_unique<Dev<int32_t>>(sl));
    }
    Dev<int32_t> dns(std::vector<int32_t>{S});
    Dev<uint16_t> dout(size_t(S * P.out_row()));
    const double floor_us = double(S) * se * 4 * 2 / copy_gbs / 1e3;
    const int autov = moefold::cuda::detail::gdn_decode_auto_cols(S, d);
    std::vector<std::pair<int, std::string>> runs{{0, "A"}, {-1, "B"}, {-1, "B"}, {0, "A"}, {1, ""}, {2, ""}, {4, ""}};
    for (const auto& [v, tag] : runs) {
      cudaGraphExec_t ex = capture([&] {
        for (int r = 0; r < R; ++r)
          moefold::cuda::detail::gdn_recurrent_decode_variant(dp.args(0, dpool.p, dslots[size_t(r)]->p, dns.p, dout.p), S,
                                                              d, v, st);
      });
      const double us = graph_us(ex, R);
      cudaGraphExecDestroy(ex);
      const std::string name = v == 0 ? "gdn_decode:former" : (v < 0 ? "gdn_decode:auto" : "gdn_decode:cpl" + std::to_string(v));
      char shp[128], met[128];
      std::snprintf(shp, sizeof shp, "%s,seqs=%d,launches=%d%s%s,auto_cpl=%d", dims_str(d).c_str(), S, R,
                    tag.empty() ? "" : ",", tag.c_str(), autov);
      std::snprintf(met, sizeof met, "GB/s=%.0f copy_frac=%.2f floor_us=%.2f",
                    double(S) * se * 8 / (us * 1e-6) / 1e9, floor_us / us, floor_us);
      moefold::test::perf_line(name, shp, us, met);
    }
  }
  MOEFOLD_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(GdnArgs, RejectsBadShapes) {
  // Host-side argument checks run before any CUDA call: no GPU needed.
  GdnArgs a{};
  EXPECT_THROW(moefold::cuda::gdn_recurrent_decode(a, 1, kSmall, nullptr), moefold::Error);
  EXPECT_THROW(moefold::cuda::causal_conv1d_silu_decode(nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr, 8, 4,
                                                        nullptr),
               moefold::Error);
}

// The fixture shapes: qwen3_5_moe_text has dk 32 != dv 16 (dv below one 32-column value tile), and
// qwen3_5_moe / qwen3_next dk 16, dv 32.
TEST(GdnPrefill, FixtureShapes) {
  MOEFOLD_REQUIRE_GPU();
  for (const GdnDims d : {GdnDims{2, 4, 32, 16}, GdnDims{2, 4, 16, 32}}) {
    prefill_case(d, {1, 2, 63, 65, 130}, 901);
    for (int T : {1, 2, 65}) prefill_case(d, {T}, 911 + uint64_t(T));
    chunked_vs_recurrent_case(d, 130, 921);
    decode_case(d, 3, 931);
  }
}
