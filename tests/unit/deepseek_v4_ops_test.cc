// Every DeepSeek-V4 CPU op (src/ops/cpu/dsv4_*) against an independent fp64 implementation on random
// inputs at awkward sizes, plus the properties the equations promise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numeric>

#include "core/error.h"
#include "ops/cpu/dsv4_attention.h"
#include "ops/cpu/dsv4_mhc.h"
#include "ops/cpu/dsv4_moe.h"
#include "ops/cpu/dsv4_rope.h"
#include "test_util.h"

using namespace moefold;
using namespace moefold::cpu;
using moefold::test::poisoned;
using moefold::test::randn;
using moefold::test::rel_err;

namespace {
constexpr double kTol = 2e-5;
double sigmoid64(double x) { return 1 / (1 + std::exp(-x)); }
}  // namespace

TEST(Dsv4Ops, YarnInvFreqMatchesFp64Formula) {
  const int64_t rd = 64;
  const double base = 160000, factor = 16, bf = 32, bs = 1;
  const int64_t orig = 65536;
  auto got = dsv4_inv_freq(base, rd, factor, bf, bs, orig);
  auto cdim = [&](double r) { return rd * std::log(orig / (r * 2 * M_PI)) / (2 * std::log(base)); };
  const double lo = std::max(0.0, std::floor(cdim(bf))), hi = std::min(double(rd - 1), std::ceil(cdim(bs)));
  std::vector<double> ref(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double f = std::pow(base, -2.0 * i / rd), ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    ref[i] = f / factor * ramp + f * (1 - ramp);
  }
  EXPECT_LT(rel_err(got, ref), 1e-6);
  // Plain RoPE: no blending.
  auto plain = dsv4_inv_freq(10000, rd, 0, 0, 0, 0);
  for (int64_t i = 0; i < rd / 2; ++i) EXPECT_NEAR(plain[i], std::pow(10000.0, -2.0 * i / rd), 1e-6 * plain[i]);
}

TEST(Dsv4Ops, InterleavedRopeOnTrailingDimsMatchesComplexRotation) {
  const int64_t heads = 3, dim = 40, rd = 16;
  auto inv = dsv4_inv_freq(10000, rd, 0, 0, 0, 0);
  for (int64_t pos : {0, 7, 301}) {
    auto x = randn(heads * dim, 11 + pos), y = x;
    dsv4_rope_inplace(y.data(), heads, dim, rd, inv, pos);
    std::vector<double> ref(x.begin(), x.end());
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rd / 2; ++i) {
        const int64_t o = h * dim + dim - rd + 2 * i;
        std::complex<double> z(x[o], x[o + 1]), r = z * std::polar(1.0, double(pos) * inv[i]);
        ref[o] = r.real();
        ref[o + 1] = r.imag();
      }
    EXPECT_LT(rel_err(y, ref), kTol) << pos;
    dsv4_rope_inplace(y.data(), heads, dim, rd, inv, pos, -1);  // the inverse rotation undoes it
    EXPECT_LT(rel_err(y, x), kTol) << pos;
  }
}

TEST(Dsv4Ops, MhcMixExpandAndHeadMatchFp64) {
  const int64_t T = 5, hc = 4, H = 37, mix = (2 + hc) * hc, iters = 20;
  const float eps = 1e-6f, neps = 1e-6f;
  auto X = randn(T * hc * H, 1, 2.0f), fn = randn(mix * hc * H, 2, 0.1f), base = randn(mix, 3, 0.5f);
  std::vector<float> scale = {0.9f, 1.2f, 0.7f};
  auto pre = poisoned(T * hc), post = poisoned(T * hc), comb = poisoned(T * hc * hc), col = poisoned(T * H);
  mhc_mix(X.data(), fn.data(), base.data(), scale.data(), T, hc, H, iters, eps, neps, pre.data(), post.data(),
          comb.data(), col.data());
  std::vector<double> rpre(T * hc), rpost(T * hc), rcomb(T * hc * hc), rcol(T * H), m(mix);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data() + t * hc * H;
    double ss = 0;
    for (int64_t i = 0; i < hc * H; ++i) ss += double(x[i]) * x[i];
    const double r = 1 / std::sqrt(ss / double(hc * H) + neps);
    for (int64_t o = 0; o < mix; ++o) {
      double a = 0;
      for (int64_t i = 0; i < hc * H; ++i) a += double(fn[o * hc * H + i]) * x[i] * r;
      m[o] = a;
    }
    double c[4][4];
    for (int64_t j = 0; j < hc; ++j) {
      rpre[t * hc + j] = sigmoid64(m[j] * scale[0] + base[j]) + eps;
      rpost[t * hc + j] = 2 * sigmoid64(m[hc + j] * scale[1] + base[hc + j]);
      double mx = -1e300, s = 0;
      for (int64_t k = 0; k < hc; ++k) mx = std::max(mx, m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
      for (int64_t k = 0; k < hc; ++k) s += c[j][k] = std::exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - mx);
      for (int64_t k = 0; k < hc; ++k) c[j][k] = c[j][k] / s + eps;
    }
    for (int64_t it = 0; it < iters; ++it) {
      if (it > 0)
        for (int64_t j = 0; j < hc; ++j) {
          double s = 0;
          for (int64_t k = 0; k < hc; ++k) s += c[j][k];
          for (int64_t k = 0; k < hc; ++k) c[j][k] /= s + eps;
        }
      for (int64_t k = 0; k < hc; ++k) {
        double s = 0;
        for (int64_t j = 0; j < hc; ++j) s += c[j][k];
        for (int64_t j = 0; j < hc; ++j) c[j][k] /= s + eps;
      }
    }
    for (int64_t j = 0; j < hc; ++j)
      for (int64_t k = 0; k < hc; ++k) rcomb[(t * hc + j) * hc + k] = c[j][k];
    for (int64_t d = 0; d < H; ++d) {
      double s = 0;
      for (int64_t j = 0; j < hc; ++j) s += rpre[t * hc + j] * x[j * H + d];
      rcol[t * H + d] = s;
    }
  }
  EXPECT_LT(rel_err(pre, rpre), kTol);
  EXPECT_LT(rel_err(post, rpost), kTol);
  EXPECT_LT(rel_err(comb, rcomb), kTol);
  EXPECT_LT(rel_err(col, rcol), kTol);
  for (int64_t t = 0; t < T; ++t)  // Sinkhorn: every row and column sums to ~1
    for (int64_t j = 0; j < hc; ++j) {
      double rs = 0, cs = 0;
      for (int64_t k = 0; k < hc; ++k) rs += comb[(t * hc + j) * hc + k], cs += comb[(t * hc + k) * hc + j];
      EXPECT_NEAR(rs, 1.0, 1e-3);
      EXPECT_NEAR(cs, 1.0, 1e-4);
    }

  auto out = randn(T * H, 4), Y = X;
  mhc_expand(Y.data(), out.data(), post.data(), comb.data(), T, hc, H);
  std::vector<double> rY(T * hc * H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < H; ++d) {
        double s = double(post[t * hc + k]) * out[t * H + d];
        for (int64_t j = 0; j < hc; ++j) s += double(comb[(t * hc + j) * hc + k]) * X[(t * hc + j) * H + d];
        rY[(t * hc + k) * H + d] = s;
      }
  EXPECT_LT(rel_err(Y, rY), kTol);

  auto hfn = randn(hc * hc * H, 5, 0.1f), hbase = randn(hc, 6);
  std::vector<float> hscale = {1.3f};
  auto y = poisoned(T * H);
  mhc_head(X.data(), hfn.data(), hbase.data(), hscale.data(), T, hc, H, eps, neps, y.data());
  std::vector<double> ry(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data() + t * hc * H;
    double ss = 0;
    for (int64_t i = 0; i < hc * H; ++i) ss += double(x[i]) * x[i];
    const double r = 1 / std::sqrt(ss / double(hc * H) + neps);
    for (int64_t j = 0; j < hc; ++j) {
      double a = 0;
      for (int64_t i = 0; i < hc * H; ++i) a += double(hfn[j * hc * H + i]) * x[i] * r;
      const double p = sigmoid64(a * hscale[0] + hbase[j]) + eps;
      for (int64_t d = 0; d < H; ++d) ry[t * H + d] += p * x[j * H + d];
    }
  }
  EXPECT_LT(rel_err(y, ry), kTol);
}

TEST(Dsv4Ops, SinkAttentionMatchesFp64) {
  const int64_t heads = 3, D = 24;
  auto sinks = randn(heads, 7, 1.5f);
  for (int64_t n : {0, 1, 9, 130}) {
    auto q = randn(heads * D, 8 + n), kv = randn(std::max<int64_t>(n, 1) * D, 9 + n);
    auto out = poisoned(heads * D);
    sink_attention(q.data(), kv.data(), n, sinks.data(), heads, D, 0.2f, out.data());
    std::vector<double> ref(heads * D, 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> s(n);
      double den = std::exp(double(sinks[h]));
      for (int64_t j = 0; j < n; ++j) {
        double a = 0;
        for (int64_t d = 0; d < D; ++d) a += double(q[h * D + d]) * kv[j * D + d];
        den += s[j] = std::exp(0.2 * a);
      }
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) ref[h * D + d] += s[j] / den * kv[j * D + d];
    }
    EXPECT_LT(rel_err(out, ref), kTol) << n;
  }
}

TEST(Dsv4Ops, SoftmaxPoolMatchesFp64) {
  const int64_t D = 19;
  for (int64_t slots : {1, 4, 8, 128}) {
    auto v = randn(slots * 2 * D, 20 + slots), s = randn(slots * 3 * D, 30 + slots, 3.0f);
    auto out = poisoned(D);
    softmax_pool(v.data(), 2 * D, s.data(), 3 * D, slots, D, out.data());
    std::vector<double> ref(D);
    for (int64_t d = 0; d < D; ++d) {
      double den = 0, num = 0;
      for (int64_t i = 0; i < slots; ++i) {
        const double e = std::exp(double(s[i * 3 * D + d]));
        den += e;
        num += e * v[i * 2 * D + d];
      }
      ref[d] = num / den;
    }
    EXPECT_LT(rel_err(out, ref), kTol) << slots;
  }
}

TEST(Dsv4Ops, IndexerScoresAndTopkMatchFp64) {
  const int64_t heads = 16, d = 12, n = 75;
  auto q = randn(heads * d, 40), w = randn(heads, 41), k = randn(n * d, 42);
  auto s = poisoned(n);
  indexer_scores(q.data(), w.data(), k.data(), n, heads, d, s.data());
  std::vector<double> ref(n);
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double a = 0;
      for (int64_t c = 0; c < d; ++c) a += double(q[h * d + c]) * k[j * d + c];
      acc += double(w[h]) * std::max(a, 0.0) / std::sqrt(double(d));
    }
    ref[j] = acc;
  }
  EXPECT_LT(rel_err(s, ref), kTol);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return ref[a] > ref[b]; });
  auto top = topk_indices(s.data(), n, 8);
  EXPECT_EQ(top, std::vector<int32_t>(order.begin(), order.begin() + 8));
  EXPECT_EQ(topk_indices(s.data(), 5, 8).size(), 5u);  // fewer visible entries than k: all of them
  const float ties[4] = {1, 2, 2, 2};
  EXPECT_EQ(topk_indices(ties, 4, 2), (std::vector<int32_t>{1, 2}));
}

TEST(Dsv4Ops, GroupedLinearMatchesFp64) {
  const int64_t T = 3, g = 4, in = 10, out = 6;
  auto x = randn(T * g * in, 50), w = randn(g * out * in, 51);
  auto y = poisoned(T * g * out);
  grouped_linear(x.data(), w.data(), y.data(), T, g, in, out);
  std::vector<double> ref(T * g * out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < g; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double a = 0;
        for (int64_t c = 0; c < in; ++c) a += double(w[(i * out + o) * in + c]) * x[(t * g + i) * in + c];
        ref[(t * g + i) * out + o] = a;
      }
  EXPECT_LT(rel_err(y, ref), kTol);
}

TEST(Dsv4Ops, RoutingBiasChoosesButScoresWeigh) {
  const int64_t T = 7, E = 9, k = 3;
  auto logits = randn(T * E, 60, 2.0f), bias = randn(E, 61, 3.0f);
  std::vector<int32_t> idx(T * k), idx0(T * k);
  std::vector<float> wt(T * k), wt0(T * k);
  dsv4_route(logits.data(), bias.data(), nullptr, T, E, k, 1.5f, "sqrtsoftplus", idx.data(), wt.data());
  dsv4_route(logits.data(), nullptr, nullptr, T, E, k, 1.5f, "sqrtsoftplus", idx0.data(), wt0.data());
  EXPECT_NE(idx, idx0);  // this bias changes some choices
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E);
    for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(std::log1p(std::exp(double(logits[t * E + e]))));
    std::vector<int32_t> o(E);
    std::iota(o.begin(), o.end(), 0);
    std::sort(o.begin(), o.end(), [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[o[j]];
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(idx[t * k + j], o[j]);
      EXPECT_NEAR(wt[t * k + j], s[o[j]] / sum * 1.5, 1e-5);  // unbiased scores, renormalised, scaled
    }
  }
  // Hash routing: the table chooses (expert 0 included), the scores still weigh.
  std::vector<int32_t> hash(T * k);
  for (int64_t i = 0; i < T * k; ++i) hash[i] = int32_t(i % E);
  dsv4_route(logits.data(), bias.data(), hash.data(), T, E, k, 1.0f, "sqrtsoftplus", idx.data(), wt.data());
  EXPECT_EQ(idx, hash);
  hash[4] = int32_t(E);
  EXPECT_THROW(dsv4_route(logits.data(), nullptr, hash.data(), T, E, k, 1.0f, "sqrtsoftplus", idx.data(), wt.data()),
               Error);
}

TEST(Dsv4Ops, ClampedSwigluMatchesFp64) {
  const int64_t T = 4, I = 33;
  auto gu = randn(T * 2 * I, 70, 8.0f);
  for (float limit : {0.0f, 1.0f, 7.0f}) {
    auto y = poisoned(T * I);
    clamped_swiglu(gu.data(), y.data(), T, I, limit);
    std::vector<double> ref(T * I);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < I; ++i) {
        double g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        if (limit > 0) g = std::min(g, double(limit)), u = std::clamp(u, -double(limit), double(limit));
        ref[t * I + i] = g / (1 + std::exp(-g)) * u;
      }
    EXPECT_LT(rel_err(y, ref), kTol) << limit;
  }
}
