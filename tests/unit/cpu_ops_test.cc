// Every CPU op against an independent fp64 implementation on random inputs at awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/gated_delta_net.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/norm.h"
#include "ops/cpu/rope.h"
#include "test_util.h"

using namespace moefold;
using namespace moefold::cpu;
using moefold::test::poisoned;
using moefold::test::randn;
using moefold::test::rel_err;

constexpr double kTol = 1e-5;  // fp32 math against fp64

TEST(CpuOps, LinearMatchesFp64) {
  for (int64_t T : {1, 2, 17, 65}) {
    const int64_t in = 63, out = 129;
    auto x = randn(T * in, 1), w = randn(out * in, 2, 0.1f), b = randn(out, 3);
    auto y = poisoned(T * out);
    linear(x.data(), w.data(), b.data(), y.data(), T, in, out);
    std::vector<double> ref(T * out);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = b[o];
        for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
        ref[t * out + o] = s;
      }
    EXPECT_LT(rel_err(y, ref), kTol) << "T=" << T;
  }
}

// A row's bits must not depend on its place in the batch: the same row at every position of a 16-row
// tile, and in the zero-padded tail, beside other random rows, at shapes where OpenBLAS's Haswell / Zen
// sgemm kernels round an M-operand row by its position (the reason X goes in as the B operand).
TEST(CpuOps, LinearRowBitsIndependentOfPositionAndNeighbours) {
  for (auto [in, out] : {std::pair<int64_t, int64_t>{64, 256}, {576, 1536}, {1536, 1000}, {63, 129}}) {
    const auto w = randn(out * in, 5, 0.1f), row = randn(in, 6);
    std::vector<float> alone(static_cast<size_t>(out));
    linear(row.data(), w.data(), nullptr, alone.data(), 1, in, out);
    for (int64_t T : {2, 16, 23, 40}) {
      for (int64_t p : {int64_t(1), T / 2, T - 1}) {
        auto x = randn(T * in, 7 + uint64_t(T * 100 + p));
        std::copy(row.begin(), row.end(), x.begin() + p * in);
        auto y = poisoned(T * out);
        linear(x.data(), w.data(), nullptr, y.data(), T, in, out);
        EXPECT_EQ(0, std::memcmp(alone.data(), y.data() + p * out, size_t(out) * sizeof(float)))
            << "in=" << in << " out=" << out << " T=" << T << " row " << p;
      }
    }
  }
}

TEST(CpuOps, RmsNormVariantsMatchFp64) {
  for (int64_t rows : {1, 17, 64}) {
    const int64_t dim = 77;
    auto x = randn(rows * dim, 4, 3.0f), w = randn(dim, 5, 0.2f), z = randn(rows * dim, 6);
    for (auto kind : {NormKind::Plain, NormKind::ZeroCentred}) {
      auto y = poisoned(rows * dim);
      rms_norm(x.data(), w.data(), y.data(), rows, dim, 1e-6f, kind);
      std::vector<double> ref(rows * dim);
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
        double inv = 1 / std::sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; ++i)
          ref[r * dim + i] = x[r * dim + i] * inv * (kind == NormKind::ZeroCentred ? 1.0 + w[i] : double(w[i]));
      }
      EXPECT_LT(rel_err(y, ref), kTol);
    }
    auto y = poisoned(rows * dim);
    gated_rms_norm(x.data(), z.data(), w.data(), y.data(), rows, dim, 1e-6f);
    std::vector<double> ref(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      double inv = 1 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i) {
        double zz = z[r * dim + i];
        ref[r * dim + i] = w[i] * x[r * dim + i] * inv * zz / (1 + std::exp(-zz));
      }
    }
    EXPECT_LT(rel_err(y, ref), kTol);
  }
}

TEST(CpuOps, PartialRopeMatchesFp64AndLeavesTailAlone) {
  const int64_t T = 65, heads = 3, D = 32, R = 8;
  auto x = randn(T * heads * D, 7);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(t * 37 % 1000);
  auto inv = rope_inv_freq(R, 1e7);
  auto y = x;
  apply_rope(y.data(), pos.data(), T, heads, D, R, inv.data());
  std::vector<double> ref(x.begin(), x.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < R / 2; ++j) {
        double f = std::pow(1e7, -2.0 * j / R), a = pos[t] * f;
        size_t lo = (t * heads + h) * D + j, hi = lo + R / 2;
        ref[lo] = x[lo] * std::cos(a) - x[hi] * std::sin(a);
        ref[hi] = x[hi] * std::cos(a) + x[lo] * std::sin(a);
      }
  EXPECT_LT(rel_err(y, ref), kTol);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = R; d < D; ++d) EXPECT_EQ(y[t * heads * D + d], x[t * heads * D + d]);
}

TEST(CpuOps, PagedAttentionMatchesDenseCausalFp64) {
  // Two pieces of one sequence (start 0 then start 37) over scattered pages.
  const int64_t Hq = 4, Hkv = 2, D = 24, bs = 16, total = 70;
  const int64_t kv_dim = Hkv * D;
  std::vector<int32_t> table = {5, 0, 3, 7, 1};
  auto q = randn(total * Hq * D, 8), k = randn(total * kv_dim, 9), v = randn(total * kv_dim, 10);
  std::vector<float> kc(8 * bs * kv_dim, NAN), vc(8 * bs * kv_dim, NAN);
  auto out = poisoned(total * Hq * D);
  const float scale = 1.0f / std::sqrt(float(D));
  for (auto [start, n] : {std::pair<int64_t, int64_t>{0, 37}, {37, 33}}) {
    kv_cache_write(&k[start * kv_dim], &v[start * kv_dim], kc.data(), vc.data(), table.data(), start, n, bs, kv_dim);
    paged_attention(&q[start * Hq * D], kc.data(), vc.data(), table.data(), start, n, Hq, Hkv, D, bs, scale,
                    &out[start * Hq * D]);
  }
  std::vector<double> ref(total * Hq * D);
  for (int64_t i = 0; i < total; ++i)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      std::vector<double> s(i + 1);
      double m = -1e300, den = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += double(q[(i * Hq + h) * D + d]) * k[j * kv_dim + g * D + d];
        s[j] = acc * scale;
        m = std::max(m, s[j]);
      }
      for (auto& e : s) den += (e = std::exp(e - m));
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += s[j] / den * v[j * kv_dim + g * D + d];
        ref[(i * Hq + h) * D + d] = acc;
      }
    }
  EXPECT_LT(rel_err(out, ref), kTol);
}

// fp64 reference of the delta rule, written from the recurrence S = a (I - b k k^T) S + b k v^T, o = S^T q.
static std::vector<double> delta_rule_fp64(const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<float>& v, const std::vector<float>& g,
                                           const std::vector<float>& beta, std::vector<double>& S, int64_t T,
                                           const GdnShape& s) {
  const int64_t dk = s.k_dim, dv = s.v_dim, Hv = s.num_v_heads, r = Hv / s.num_k_heads;
  std::vector<double> out(T * Hv * dv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      std::vector<double> qn(dk), kn(dk);
      double sq = 0, sk = 0;
      for (int64_t i = 0; i < dk; ++i) {
        qn[i] = q[(t * s.num_k_heads + h / r) * dk + i];
        kn[i] = k[(t * s.num_k_heads + h / r) * dk + i];
        sq += qn[i] * qn[i];
        sk += kn[i] * kn[i];
      }
      for (int64_t i = 0; i < dk; ++i) {
        qn[i] /= std::sqrt(sq + 1e-6) * std::sqrt(double(dk));
        kn[i] /= std::sqrt(sk + 1e-6);
      }
      double a = std::exp(double(g[t * Hv + h])), b = beta[t * Hv + h];
      double* Sh = &S[h * dk * dv];
      // S' = a S - a b k (k^T S) + b k v^T
      std::vector<double> kS(dv, 0);
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) kS[j] += kn[i] * Sh[i * dv + j];
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j)
          Sh[i * dv + j] = a * Sh[i * dv + j] - a * b * kn[i] * kS[j] + b * kn[i] * v[(t * Hv + h) * dv + j];
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += Sh[i * dv + j] * qn[i];
        out[(t * Hv + h) * dv + j] = o;
      }
    }
  return out;
}

struct GdnInputs {
  std::vector<float> q, k, v, g, beta, state;
};
static GdnInputs gdn_inputs(int64_t T, const GdnShape& s, uint64_t seed) {
  GdnInputs in;
  in.q = randn(T * s.num_k_heads * s.k_dim, seed);
  in.k = randn(T * s.num_k_heads * s.k_dim, seed + 1);
  in.v = randn(T * s.num_v_heads * s.v_dim, seed + 2);
  in.g = moefold::test::uniform(T * s.num_v_heads, seed + 3, -1.2f, -0.01f);
  in.beta = moefold::test::uniform(T * s.num_v_heads, seed + 4, 0.05f, 0.95f);
  in.state = randn(s.num_v_heads * s.k_dim * s.v_dim, seed + 5, 0.3f);
  return in;
}

TEST(CpuOps, DeltaRuleRecurrentAndChunkedMatchFp64) {
  const GdnShape s{2, 4, 16, 24};
  for (int64_t T : {1, 2, 63, 64, 65, 130}) {
    auto in = gdn_inputs(T, s, 100 + T);
    std::vector<double> S64(in.state.begin(), in.state.end());
    auto ref = delta_rule_fp64(in.q, in.k, in.v, in.g, in.beta, S64, T, s);
    auto st_rec = in.state, st_chk = in.state;
    auto o_rec = poisoned(T * s.num_v_heads * s.v_dim), o_chk = o_rec;
    gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), st_rec.data(),
                               o_rec.data(), T, s);
    gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), st_chk.data(),
                             o_chk.data(), T, s);
    EXPECT_LT(rel_err(o_rec, ref), kTol) << "recurrent T=" << T;
    EXPECT_LT(rel_err(o_chk, ref), 1e-4) << "chunked T=" << T;
    EXPECT_LT(rel_err(st_rec, S64), kTol) << "recurrent state T=" << T;
    EXPECT_LT(rel_err(st_chk, S64), 1e-4) << "chunked state T=" << T;
    EXPECT_LT(rel_err(o_chk, o_rec), 1e-4) << "chunked vs recurrent T=" << T;
  }
}

TEST(CpuOps, ChunkedDeltaRuleSplitEqualsWhole) {
  const GdnShape s{2, 4, 16, 16};
  const int64_t T = 130;
  auto in = gdn_inputs(T, s, 7);
  auto st_whole = in.state;
  auto o_whole = poisoned(T * s.num_v_heads * s.v_dim);
  gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), st_whole.data(),
                           o_whole.data(), T, s);
  for (int64_t split : {1, 63, 64, 65}) {
    auto st = in.state;
    auto o = poisoned(T * s.num_v_heads * s.v_dim);
    const int64_t kq = s.num_k_heads * s.k_dim, vv = s.num_v_heads * s.v_dim, hv = s.num_v_heads;
    gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), st.data(), o.data(),
                             split, s);
    gated_delta_rule_chunked(&in.q[split * kq], &in.k[split * kq], &in.v[split * vv], &in.g[split * hv],
                             &in.beta[split * hv], st.data(), &o[split * vv], T - split, s);
    EXPECT_LT(rel_err(o, o_whole), 1e-5) << "split " << split;
    EXPECT_LT(rel_err(st, st_whole), 1e-5) << "split " << split;
  }
}

TEST(CpuOps, ConvStateCarriedAcrossSplitEqualsWholeAndFp64) {
  const int64_t C = 40, K = 4, T = 70;
  auto x = randn(T * C, 11), w = randn(C * K, 12, 0.5f);
  std::vector<float> st0(C * (K - 1), 0.0f), y_whole = poisoned(T * C);
  auto st_whole = st0;
  causal_conv1d_silu(x.data(), w.data(), st_whole.data(), y_whole.data(), T, C, K);
  std::vector<double> ref(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += double(w[c * K + j]) * x[src * C + c];
      }
      ref[t * C + c] = acc / (1 + std::exp(-acc));
    }
  EXPECT_LT(rel_err(y_whole, ref), kTol);
  for (int64_t split : {1, 2, 3, 63}) {
    auto st = st0;
    auto y = poisoned(T * C);
    causal_conv1d_silu(x.data(), w.data(), st.data(), y.data(), split, C, K);
    for (int64_t t = split; t < T; ++t)  // the rest one token at a time, as decode does
      causal_conv1d_silu(&x[t * C], w.data(), st.data(), &y[t * C], 1, C, K);
    EXPECT_EQ(y, y_whole) << "split " << split;
    EXPECT_EQ(st, st_whole) << "split " << split;
  }
}

TEST(CpuOps, GatingMatchesDefinition) {
  const int64_t T = 17, Hv = 5;
  auto a = randn(T * Hv, 13, 3.0f), b = randn(T * Hv, 14, 3.0f), A_log = randn(Hv, 15), dt = randn(Hv, 16);
  a[3] = 40.0f;  // softplus threshold branch
  auto g = poisoned(T * Hv), beta = poisoned(T * Hv);
  gdn_gating(a.data(), b.data(), A_log.data(), dt.data(), g.data(), beta.data(), T, Hv);
  std::vector<double> gr(T * Hv), br(T * Hv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      double u = double(a[t * Hv + h]) + dt[h];
      gr[t * Hv + h] = -std::exp(double(A_log[h])) * std::log1p(std::exp(u));
      br[t * Hv + h] = 1 / (1 + std::exp(-double(b[t * Hv + h])));
    }
  EXPECT_LT(rel_err(g, gr), kTol);
  EXPECT_LT(rel_err(beta, br), kTol);
}

TEST(CpuOps, RouterTopkTiesNegativesNaNAndExpertZero) {
  const int64_t E = 6, k = 3;
  // Row 0: all negative, expert 0 best. Row 1: exact ties -> lower index first. Row 2: NaN never picked.
  std::vector<float> logits = {-0.5f, -3.f, -2.f, -1.f, -4.f, -0.9f,  //
                               1.f,   2.f,  2.f,  2.f,  0.f,  -1.f,   //
                               NAN,   0.f,  5.f,  NAN,  1.f,  -2.f};
  std::vector<int32_t> ids(3 * k, -1);
  std::vector<float> w(3 * k, NAN);
  router_topk(logits.data(), 3, E, k, true, ids.data(), w.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 3), (std::vector<int32_t>{0, 5, 3}));
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 3, ids.begin() + 6), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 6, ids.end()), (std::vector<int32_t>{2, 4, 1}));
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int j = 0; j < k; ++j) s += w[r * k + j];
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
  // Without renormalisation the weights are the softmax probabilities (fp64 check).
  router_topk(logits.data(), 1, E, k, false, ids.data(), w.data());
  double den = 0;
  for (int e = 0; e < E; ++e) den += std::exp(double(logits[e]) + 0.5);
  EXPECT_NEAR(w[0], std::exp(0.0) / den, 1e-7);
}

TEST(CpuOps, RouterReplayUsesGivenExpertsWithSoftmaxWeights) {
  const int64_t T = 5, E = 16, k = 4;
  auto logits = test::randn(T * E, 11);
  std::vector<int32_t> ids(T * k), ids2(T * k);
  std::vector<float> w(T * k), w2(T * k, NAN);
  // Replaying the router's own choice reproduces it bit for bit.
  router_topk(logits.data(), T, E, k, true, ids.data(), w.data());
  router_topk(logits.data(), T, E, k, true, ids2.data(), w2.data(), ids.data());
  EXPECT_EQ(ids2, ids);
  EXPECT_EQ(w2, w);
  // Any other experts: their softmax probabilities (fp64 check), in the replayed slot order.
  std::vector<int32_t> replay(T * k);
  for (int64_t i = 0; i < T * k; ++i) replay[size_t(i)] = int32_t((i * 7 + 3) % E);
  for (bool renorm : {false, true}) {
    router_topk(logits.data(), T, E, k, renorm, ids2.data(), w2.data(), replay.data());
    EXPECT_EQ(ids2, replay);
    for (int64_t t = 0; t < T; ++t) {
      double mx = -1e30, den = 0, sum = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(logits[size_t(t * E + e)]));
      for (int64_t e = 0; e < E; ++e) den += std::exp(double(logits[size_t(t * E + e)]) - mx);
      for (int64_t s = 0; s < k; ++s) sum += std::exp(double(logits[size_t(t * E + replay[size_t(t * k + s)])]) - mx) / den;
      for (int64_t s = 0; s < k; ++s) {
        const double p = std::exp(double(logits[size_t(t * E + replay[size_t(t * k + s)])]) - mx) / den;
        EXPECT_NEAR(w2[size_t(t * k + s)], renorm ? p / sum : p, 1e-6) << "row " << t << " slot " << s;
      }
    }
  }
  replay[7] = int32_t(E);
  EXPECT_THROW(router_topk(logits.data(), T, E, k, true, ids2.data(), w2.data(), replay.data()), Error);
}

TEST(CpuOps, MoePlanCoversEveryPairOnce) {
  const int64_t T = 113, k = 8, E = 256;
  std::vector<int32_t> ids(T * k);
  for (int64_t i = 0; i < T * k; ++i) ids[i] = int32_t((i * 7919) % E);
  auto plan = moe_plan(ids.data(), T, k, E);
  ASSERT_EQ(plan.pairs.size(), size_t(T * k));
  auto sorted = plan.pairs;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(sorted[i], i);
  for (int64_t e = 0; e < E; ++e)
    for (int32_t p = plan.offsets[e]; p < plan.offsets[e + 1]; ++p) EXPECT_EQ(ids[plan.pairs[p]], e);
  ids[5] = int32_t(E);
  EXPECT_THROW(moe_plan(ids.data(), T, k, E), moefold::Error);
}

TEST(CpuOps, MoeExpertsMatchFp64) {
  for (auto [T, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 16, 4}, {17, 16, 4}, {64, 8, 2}}) {
    const int64_t H = 48, I = 20;
    auto x = randn(T * H, 20), gu = randn(E * 2 * I * H, 21, 0.2f), dn = randn(E * H * I, 22, 0.2f);
    auto logits = randn(T * E, 23, 2.0f);
    std::vector<int32_t> ids(T * k);
    std::vector<float> w(T * k);
    router_topk(logits.data(), T, E, k, true, ids.data(), w.data());
    std::vector<float> out(T * H, 0.0f);
    moe_experts(x.data(), gu.data(), dn.data(), ids.data(), w.data(), out.data(), T, H, I, E, k);
    std::vector<double> ref(T * H, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < k; ++s) {
        const int64_t e = ids[t * k + s];
        std::vector<double> act(I);
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t h = 0; h < H; ++h) {
            g += double(gu[(e * 2 * I + i) * H + h]) * x[t * H + h];
            u += double(gu[(e * 2 * I + I + i) * H + h]) * x[t * H + h];
          }
          act[i] = g / (1 + std::exp(-g)) * u;
        }
        for (int64_t h = 0; h < H; ++h) {
          double y = 0;
          for (int64_t i = 0; i < I; ++i) y += double(dn[(e * H + h) * I + i]) * act[i];
          ref[t * H + h] += w[t * k + s] * y;
        }
      }
    EXPECT_LT(rel_err(out, ref), kTol) << "T=" << T;
  }
}
