// Tests of the CPU reference sampler (runtime/sampler.h): greedy, truncation warpers,
// penalties, logprobs, the counter-based RNG and the exact distributions it samples from.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace moefold {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(size_t v, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(v);
  for (float& e : x) e = nd(rng);
  return x;
}

SamplingParams with_temperature(float t) {
  SamplingParams p;
  p.temperature = t;
  return p;
}

// ----- reference math, written from the definitions, in double ------------------------------

/// softmax(x / T) in double.
std::vector<double> softmax_d(const std::vector<float>& x, double t) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double(v));
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += p[i] = std::exp((double(x[i]) - m) / t);
  for (double& e : p) e /= z;
  return p;
}

/// The expected distribution for params (no penalties): temperature, min_p, top_k, top_p,
/// with a full sort, as an independent reference for sampling_distribution().
std::vector<double> expected_dist(const std::vector<float>& x, const SamplingParams& sp) {
  const size_t v = x.size();
  std::vector<double> p = softmax_d(x, sp.temperature);
  const double pmax = *std::max_element(p.begin(), p.end());
  std::vector<bool> keep(v);
  for (size_t i = 0; i < v; ++i) keep[i] = p[i] > 0 && p[i] >= sp.min_p * pmax;
  std::vector<int> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return x[a] > x[b] || (x[a] == x[b] && a < b);
  });
  if (sp.top_k > 0) {
    int kept = 0;
    for (int i : order)
      if (keep[i] && ++kept > sp.top_k) keep[i] = false;
  }
  if (sp.top_p < 1.0f) {
    double z = 0;
    for (size_t i = 0; i < v; ++i)
      if (keep[i]) z += p[i];
    double cum = 0;
    bool reached = false;
    for (int i : order) {
      if (!keep[i]) continue;
      if (reached) {
        keep[i] = false;
        continue;
      }
      cum += p[i] / z;
      if (cum >= sp.top_p) reached = true;
    }
  }
  double z = 0;
  for (size_t i = 0; i < v; ++i)
    if (keep[i]) z += p[i];
  std::vector<double> q(v, 0.0);
  for (size_t i = 0; i < v; ++i)
    if (keep[i]) q[i] = p[i] / z;
  return q;
}

// ----- greedy ----------------------------------------------------------------------------------

TEST(Sampler, GreedyIsArgmax) {
  const std::vector<float> x = random_logits(1000, 1);
  const auto best = int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  SamplingParams p = with_temperature(0.0f);
  for (uint64_t step = 0; step < 10; ++step)
    EXPECT_EQ(sample_token(x, {}, {}, p, 7, step).token, best);
}

TEST(Sampler, GreedyTiesPickLowerId) {
  const std::vector<float> x = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f, kNegInf};
  EXPECT_EQ(sample_token(x, {}, {}, with_temperature(0.0f), 1, 0).token, 1);
  const std::vector<float> all_equal(17, 0.25f);
  EXPECT_EQ(sample_token(all_equal, {}, {}, with_temperature(0.0f), 1, 0).token, 0);
}

TEST(Sampler, GreedyIgnoresTruncationAndSeed) {
  const std::vector<float> x = random_logits(500, 2);
  const auto best = int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  SamplingParams p = with_temperature(0.0f);
  p.top_k = 3;
  p.top_p = 0.01f;
  p.min_p = 0.99f;
  for (uint64_t seed : {0ull, 1ull, 99ull})
    EXPECT_EQ(sample_token(x, {}, {}, p, seed, 5).token, best);
  // Below kGreedyTemperature counts as greedy too.
  p.temperature = 1e-6f;
  EXPECT_EQ(sample_token(x, {}, {}, p, 3, 0).token, best);
  EXPECT_EQ(sampling_distribution(x, {}, {}, p)[size_t(best)], 1.0);
}

TEST(Sampler, TopK1EqualsGreedyForAnyTemperature) {
  for (uint32_t trial = 0; trial < 20; ++trial) {
    std::vector<float> x = random_logits(300, 100 + trial);
    if (trial % 2) {  // force a tie at the maximum
      const auto m = std::max_element(x.begin(), x.end()) - x.begin();
      x[(size_t(m) + 7) % x.size()] = x[size_t(m)];
    }
    const int32_t greedy = sample_token(x, {}, {}, with_temperature(0.0f), 0, 0).token;
    for (float t : {1e-5f, 0.1f, 1.0f, 7.0f, 1e4f, 1e30f}) {
      SamplingParams p = with_temperature(t);
      p.top_k = 1;
      for (uint64_t step = 0; step < 5; ++step)
        ASSERT_EQ(sample_token(x, {}, {}, p, trial, step).token, greedy) << "T=" << t;
    }
  }
}

// ----- randomness ------------------------------------------------------------------------------

TEST(Sampler, SplitMix64KnownValues) {
  // SplitMix64 seeded with 0: the well-known first output.
  EXPECT_EQ(splitmix64_at(0, 0), 0xE220A8397B1DCDAFull);
  for (uint64_t s = 0; s < 1000; ++s) {
    const double u = sampling_uniform(12345, s);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
  EXPECT_EQ(sampling_uniform(5, 9), sampling_uniform(5, 9));
  EXPECT_NE(sampling_uniform(5, 9), sampling_uniform(5, 10));
}

/// Autoregressive toy loop: logits depend on the last token, so one changed draw diverges.
std::vector<int32_t> generate(const Sampler& s, size_t vocab, size_t n) {
  std::vector<float> base = random_logits(vocab, 77, 1.0f);
  std::vector<int32_t> out;
  std::vector<float> x(vocab);
  for (size_t i = 0; i < n; ++i) {
    const int32_t last = out.empty() ? 0 : out.back();
    for (size_t j = 0; j < vocab; ++j) x[j] = base[(j + size_t(last) * 31) % vocab];
    out.push_back(s.sample(x, {}, out).token);
  }
  return out;
}

TEST(Sampler, FixedSeedReproducesSequence) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 42;
  const Sampler a(p), b(p);
  const auto seq = generate(a, 1000, 200);
  EXPECT_EQ(seq, generate(b, 1000, 200));
  EXPECT_EQ(seq, generate(a, 1000, 200));  // no hidden state between calls
  p.seed = 43;
  const auto other = generate(Sampler(p), 1000, 200);
  EXPECT_NE(seq, other);
  // Negative seeds are valid and distinct.
  p.seed = -1;
  EXPECT_EQ(Sampler(p).seed(), ~0ull);
}

TEST(Sampler, DrawDependsOnlyOnSeedAndStep) {
  // "Batch composition": interleaving other requests' calls changes nothing; a recomputed step
  // (same history length) gives the same token.
  const std::vector<float> x = random_logits(2000, 5, 1.0f);
  SamplingParams p;
  p.seed = 9;
  const Sampler s(p);
  std::vector<int32_t> hist(37, 0);
  const int32_t first = s.sample(x, {}, hist).token;
  SamplingParams q;
  q.seed = 10;
  const Sampler other(q);
  for (int i = 0; i < 5; ++i) (void)other.sample(x, {}, hist);
  EXPECT_EQ(s.sample(x, {}, hist).token, first);
  EXPECT_EQ(sample_token(x, {}, {}, p, 9, 37).token, first);
}

TEST(Sampler, UnseededRequestsGetDifferentSeeds) {
  const SamplingParams p;
  EXPECT_NE(Sampler(p).seed(), Sampler(p).seed());
}

// ----- distributions ---------------------------------------------------------------------------

const std::vector<float> kToy = {2.0f, 1.5f, 1.1f, 0.3f, 0.0f, -0.4f, -1.0f, -2.5f};

/// Checks sampling_distribution() against the reference exactly (double), then draws 200k
/// tokens with a fixed seed and checks every bin within 5 binomial standard deviations.
void check_distribution(const SamplingParams& p, const std::vector<double>& expected) {
  ASSERT_EQ(expected.size(), kToy.size());
  const std::vector<double> got = sampling_distribution(kToy, {}, {}, p);
  for (size_t i = 0; i < kToy.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-12) << "token " << i;

  constexpr int kDraws = 200000;
  std::vector<int> count(kToy.size(), 0);
  for (int s = 0; s < kDraws; ++s)
    ++count[size_t(sample_token(kToy, {}, {}, p, 2024, uint64_t(s)).token)];
  for (size_t i = 0; i < kToy.size(); ++i) {
    const double mean = kDraws * expected[i];
    if (expected[i] == 0.0) {
      EXPECT_EQ(count[i], 0) << "token " << i << " was truncated but sampled";
      continue;
    }
    const double sd = std::sqrt(kDraws * expected[i] * (1.0 - expected[i]));
    EXPECT_LE(std::abs(count[i] - mean), 5.0 * sd + 1.0)
        << "token " << i << " count " << count[i] << " expected " << mean;
  }
}

TEST(SamplerDistribution, Temperature1) {
  check_distribution(with_temperature(1.0f), softmax_d(kToy, 1.0));
}

TEST(SamplerDistribution, TemperatureSharpensAndFlattens) {
  check_distribution(with_temperature(0.5f), softmax_d(kToy, 0.5));
  check_distribution(with_temperature(2.5f), softmax_d(kToy, 2.5));
}

TEST(SamplerDistribution, TopK) {
  SamplingParams p;
  p.top_k = 3;
  std::vector<double> e = softmax_d(kToy, 1.0);
  const double z = e[0] + e[1] + e[2];
  for (size_t i = 0; i < e.size(); ++i) e[i] = i < 3 ? e[i] / z : 0.0;
  check_distribution(p, e);
  EXPECT_EQ(expected_dist(kToy, p), e);
}

TEST(SamplerDistribution, TopP) {
  SamplingParams p;
  p.top_p = 0.85f;
  // Cumulative softmax(kToy) is 0.403, 0.647, 0.811, 0.884, ...: the smallest prefix reaching
  // 0.85 is tokens 0..3 (written out by hand so the test does not only compare the code with a
  // copy of itself).
  const std::vector<double> full = softmax_d(kToy, 1.0);
  ASSERT_LT(full[0] + full[1] + full[2], 0.85);
  ASSERT_GE(full[0] + full[1] + full[2] + full[3], 0.85);
  std::vector<double> e(kToy.size(), 0.0);
  const double z = full[0] + full[1] + full[2] + full[3];
  for (size_t i = 0; i < 4; ++i) e[i] = full[i] / z;
  check_distribution(p, e);
}

TEST(SamplerDistribution, MinP) {
  SamplingParams p;
  p.min_p = 0.2f;  // keep p_i >= 0.2 p_max, i.e. x_i >= 2 + ln 0.2 = 0.39: tokens 0..2
  const std::vector<double> full = softmax_d(kToy, 1.0);
  std::vector<double> e(kToy.size(), 0.0);
  const double z = full[0] + full[1] + full[2];
  for (size_t i = 0; i < 3; ++i) e[i] = full[i] / z;
  check_distribution(p, e);
}

TEST(SamplerDistribution, MinPIsAppliedAfterTemperature) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.min_p = 0.2f;  // at T=2: keep x_i >= 2 + 2 ln 0.2 = -1.22: tokens 0..6
  const std::vector<double> full = softmax_d(kToy, 2.0);
  std::vector<double> e(kToy.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < 7; ++i) z += full[i];
  for (size_t i = 0; i < 7; ++i) e[i] = full[i] / z;
  check_distribution(p, e);
}

TEST(SamplerDistribution, CombinedPipelineOrder) {
  // temperature -> min_p -> top_k -> top_p, with top_p over the renormalized survivors.
  SamplingParams p;
  p.temperature = 0.7f;
  p.min_p = 0.02f;
  p.top_k = 5;
  p.top_p = 0.95f;
  const std::vector<double> e = expected_dist(kToy, p);
  // Hand check of the reference: min_p keeps x >= 2 + 0.7 ln 0.02 = -0.74 (tokens 0..5),
  // top_k keeps 0..4, top_p over those (cumulative 0.523, 0.779, 0.924, 0.970) keeps 0..3.
  EXPECT_GT(e[3], 0.0);
  EXPECT_EQ(e[4], 0.0);
  EXPECT_EQ(e[5], 0.0);
  check_distribution(p, e);
}

TEST(SamplerDistribution, TopKKeepsExactlyKWithLowerIdTies) {
  const std::vector<float> x = {1.0f, 3.0f, 3.0f, 3.0f, 0.0f};
  SamplingParams p;
  p.top_k = 2;
  const std::vector<double> d = sampling_distribution(x, {}, {}, p);
  EXPECT_EQ(d, (std::vector<double>{0.0, 0.5, 0.5, 0.0, 0.0}));
  p.top_k = 5;  // k >= vocabulary: no truncation
  EXPECT_EQ(sampling_distribution(x, {}, {}, p), softmax_d(x, 1.0));
}

TEST(SamplerDistribution, PenaltiesFeedTheDistribution) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.frequency_penalty = 0.7f;
  p.repetition_penalty = 1.2f;
  const std::vector<int32_t> prompt = {3};
  const std::vector<int32_t> output = {0, 0, 5};
  std::vector<float> penalized = kToy;
  apply_penalties(penalized, prompt, output, p);
  const std::vector<double> want = softmax_d(penalized, double(p.temperature));  // 0.8f
  const std::vector<double> got = sampling_distribution(kToy, prompt, output, p);
  for (size_t i = 0; i < kToy.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12);
}

TEST(SamplerDistribution, MaskedTokensAreNeverSampled) {
  const std::vector<float> x = {kNegInf, 0.0f, kNegInf, 0.0f};
  for (uint64_t s = 0; s < 1000; ++s) {
    const int32_t t = sample_token(x, {}, {}, SamplingParams{}, 1, s).token;
    ASSERT_TRUE(t == 1 || t == 3);
  }
}

TEST(SamplerDistribution, LargeVocabMatchesFullSortReference) {
  // Exercises the incremental top_p selection across several doubling rounds, with ties.
  std::vector<float> x = random_logits(5000, 11, 0.7f);
  for (size_t i = 0; i < x.size(); i += 50) x[i] = x[i + 1];  // exact ties
  x[10] = kNegInf;
  struct Case {
    float t, top_p, min_p;
    int k;
  };
  for (const Case c : {Case{1.0f, 0.5f, 0.0f, 0}, Case{1.3f, 0.97f, 0.0f, 0},
                       Case{0.8f, 0.9f, 0.01f, 1000}, Case{1.0f, 1.0f, 0.0f, 777},
                       Case{2.0f, 0.3f, 0.0f, 64}, Case{1.0f, 0.999f, 0.0f, 4999}}) {
    SamplingParams p;
    p.temperature = c.t;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.k;
    const std::vector<double> got = sampling_distribution(x, {}, {}, p);
    const std::vector<double> ref = expected_dist(x, p);
    size_t kept = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i] == 0.0, ref[i] == 0.0) << "token " << i << " top_p " << c.top_p;
      ASSERT_NEAR(got[i], ref[i], 1e-12);
      kept += got[i] > 0;
    }
    if (c.k == 0 || c.k > 64) {
      EXPECT_GT(kept, 64u);  // more than the first selection block
    }
    // Every sampled token lies in the kept set.
    for (uint64_t s = 0; s < 50; ++s)
      ASSERT_GT(got[size_t(sample_token(x, {}, {}, p, 3, s).token)], 0.0);
  }
}

// ----- penalties -------------------------------------------------------------------------------

TEST(SamplerPenalties, RepetitionDividesPositiveMultipliesNegative) {
  std::vector<float> x = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.repetition_penalty = 1.25f;
  const std::vector<int32_t> prompt = {0, 1, 1};
  const std::vector<int32_t> output = {5, 0};
  apply_penalties(x, prompt, output, p);
  EXPECT_FLOAT_EQ(x[0], 2.0f / 1.25f);   // prompt + output: applied once
  EXPECT_FLOAT_EQ(x[1], -1.0f * 1.25f);  // prompt only still counts
  EXPECT_FLOAT_EQ(x[2], 0.5f);
  EXPECT_FLOAT_EQ(x[3], -3.0f);
  EXPECT_FLOAT_EQ(x[4], 1.0f);
  EXPECT_FLOAT_EQ(x[5], 0.0f);
}

TEST(SamplerPenalties, FrequencyAndPresenceCountOutputOnly) {
  std::vector<float> x = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f};
  SamplingParams p;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = -0.25f;
  const std::vector<int32_t> prompt = {4, 4, 4, 1};
  const std::vector<int32_t> output = {2, 2, 3, 2, 0};
  apply_penalties(x, prompt, output, p);
  EXPECT_FLOAT_EQ(x[0], 2.0f - 0.4f * 1 + 0.25f);
  EXPECT_FLOAT_EQ(x[1], -1.0f);  // prompt tokens are not counted
  EXPECT_FLOAT_EQ(x[2], 0.5f - 0.4f * 3 + 0.25f);
  EXPECT_FLOAT_EQ(x[3], -3.0f - 0.4f * 1 + 0.25f);
  EXPECT_FLOAT_EQ(x[4], 1.0f);
}

TEST(SamplerPenalties, AllThreeInOrder) {
  std::vector<float> x = {2.0f, -1.0f, 0.5f, -3.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 1.0f;
  apply_penalties(x, std::vector<int32_t>{1}, std::vector<int32_t>{0, 0, 3}, p);
  EXPECT_FLOAT_EQ(x[0], 2.0f / 2.0f - 0.5f * 2 - 1.0f);
  EXPECT_FLOAT_EQ(x[1], -1.0f * 2.0f);
  EXPECT_FLOAT_EQ(x[2], 0.5f);
  EXPECT_FLOAT_EQ(x[3], -3.0f * 2.0f - 0.5f - 1.0f);
  // -inf stays -inf under every penalty.
  std::vector<float> m = {kNegInf, 1.0f};
  apply_penalties(m, std::vector<int32_t>{0}, std::vector<int32_t>{0}, p);
  EXPECT_EQ(m[0], kNegInf);
}

TEST(SamplerPenalties, ChangeGreedyChoiceButNotLogprobs) {
  const std::vector<float> x = {3.0f, 2.9f, 0.0f};
  SamplingParams p = with_temperature(0.0f);
  p.presence_penalty = 0.5f;
  p.logprobs = true;
  const std::vector<int32_t> out = {0};
  const SampleResult r = sample_token(x, {}, out, p, 0, 1);
  EXPECT_EQ(r.token, 1);
  // logprob is from the raw logits, not the penalized ones.
  const double lse = std::log(std::exp(3.0) + std::exp(2.9) + std::exp(0.0));
  EXPECT_NEAR(r.logprob, 2.9 - lse, 1e-6);
  // Off penalties leave the logits bit-identical.
  std::vector<float> y = x;
  apply_penalties(y, out, out, SamplingParams{});
  EXPECT_EQ(y, x);
}

TEST(SamplerPenalties, HistoryOutOfRangeThrows) {
  std::vector<float> x(4, 0.0f);
  SamplingParams p;
  p.repetition_penalty = 1.1f;
  EXPECT_THROW(apply_penalties(x, std::vector<int32_t>{4}, {}, p), Error);
  EXPECT_THROW(sample_token(x, {}, std::vector<int32_t>{-1}, p, 0, 0), Error);
}

// ----- logprobs --------------------------------------------------------------------------------

TEST(SamplerLogprobs, MatchDoubleLogSoftmax) {
  std::vector<float> x = random_logits(50000, 21, 4.0f);
  x[123] = kNegInf;
  x[7] = x[8] = 25.0f;  // tie at the top: lower id first
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double(v));
  double z = 0;
  for (float v : x) z += std::exp(double(v) - m);
  const double lse = m + std::log(z);

  SamplingParams p;
  p.temperature = 0.6f;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;  // logprobs must ignore all processing
  p.logprobs = true;
  p.top_logprobs = 20;
  const std::vector<int32_t> prompt = {7, 8, 9};
  const SampleResult r = sample_token(x, prompt, {}, p, 5, 0);
  EXPECT_NEAR(r.logprob, double(x[size_t(r.token)]) - lse, 1e-5);

  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  ASSERT_EQ(r.top_logprobs.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(r.top_logprobs[i].token, order[i]);
    EXPECT_NEAR(r.top_logprobs[i].logprob, double(x[size_t(order[i])]) - lse, 1e-5);
  }
  EXPECT_EQ(r.top_logprobs[0].token, 7);
  EXPECT_EQ(r.top_logprobs[1].token, 8);

  p.logprobs = false;
  p.top_logprobs = 0;
  const SampleResult no_lp = sample_token(x, prompt, {}, p, 5, 0);
  EXPECT_TRUE(no_lp.top_logprobs.empty());
  EXPECT_TRUE(std::isnan(no_lp.logprob));  // not computed unless asked for
  EXPECT_EQ(no_lp.token, r.token);          // and the choice does not depend on it
}

TEST(SamplerLogprobs, TopNClampedToVocabAndIncludesMasked) {
  const std::vector<float> x = {0.0f, kNegInf, 1.0f};
  const auto top = top_logprobs(x, 20);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 2);
  EXPECT_EQ(top[1].token, 0);
  EXPECT_EQ(top[2].token, 1);
  EXPECT_EQ(top[2].logprob, kNegInf);
  EXPECT_NEAR(top[0].logprob, 1.0 - std::log(1.0 + std::exp(1.0)), 1e-7);
}

// ----- errors ----------------------------------------------------------------------------------

TEST(SamplerErrors, NaNThrows) {
  std::vector<float> x = random_logits(100, 3);
  x[42] = std::numeric_limits<float>::quiet_NaN();
  for (float t : {0.0f, 1.0f}) {
    try {
      (void)sample_token(x, {}, {}, with_temperature(t), 0, 0);
      FAIL() << "NaN logits were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("42"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(sampling_distribution(x, {}, {}, SamplingParams{}), Error);
  EXPECT_THROW(top_logprobs(x, 5), Error);
}

TEST(SamplerErrors, BadRowsThrow) {
  std::vector<float> x = {0.0f, std::numeric_limits<float>::infinity()};
  EXPECT_THROW(sample_token(x, {}, {}, SamplingParams{}, 0, 0), Error);
  const std::vector<float> masked(5, kNegInf);
  EXPECT_THROW(sample_token(masked, {}, {}, SamplingParams{}, 0, 0), Error);
  EXPECT_THROW(sample_token(std::vector<float>{}, {}, {}, SamplingParams{}, 0, 0), Error);
  // A tiny repetition penalty overflowing a logit to +inf is reported, not sampled through.
  SamplingParams p;
  p.repetition_penalty = 1e-38f;
  const std::vector<float> big = {100.0f, 0.0f};
  EXPECT_THROW(sample_token(big, std::vector<int32_t>{0}, {}, p, 0, 0), Error);
}

TEST(SamplingParamsValidate, DefaultsAreValid) {
  EXPECT_NO_THROW(SamplingParams{}.validate());
  SamplingParams p;
  p.top_k = -1;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.logprobs = true;
  p.top_logprobs = 20;
  p.max_tokens = 1;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 5.0f;
  EXPECT_NO_THROW(p.validate());
}

TEST(SamplingParamsValidate, RejectsOutOfRange) {
  auto expect_error = [](auto mutate, const std::string& field) {
    SamplingParams p;
    mutate(p);
    try {
      p.validate();
      ADD_FAILURE() << "accepted bad " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_THROW(Sampler{p}, Error);
  };
  expect_error([](SamplingParams& p) { p.temperature = -0.1f; }, "temperature");
  expect_error([](SamplingParams& p) { p.temperature = NAN; }, "temperature");
  expect_error([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  expect_error([](SamplingParams& p) { p.top_p = 1.01f; }, "top_p");
  expect_error([](SamplingParams& p) { p.min_p = -0.01f; }, "min_p");
  expect_error([](SamplingParams& p) { p.min_p = 1.5f; }, "min_p");
  expect_error([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  expect_error([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_error([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  expect_error([](SamplingParams& p) { p.frequency_penalty = -2.01f; }, "frequency_penalty");
  expect_error([](SamplingParams& p) { p.logprobs = true; p.top_logprobs = 21; }, "top_logprobs");
  expect_error([](SamplingParams& p) { p.top_logprobs = 2; }, "logprobs");
  expect_error([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  expect_error([](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop");
  expect_error([](SamplingParams& p) { p.stop_token_ids = {-3}; }, "stop_token_ids");
}

// ----- size ------------------------------------------------------------------------------------

TEST(Sampler, LargeVocabTopPIsCheap) {
  // 256k vocabulary, nucleus sampling: must run without a full sort (a few ms per token).
  const std::vector<float> x = random_logits(256000, 31, 2.0f);
  SamplingParams p;
  p.top_p = 0.9f;
  p.top_k = 0;
  p.seed = 1;
  const Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < 20; ++i) out.push_back(s.sample(x, {}, out).token);
  const std::vector<double> d = sampling_distribution(x, {}, {}, p);
  for (int32_t t : out) EXPECT_GT(d[size_t(t)], 0.0);
}

}  // namespace
}  // namespace moefold
