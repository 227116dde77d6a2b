// DeepSeek-V3.2's CPU ops (MLA, lightning indexer, grouped routing, YaRN RoPE, LayerNorm) against
// independent fp64 implementations on random inputs, plus the routing properties the design relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/error.h"
#include "ops/cpu/grouped_router.h"
#include "ops/cpu/lightning_indexer.h"
#include "ops/cpu/mla.h"
#include "ops/cpu/norm.h"
#include "ops/cpu/yarn_rope.h"
#include "test_util.h"

using namespace moefold;
using namespace moefold::cpu;
using moefold::test::poisoned;
using moefold::test::randn;
using moefold::test::rel_err;

namespace {

constexpr double kTol = 1e-5;

// ---------------------------------------------------------------------------------------------- YaRN
TEST(DeepseekOps, YarnInvFreqMatchesFormulaAndLimits) {
  YarnParams p;
  p.factor = 40;
  p.original_max = 4096;
  p.mscale = 1;
  p.mscale_all_dim = 1;
  const int64_t d = 64;
  const double theta = 10000;
  auto f = yarn_inv_freq(d, theta, p);
  ASSERT_EQ(f.size(), size_t(d / 2));
  // Independent: ramp bounds from the wavelength condition L / wavelength = beta.
  auto dim_of = [&](double rot) { return d * std::log(4096.0 / (rot * 2 * M_PI)) / (2 * std::log(theta)); };
  double lo = std::max(std::floor(dim_of(32)), 0.0), hi = std::min(std::ceil(dim_of(1)), double(d - 1));
  for (int64_t j = 0; j < d / 2; ++j) {
    double base = std::pow(theta, -2.0 * j / d);
    double t = std::min(1.0, std::max(0.0, (j - lo) / (hi - lo)));
    double want = base * (1 - t) + base / 40 * t;
    EXPECT_NEAR(f[j] / want, 1.0, 1e-12) << j;
  }
  EXPECT_DOUBLE_EQ(f[0], 1.0);                                  // fastest dim: extrapolated as is
  EXPECT_NEAR(f[d / 2 - 1], std::pow(theta, -(d - 2.0) / d) / 40, 1e-18);  // slowest: interpolated
  EXPECT_DOUBLE_EQ(yarn_attention_factor(p), 1.0);              // mscale == mscale_all_dim
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_NEAR(yarn_softmax_scale_factor(p), m * m, 1e-12);
  p.mscale_all_dim = 0;
  EXPECT_DOUBLE_EQ(yarn_softmax_scale_factor(p), 1.0);
  EXPECT_NEAR(yarn_attention_factor(p), m, 1e-12);
  p.factor = 1;
  EXPECT_DOUBLE_EQ(yarn_mscale(p.factor, 1), 1.0);
}

TEST(DeepseekOps, InterleavedAndHalfRopeMatchFp64) {
  const int64_t T = 5, heads = 3, D = 24, off = 8, rd = 16;
  std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
  std::vector<double> inv(rd / 2);
  for (int64_t j = 0; j < rd / 2; ++j) inv[j] = std::pow(10000.0, -2.0 * j / rd);
  for (double f : {1.0, 1.3}) {
    auto x = randn(T * heads * D, 11);
    auto y = x;
    apply_rope_interleaved(y.data(), pos.data(), T, heads, D, off, rd, inv.data(), f);
    auto z = x;
    apply_rope_half_scaled(z.data(), pos.data(), T, heads, D, rd, inv.data(), f);
    std::vector<double> ry(x.begin(), x.end()), rz(x.begin(), x.end());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < rd / 2; ++j) {
          const double a = pos[t] * inv[j], c = std::cos(a) * f, s = std::sin(a) * f;
          const size_t b = size_t((t * heads + h) * D);
          const double x0 = x[b + off + 2 * j], x1 = x[b + off + 2 * j + 1];
          ry[b + off + 2 * j] = x0 * c - x1 * s;
          ry[b + off + 2 * j + 1] = x1 * c + x0 * s;
          const double lo = x[b + j], hi = x[b + j + rd / 2];
          rz[b + j] = lo * c - hi * s;
          rz[b + j + rd / 2] = hi * c + lo * s;
        }
    EXPECT_LT(rel_err(y, ry), kTol);
    EXPECT_LT(rel_err(z, rz), kTol);
  }
}

TEST(DeepseekOps, LayerNormMatchesFp64) {
  const int64_t rows = 9, dim = 33;
  auto x = randn(rows * dim, 3, 2.0f, 0.7f), w = randn(dim, 4), b = randn(dim, 5);
  auto y = poisoned(rows * dim);
  layer_norm(x.data(), w.data(), b.data(), y.data(), rows, dim, 1e-6f);
  std::vector<double> ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < dim; ++i) m += x[r * dim + i] / double(dim);
    for (int64_t i = 0; i < dim; ++i) v += std::pow(x[r * dim + i] - m, 2) / double(dim);
    for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = (x[r * dim + i] - m) / std::sqrt(v + 1e-6) * w[i] + b[i];
  }
  EXPECT_LT(rel_err(y, ref), kTol);
}

// ----------------------------------------------------------------------------------------------- MLA
/// Pages in reverse order so that the page indirection is exercised.
std::vector<int32_t> reversed_table(int64_t blocks) {
  std::vector<int32_t> t(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) t[size_t(i)] = int32_t(blocks - 1 - i);
  return t;
}

TEST(DeepseekOps, AbsorbedMlaEqualsExpandedMha) {
  MlaShape s{4, 16, 8, 12, 20};
  const int64_t ctx = 37, bs = 8, nblk = (ctx + bs - 1) / bs;
  auto table = reversed_table(nblk);
  auto entries = randn(ctx * s.entry_dim(), 21);
  std::vector<float> cache(size_t(nblk * bs * s.entry_dim()), NAN);
  paged_rows_write(entries.data(), cache.data(), table.data(), 0, ctx, bs, s.entry_dim());
  auto kv_b = randn(s.heads * (s.qk_nope + s.v_head) * s.kv_lora, 22, 0.2f);
  auto q = randn(s.heads * s.q_dim(), 23);
  const float scale = 0.17f;
  // A sparse, unordered key set and the full causal one.
  std::vector<std::vector<int32_t>> key_sets = {{36, 0, 5, 17, 18, 30}, {}};
  for (int32_t j = 0; j < ctx; ++j) key_sets[1].push_back(j);
  for (auto& keys : key_sets) {
    auto o = poisoned(s.heads * s.v_head);
    mla_attention_row(q.data(), kv_b.data(), cache.data(), table.data(), bs, keys.data(), int64_t(keys.size()), s,
                      scale, o.data());
    // Expanded MHA in fp64: per head, k_j = [W_uk c_j | k_pe_j], v_j = W_uv c_j.
    std::vector<double> ref(size_t(s.heads * s.v_head), 0.0);
    const int64_t blk = s.qk_nope + s.v_head;
    for (int64_t h = 0; h < s.heads; ++h) {
      std::vector<double> sc;
      std::vector<std::vector<double>> vals;
      for (int32_t j : keys) {
        const float* c = &entries[size_t(j * s.entry_dim())];
        std::vector<double> k(size_t(s.q_dim())), v(size_t(s.v_head));
        for (int64_t d = 0; d < s.qk_nope + s.v_head; ++d) {
          double a = 0;
          for (int64_t r = 0; r < s.kv_lora; ++r) a += double(kv_b[size_t((h * blk + d) * s.kv_lora + r)]) * c[r];
          if (d < s.qk_nope) k[size_t(d)] = a;
          else v[size_t(d - s.qk_nope)] = a;
        }
        for (int64_t d = 0; d < s.qk_rope; ++d) k[size_t(s.qk_nope + d)] = c[s.kv_lora + d];
        double dot = 0;
        for (int64_t d = 0; d < s.q_dim(); ++d) dot += double(q[size_t(h * s.q_dim() + d)]) * k[size_t(d)];
        sc.push_back(dot * scale);
        vals.push_back(v);
      }
      double mx = *std::max_element(sc.begin(), sc.end()), sum = 0;
      for (double& v : sc) sum += (v = std::exp(v - mx));
      for (size_t j = 0; j < sc.size(); ++j)
        for (int64_t d = 0; d < s.v_head; ++d) ref[size_t(h * s.v_head + d)] += sc[j] / sum * vals[j][size_t(d)];
    }
    EXPECT_LT(rel_err(o, ref), kTol) << keys.size() << " keys";
  }
}

TEST(DeepseekOps, MlaStepsMatchFp64) {
  MlaShape s{3, 8, 4, 6, 10};
  auto kv_b = randn(s.heads * (s.qk_nope + s.v_head) * s.kv_lora, 31);
  auto q = randn(s.heads * s.q_dim(), 32);
  auto ql = poisoned(s.heads * s.kv_lora);
  mla_absorb_query(q.data(), kv_b.data(), s, ql.data());
  auto olat = randn(s.heads * s.kv_lora, 33);
  auto o = poisoned(s.heads * s.v_head);
  mla_value_up(olat.data(), kv_b.data(), s, o.data());
  std::vector<double> rq(size_t(s.heads * s.kv_lora), 0), ro(size_t(s.heads * s.v_head), 0);
  const int64_t blk = s.qk_nope + s.v_head;
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t r = 0; r < s.kv_lora; ++r)
      for (int64_t d = 0; d < s.qk_nope; ++d)
        rq[size_t(h * s.kv_lora + r)] += double(kv_b[size_t((h * blk + d) * s.kv_lora + r)]) * q[size_t(h * s.q_dim() + d)];
    for (int64_t d = 0; d < s.v_head; ++d)
      for (int64_t r = 0; r < s.kv_lora; ++r)
        ro[size_t(h * s.v_head + d)] +=
            double(kv_b[size_t((h * blk + s.qk_nope + d) * s.kv_lora + r)]) * olat[size_t(h * s.kv_lora + r)];
  }
  EXPECT_LT(rel_err(ql, rq), kTol);
  EXPECT_LT(rel_err(o, ro), kTol);
}

// ----------------------------------------------------------------------------------- lightning indexer
TEST(DeepseekOps, IndexerScoresMatchFp64AndReadOnlyTheRealContext) {
  const int64_t heads = 16, D = 24, ctx = 45, bs = 16, nblk = 8;  // pages for 128 tokens, 45 used
  auto table = reversed_table(nblk);
  auto keys = randn(ctx * D, 41);
  std::vector<float> cache(size_t(nblk * bs * D), NAN);  // unwritten slots are NaN: reading one shows
  paged_rows_write(keys.data(), cache.data(), table.data(), 0, ctx, bs, D);
  auto q = randn(heads * D, 42), w = randn(heads, 43);
  auto sc = poisoned(ctx);
  indexer_scores(q.data(), w.data(), cache.data(), table.data(), bs, ctx, heads, D, sc.data());
  std::vector<double> ref(size_t(ctx), 0);
  for (int64_t j = 0; j < ctx; ++j)
    for (int64_t h = 0; h < heads; ++h) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(q[size_t(h * D + d)]) * keys[size_t(j * D + d)];
      ref[size_t(j)] += w[size_t(h)] / std::sqrt(double(heads)) * std::max(dot / std::sqrt(double(D)), 0.0);
    }
  EXPECT_LT(rel_err(sc, ref), kTol);
}

TEST(DeepseekOps, IndexerTopkPicksLargestInPositionOrder) {
  std::vector<float> s = {0.5f, 3.f, NAN, 3.f, -1.f, 2.f, 0.f, 0.f};
  std::vector<int32_t> out(8, -1);
  ASSERT_EQ(indexer_topk(s.data(), 8, 3, out.data()), 3);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 3), (std::vector<int32_t>{1, 3, 5}));
  ASSERT_EQ(indexer_topk(s.data(), 8, 5, out.data()), 5);  // ties at 0: the lower position (6) wins
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 5), (std::vector<int32_t>{0, 1, 3, 5, 6}));
  ASSERT_EQ(indexer_topk(s.data(), 8, 8, out.data()), 8);  // context no longer than k: everything
  ASSERT_EQ(indexer_topk(s.data(), 4, 16, out.data()), 4);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 4), (std::vector<int32_t>{0, 1, 2, 3}));
  // Random: the chosen set is exactly the k largest.
  auto r = randn(300, 44);
  std::vector<int32_t> got(64);
  ASSERT_EQ(indexer_topk(r.data(), 300, 64, got.data()), 64);
  std::vector<int32_t> idx(300);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return r[a] > r[b]; });
  std::set<int32_t> want(idx.begin(), idx.begin() + 64);
  EXPECT_EQ(std::set<int32_t>(got.begin(), got.end()), want);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
}

// ----------------------------------------------------------------------------------- grouped routing
/// Independent fp64 noaux_tc routing; returns (ids sorted, weights by id).
void ref_grouped(const std::vector<float>& logits, const std::vector<float>& bias, int64_t t, const GroupedRouting& r,
                 std::vector<int32_t>& ids, std::vector<double>& wts) {
  const int64_t E = r.num_experts, per = E / r.n_group;
  std::vector<double> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[size_t(e)] = 1 / (1 + std::exp(-double(logits[size_t(t * E + e)])));
    c[size_t(e)] = s[size_t(e)] + bias[size_t(e)];
  }
  std::vector<std::pair<double, int64_t>> g;
  for (int64_t k = 0; k < r.n_group; ++k) {
    std::vector<double> m(c.begin() + k * per, c.begin() + (k + 1) * per);
    std::sort(m.rbegin(), m.rend());
    g.push_back({m[0] + m[1], k});
  }
  std::sort(g.begin(), g.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<std::pair<double, int64_t>> cand;
  for (int64_t k = 0; k < r.topk_group; ++k)
    for (int64_t e = g[size_t(k)].second * per; e < (g[size_t(k)].second + 1) * per; ++e) cand.push_back({c[size_t(e)], e});
  std::sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  ids.clear();
  for (int64_t k = 0; k < r.top_k; ++k) ids.push_back(int32_t(cand[size_t(k)].second));
  double sum = 0;
  for (auto e : ids) sum += s[size_t(e)];
  wts.clear();
  for (auto e : ids) wts.push_back(s[size_t(e)] / (r.renormalize ? sum + 1e-20 : 1.0) * r.routed_scaling_factor);
}

GroupedRouting routing(int64_t E, int64_t G, int64_t tg, int64_t k, bool renorm = true) {
  GroupedRouting r;
  r.num_experts = E;
  r.n_group = G;
  r.topk_group = tg;
  r.top_k = k;
  r.renormalize = renorm;
  r.routed_scaling_factor = 2.5f;
  return r;
}

TEST(GroupedRouting, MatchesFp64) {
  for (auto [E, G, tg, k] : std::vector<std::array<int64_t, 4>>{{64, 8, 4, 8}, {16, 4, 2, 3}, {12, 1, 1, 4}, {32, 8, 1, 4}}) {
    for (bool renorm : {true, false}) {
      const int64_t T = 23;
      auto logits = randn(T * E, uint64_t(E + G), 2.0f);
      auto bias = randn(E, uint64_t(7 * E), 0.3f);
      auto r = routing(E, G, tg, k, renorm);
      std::vector<int32_t> ids(size_t(T * k));
      auto w = poisoned(T * k);
      grouped_topk(logits.data(), bias.data(), T, r, ids.data(), w.data());
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> rid;
        std::vector<double> rw;
        ref_grouped(logits, bias, t, r, rid, rw);
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(ids[size_t(t * k + j)], rid[size_t(j)]) << "E=" << E << " t=" << t << " slot " << j;
          EXPECT_NEAR(w[size_t(t * k + j)], rw[size_t(j)], 1e-5 * std::max(1.0, std::fabs(rw[size_t(j)])));
        }
      }
    }
  }
}

TEST(GroupedRouting, NegativeChoiceScoresStillComeOnlyFromTheTopGroups) {
  // A large negative bias makes every choice score negative; the chosen experts must still lie in the
  // topk_group groups with the largest sum of their top two (not, e.g., wherever the single best is).
  const int64_t E = 16, G = 4;
  auto r = routing(E, G, 2, 4);
  std::vector<float> logits(E, 0.0f), bias(E, -5.0f);
  // Group 0 has one strong expert and weak others; groups 2 and 3 have two good ones each.
  bias[0] = -4.0f;                      // group 0: best single expert, top-two sum -4.5 - 5.5
  bias[8] = bias[9] = -4.4f;            // group 2: top-two sum 2 * (-3.9)
  bias[12] = bias[13] = -4.45f;         // group 3: top-two sum 2 * (-3.95)
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  grouped_topk(logits.data(), bias.data(), 1, r, ids.data(), w.data());
  for (int32_t e : ids) EXPECT_TRUE(e / 4 == 2 || e / 4 == 3) << "expert " << e << " outside the top two groups";
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0);
  // Unbiased scores are all sigmoid(0) = 0.5: renormalised weights are 2.5 / 4 each.
  for (float x : w) EXPECT_NEAR(x, 2.5f / 4, 1e-6);
}

TEST(GroupedRouting, BiasChangesTheChoiceNeverTheWeights) {
  const int64_t E = 32, G = 4, k = 4, T = 50;
  auto r = routing(E, G, 2, k);
  auto logits = randn(T * E, 51, 1.5f);
  std::vector<float> zero(E, 0.0f);
  auto bias = randn(E, 52, 1.0f);
  std::vector<int32_t> a(T * k), b(T * k);
  std::vector<float> wa(T * k), wb(T * k);
  grouped_topk(logits.data(), zero.data(), T, r, a.data(), wa.data());
  grouped_topk(logits.data(), bias.data(), T, r, b.data(), wb.data());
  EXPECT_NE(a, b) << "a bias of std 1 should move some choices";
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += 1 / (1 + std::exp(-double(logits[size_t(t * E + b[size_t(t * k + j)])])));
    for (int64_t j = 0; j < k; ++j) {
      const double s = 1 / (1 + std::exp(-double(logits[size_t(t * E + b[size_t(t * k + j)])])));
      EXPECT_NEAR(wb[size_t(t * k + j)], s / sum * 2.5, 1e-5);  // weights: unbiased s of the chosen experts
    }
  }
  // Replaying the biased choice without the bias gives the same weights: the bias never reaches them.
  std::vector<int32_t> c(T * k);
  std::vector<float> wc(T * k);
  grouped_topk(logits.data(), zero.data(), T, r, c.data(), wc.data(), b.data());
  EXPECT_EQ(c, b);
  EXPECT_EQ(wc, wb);
}

TEST(GroupedRouting, ZeroRowsAndExpertZero) {
  const int64_t E = 16, G = 4, k = 4;
  auto r = routing(E, G, 2, k);
  std::vector<float> logits(2 * E, 0.0f), bias(E, 0.0f);
  logits[E + 0] = 9.0f;  // row 1: expert 0 is the clear best
  std::vector<int32_t> ids(2 * k);
  std::vector<float> w(2 * k);
  grouped_topk(logits.data(), bias.data(), 2, r, ids.data(), w.data());
  // All-zero row: every score ties; the lowest groups and experts win, weights are equal and finite.
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + k), (std::vector<int32_t>{0, 1, 2, 3}));
  for (int j = 0; j < k; ++j) EXPECT_NEAR(w[j], 2.5f / 4, 1e-6);
  EXPECT_EQ(ids[k], 0);  // expert 0 chosen first, like any other expert
  EXPECT_GT(w[k], w[k + 1]);
  double sum = 0;
  for (int j = k; j < 2 * k; ++j) sum += w[j];
  EXPECT_NEAR(sum, 2.5, 1e-5);
}

TEST(GroupedRouting, BadSettingsAndReplayFailClearly) {
  std::vector<float> logits(16, 0.0f);
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  EXPECT_THROW(grouped_topk(logits.data(), nullptr, 1, routing(16, 3, 1, 2), ids.data(), w.data()), Error);
  EXPECT_THROW(grouped_topk(logits.data(), nullptr, 1, routing(16, 4, 5, 2), ids.data(), w.data()), Error);
  EXPECT_THROW(grouped_topk(logits.data(), nullptr, 1, routing(16, 4, 1, 5), ids.data(), w.data()), Error);
  EXPECT_THROW(grouped_topk(logits.data(), nullptr, 1, routing(16, 16, 2, 2), ids.data(), w.data()), Error);
  std::vector<int32_t> bad = {0, 1, 2, 16};
  EXPECT_THROW(grouped_topk(logits.data(), nullptr, 1, routing(16, 4, 2, 4), ids.data(), w.data(), bad.data()), Error);
}

}  // namespace
