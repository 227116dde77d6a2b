// Shared helpers of the gated_delta_net_test binary (tests/cuda/gated_delta_net_test/*.cu, one
// GoogleTest binary of several files: conv_test.cc, prefill_test.cc, decode_test.cc, perf_test.cc).
//
// Contract tests of the CUDA Gated DeltaNet kernels (causal_conv1d.h, gated_delta_net.h) against the CPU
// references in src/ops/cpu/gated_delta_net.h, on random bf16 inputs (converted to fp32 for the CPU) and
// random non-zero initial states. Outputs and unused state slots are poisoned (NaN bytes) before each run;
// padding rows / slots must stay byte-identical, and live rows must equal an unpadded run's. Tests named
// *Small use the small shape (Hk=2, Hv=4, dk=dv=32) and short sequences: the compute-sanitizer pass.
#pragma once

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

namespace gdn_test {

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

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

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

inline std::string dims_str(const GdnDims& d) {
  return "Hk=" + std::to_string(d.num_k_heads) + ",Hv=" + std::to_string(d.num_v_heads) +
         ",dk=" + std::to_string(d.k_dim) + ",dv=" + std::to_string(d.v_dim);
}
inline std::string lens_str(const std::vector<int>& lens) {
  std::string s;
  for (size_t i = 0; i < lens.size(); ++i) {  // (not `(i ? "+" : "") + ...`: GCC 12 warns -Wrestrict on it)
    if (i) s += '+';
    s += std::to_string(lens[i]);
  }
  return s;
}

inline std::vector<int32_t> cu_of(const std::vector<int>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

/// cu_seqlens of capacity cap (>= live): padding entries point past the live rows (never data).
inline std::vector<int32_t> cu_padded(const std::vector<int>& lens, int cap, int cap_rows) {
  auto cu = cu_of(lens);
  const int rows = cu.back();
  for (int s = int(lens.size()) + 1; s <= cap; ++s) cu.push_back(std::min(cap_rows, rows + 2 * (s - int(lens.size()))));
  return cu;
}

inline int64_t conv_dim(const GdnDims& d) { return 2LL * d.num_k_heads * d.k_dim + int64_t(d.num_v_heads) * d.v_dim; }

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
inline std::vector<float> make_pool(int64_t nslots, int64_t elems, const std::vector<int32_t>& used, uint64_t seed) {
  std::vector<float> pool(size_t(nslots * elems));
  std::memset(pool.data(), 0xFF, pool.size() * sizeof(float));
  for (size_t i = 0; i < used.size(); ++i) {
    auto r = moefold::test::randn(size_t(elems), seed + 17 * i, 0.5f);
    std::copy(r.begin(), r.end(), pool.begin() + used[i] * elems);
  }
  return pool;
}


/// Sets an environment variable for its lifetime (kernel variant switches read at each launch).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

inline const std::vector<int> kLens{1, 2, 17, 63, 64, 65, 127, 1000, 4100};

/// Recurrent decode of `live` sequences in capacity live+3 against one CPU step per sequence (decode_test.cc).
void decode_case(const GdnDims& d, int live, uint64_t seed);

}  // namespace gdn_test
