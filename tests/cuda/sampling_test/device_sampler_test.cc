// sampling_test: the whole DeviceSampler against Sampler::sample (every option, failing rows), its
// token frequencies over seeded draws, edge cases and batch invariance of the cluster kernel.
#include "cuda/sampling_test/sampling_test_util.h"

namespace sampling_test {
namespace {

/// Every option at once, per row: temperature / top_k / top_p / min_p (row_params), penalties,
/// logprobs with 0, 1, 5 or 20 top entries, a seed.
SamplingParams mixed_params(uint64_t h) {
  SamplingParams p = penalty_params(mix64(h + 1));
  const SamplingParams s = row_params(h);
  p.temperature = s.temperature, p.top_k = s.top_k, p.top_p = s.top_p, p.min_p = s.min_p;
  const int32_t tops[] = {0, 1, 5, 20};
  p.logprobs = (h >> 20) % 3 != 0;
  p.top_logprobs = p.logprobs ? tops[(h >> 24) % 4] : 0;
  p.seed = int64_t(mix64(h + 2) >> 1);
  return p;
}

}  // namespace

/// DeviceSampler vs the CPU sampler on the same masked rows, histories and (seed, step): tokens
/// equal, logprobs within 1e-5, top_logprobs the same ids; failing rows fail on both sides only.
void check_device_sampler(int64_t R, int64_t V, int calls, uint64_t seed, bool cluster) {
  DeviceSampler ds(R, V);
  ds.set_cluster_kernel(cluster);
  std::vector<int32_t> mask;
  for (int64_t i = 0; i < std::min<int64_t>(V / 4, 200); ++i) mask.push_back(int32_t(V - 1 - i));  // "padding" ids
  mask.push_back(-1);
  mask.push_back(int32_t(V) + 7);
  size_t tok_mis = 0, err_mis = 0, top_mis = 0, rows_checked = 0, errors = 0;
  double lp_err = 0;
  for (int c = 0; c < calls; ++c) {
    const uint64_t cs = seed * 1000 + uint64_t(c);
    auto x = make_rows(R, V, cs);
    std::vector<Sampler> samplers;
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(R)), outputs(static_cast<size_t>(R));
    samplers.reserve(size_t(R));
    for (int64_t r = 0; r < R; ++r) {
      const uint64_t h = mix64(cs * 131 + uint64_t(r));
      samplers.emplace_back(mixed_params(h));
      float* row = x.data() + r * V;
      prompts[size_t(r)] = make_history(row, V, 1 + h % 150, h + 11);
      outputs[size_t(r)] = make_history(row, V, (h >> 8) % 60, h + 13);  // its size is the draw index
      if (r % 37 == 5) row[(h >> 16) % uint64_t(V / 2)] = NAN;
      if (r % 41 == 7) row[(h >> 16) % uint64_t(V / 2)] = INFINITY;
      if (r % 43 == 9) outputs[size_t(r)].push_back(int32_t(V) + 1);  // out of range (read only with penalties)
      if (c == 1 && r % 3 == 0) mask.push_back(int32_t(h % uint64_t(V)));  // the mask changes between calls
    }
    std::vector<RowSampling> rows;
    for (int64_t r = 0; r < R; ++r)
      rows.push_back({r % 47 == 11 ? nullptr : &samplers[size_t(r)], prompts[size_t(r)], outputs[size_t(r)]});
    auto dx = cuda::to_device(x);
    std::vector<SampleResult> got;
    ds.sample(dx.data(), rows, mask, got, nullptr);
    ASSERT_EQ(got.size(), size_t(R));
    std::vector<SampleResult> want(static_cast<size_t>(R));
    std::vector<int> threw(static_cast<size_t>(R), 0);
    parallel_for(size_t(R), [&](size_t r) {
      if (!rows[r].sampler) return;
      std::vector<float> row(x.begin() + int64_t(r) * V, x.begin() + int64_t(r + 1) * V);
      mask_tokens(row, mask);
      try {
        want[r] = samplers[r].sample(row, prompts[r], outputs[r]);
      } catch (const Error&) {
        threw[r] = 1;
      }
    });
    for (size_t r = 0; r < size_t(R); ++r) {
      if (!rows[r].sampler) {
        err_mis += got[r].token != -1 || !got[r].error.empty();
        continue;
      }
      ++rows_checked;
      if (threw[r] || !got[r].error.empty()) {
        ++errors;
        err_mis += !threw[r] || got[r].error.empty() || got[r].token != -1;
        continue;
      }
      tok_mis += got[r].token != want[r].token;
      const SamplingParams& p = samplers[r].params();
      if (p.logprobs) {
        lp_err = std::max(lp_err, std::abs(double(got[r].logprob) - double(want[r].logprob)));
        if (!(std::isfinite(got[r].logprob) || got[r].logprob == want[r].logprob)) lp_err = INFINITY;
      } else {
        err_mis += !std::isnan(got[r].logprob);
      }
      bool top_ok = got[r].top_logprobs.size() == want[r].top_logprobs.size();
      for (size_t j = 0; top_ok && j < want[r].top_logprobs.size(); ++j) {
        const TokenLogprob &a = got[r].top_logprobs[j], &b = want[r].top_logprobs[j];
        top_ok = a.token == b.token && (a.logprob == b.logprob || std::abs(double(a.logprob) - double(b.logprob)) <= 1e-5);
      }
      top_mis += !top_ok;
    }
  }
  const std::string shape =
      fmt::format("rows={},V={},calls={},all_options+mask{}", R, V, calls, cluster ? ",cluster" : ",legacy");
  EXPECT_TRUE(contract_exact("device_sampler_token_vs_cpu", shape, tok_mis));
  EXPECT_TRUE(contract_exact("device_sampler_errors_vs_cpu", shape, err_mis));
  EXPECT_TRUE(contract_exact("device_sampler_top_logprobs", shape, top_mis));
  EXPECT_TRUE(contract("device_sampler_logprob_abs_err", shape, lp_err, 1e-5));
  EXPECT_GT(errors, 0u);  // the NaN / +inf / bad-history rows were exercised
  EXPECT_GT(rows_checked, errors);
}

namespace {

/// Statistical test: N seeded requests sample the same row (one draw each, seeds base + i) through
/// the DeviceSampler; every token's count must lie within 5 binomial standard deviations (+1) of N * p
/// under sampling_distribution(), and tokens of probability 0 must never appear. Deterministic.
void check_frequencies(const std::vector<float>& row, const SamplingParams& params, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& output, const std::vector<int32_t>& mask, int64_t N,
                       int64_t rows_per_call, const std::string& name) {
  const int64_t V = int64_t(row.size());
  std::vector<float> masked = row;
  mask_tokens(masked, mask);
  const std::vector<double> dist = sampling_distribution(masked, prompt, output, params);
  DeviceSampler ds(rows_per_call, V);
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  int64_t bad_tokens = 0;
  std::vector<float> x;
  DeviceBuffer<float> dx(size_t(rows_per_call * V));
  for (int64_t n0 = 0; n0 < N; n0 += rows_per_call) {
    const int64_t R = std::min(rows_per_call, N - n0);
    x.clear();
    for (int64_t i = 0; i < R; ++i) x.insert(x.end(), row.begin(), row.end());
    dx.upload(x);
    std::vector<Sampler> samplers;
    samplers.reserve(size_t(R));
    for (int64_t i = 0; i < R; ++i) {
      SamplingParams p = params;
      p.seed = int64_t(mix64(uint64_t(n0 + i) * 0x51ull + 99) >> 2);
      samplers.emplace_back(p);
    }
    std::vector<RowSampling> rows;
    for (const Sampler& s : samplers) rows.push_back({&s, prompt, output});
    std::vector<SampleResult> out;
    ds.sample(dx.data(), rows, mask, out, nullptr);
    for (const SampleResult& o : out) {
      if (!o.error.empty() || o.token < 0 || o.token >= V) {
        ++bad_tokens;
        continue;
      }
      ++count[size_t(o.token)];
    }
  }
  int64_t outside = 0;
  double max_z = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double p = dist[size_t(v)], c = double(count[size_t(v)]), mean = double(N) * p;
    if (p == 0.0) {
      outside += count[size_t(v)] > 0;
      continue;
    }
    const double sd = std::sqrt(double(N) * p * (1 - p));
    const double dev = std::abs(c - mean);
    max_z = std::max(max_z, sd > 0 ? dev / sd : (dev > 0 ? INFINITY : 0.0));
    outside += dev > 5 * sd + 1;
  }
  const std::string shape = fmt::format("{},V={},N={},max_z={:.2f}", name, V, N, max_z);
  EXPECT_TRUE(contract_exact("sample_frequencies_vs_distribution", shape, size_t(outside + bad_tokens)));
}

/// The toy distributions x options of the statistical test.
void frequency_suite(int64_t N, bool include_large) {
  struct Opt {
    const char* name;
    float t;
    int32_t k;
    float top_p, min_p, rep, freq, pres;
    bool mask;
  };
  const Opt opts[] = {
      {"temp1", 1.0f, 0, 1.0f, 0, 1, 0, 0, false},        {"temp0.6", 0.6f, 0, 1.0f, 0, 1, 0, 0, false},
      {"temp1.7", 1.7f, 0, 1.0f, 0, 1, 0, 0, false},      {"top_k3", 1.0f, 3, 1.0f, 0, 1, 0, 0, false},
      {"top_p0.8", 1.0f, 0, 0.8f, 0, 1, 0, 0, false},     {"min_p0.1", 1.0f, 0, 1.0f, 0.1f, 1, 0, 0, false},
      {"rep1.5", 1.0f, 0, 1.0f, 0, 1.5f, 0, 0, false},    {"rep0.7", 1.0f, 0, 1.0f, 0, 0.7f, 0, 0, false},
      {"freq0.6", 1.0f, 0, 1.0f, 0, 1, 0.6f, 0, false},   {"pres-0.8", 1.0f, 0, 1.0f, 0, 1, 0, -0.8f, false},
      {"mask", 1.0f, 0, 1.0f, 0, 1, 0, 0, true},          {"greedy+pen", 0.0f, 0, 1.0f, 0, 1.2f, 0.5f, 0.5f, true},
      {"all", 0.9f, 8, 0.9f, 0.05f, 1.2f, 0.3f, 0.4f, true}};
  const int64_t Vs[] = {5, 12, 50};
  uint64_t seed = 7700;
  for (int64_t V : Vs) {
    std::vector<float> row = randn(size_t(V), seed++, 1.2f);
    for (float& v : row) v = std::round(v * 8.0f) / 8.0f;
    const std::vector<int32_t> prompt = {0, 1, int32_t(V - 1), 2};
    const std::vector<int32_t> output = {1, 1, 3 % int32_t(V), int32_t(V / 2)};
    const std::vector<int32_t> mask = {int32_t(V / 2), 0};
    for (const Opt& o : opts) {
      SamplingParams p;
      p.temperature = o.t, p.top_k = o.k, p.top_p = o.top_p, p.min_p = o.min_p;
      p.repetition_penalty = o.rep, p.frequency_penalty = o.freq, p.presence_penalty = o.pres;
      check_frequencies(row, p, prompt, output, o.mask ? mask : std::vector<int32_t>{}, N, std::min<int64_t>(N, 4096),
                        o.name);
    }
  }
  if (!include_large) return;
  // The real vocabulary with a peaked head: ten tokens carry all but ~3e-4 of the mass (at T = 1), the
  // tail is long and flat. (A heavier tail would make some tail token appear twice in 2048 draws by
  // chance, beyond its per-token binomial bound.)
  const int64_t V = 248320;
  std::vector<float> row = randn(size_t(V), 7799, 1.0f);
  for (float& v : row) v -= 14.0f;
  for (int i = 0; i < 10; ++i) row[size_t(1000 + 20000 * i)] = 6.0f - 0.4f * float(i);
  const std::vector<int32_t> prompt = {1000, 21000, 5}, output = {41000, 41000};
  std::vector<int32_t> mask;
  for (int64_t i = 0; i < 100; ++i) mask.push_back(int32_t(V - 1 - i));
  mask.push_back(61000);
  const Opt big[] = {{"big_temp1", 1.0f, 0, 1.0f, 0, 1, 0, 0, true},
                     {"big_top_p0.9", 1.0f, 0, 0.9f, 0, 1, 0, 0, false},
                     {"big_all", 0.8f, 6, 0.95f, 0.01f, 1.3f, 0.4f, 0.2f, true}};
  for (const Opt& o : big) {
    SamplingParams p;
    p.temperature = o.t, p.top_k = o.k, p.top_p = o.top_p, p.min_p = o.min_p;
    p.repetition_penalty = o.rep, p.frequency_penalty = o.freq, p.presence_penalty = o.pres;
    check_frequencies(row, p, prompt, output, o.mask ? mask : std::vector<int32_t>{}, 2048, 256, o.name);
  }
}

// ---- the cluster kernel: edge cases and batch invariance ------------------------------------------

/// Row r's parameters (and row contents where the case needs them) for the edge-case suite.
SamplingParams edge_params(int64_t r, uint64_t h, float* row, int64_t V) {
  SamplingParams p;
  p.seed = int64_t(h >> 2);
  p.temperature = 1.0f;
  switch (r % 12) {
    case 0: p.top_k = int32_t(V + 5); break;  // top_k larger than the vocabulary: off
    case 1: p.temperature = 0.7f, p.top_p = 1.0f; break;
    case 2: p.top_p = 1e-6f; break;  // only the best token survives
    case 3:  // all-equal logits: top_k keeps the 7 lowest ids
      std::fill(row, row + V, 0.25f);
      p.top_k = 7;
      break;
    case 4:  // all-equal logits: top_p = 0.5 keeps the lowest half of the ids; top_logprobs ties by id
      std::fill(row, row + V, -1.5f);
      p.temperature = 0.9f, p.top_p = 0.5f, p.logprobs = true, p.top_logprobs = 20;
      break;
    case 5: {  // -inf everywhere but one id
      const int64_t keep = int64_t(h % uint64_t(V));
      std::fill(row, row + V, -INFINITY);
      row[keep] = 1.0f;
      p.temperature = 1.2f, p.top_k = 3, p.top_p = 0.9f, p.min_p = 0.1f, p.logprobs = true, p.top_logprobs = 5;
      break;
    }
    case 6: {  // the same, greedy with a repetition penalty
      const int64_t keep = int64_t((h >> 7) % uint64_t(V));
      std::fill(row, row + V, -INFINITY);
      row[keep] = -2.0f;
      p.temperature = 0.0f, p.repetition_penalty = 1.3f, p.logprobs = true, p.top_logprobs = 3;
      break;
    }
    case 7: p = mixed_params(h); break;
    case 8: p.temperature = 1.5f, p.min_p = 0.5f; break;
    case 9: p.top_k = 1; break;  // == greedy
    case 10:
      p.temperature = 0.6f, p.top_k = 2, p.top_p = 0.3f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.3f;
      break;
    default: p.temperature = 0.0f, p.logprobs = true, p.top_logprobs = 20; break;
  }
  return p;
}

bool same_result(const SampleResult& a, const SampleResult& b) {
  if (a.token != b.token || a.error != b.error || !same_bytes(&a.logprob, &b.logprob, 1)) return false;
  if (a.top_logprobs.size() != b.top_logprobs.size()) return false;
  for (size_t j = 0; j < a.top_logprobs.size(); ++j)
    if (a.top_logprobs[j].token != b.top_logprobs[j].token ||
        !same_bytes(&a.top_logprobs[j].logprob, &b.top_logprobs[j].logprob, 1))
      return false;
  return true;
}

/// Edge-case rows through the DeviceSampler (cluster kernel) vs the CPU sampler (tokens equal,
/// logprobs within 1e-5, the same top ids); then every row sampled alone (a 1-row call of another
/// sampler) must give bitwise the same result as inside the batch.
void check_edge_cases(int64_t R, int64_t V, uint64_t seed) {
  auto x = make_rows(R, V, seed);
  std::vector<Sampler> samplers;
  samplers.reserve(size_t(R));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(R)), outputs(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const uint64_t h = mix64(seed * 17 + uint64_t(r));
    float* row = x.data() + r * V;
    samplers.emplace_back(edge_params(r, h, row, V));
    prompts[size_t(r)] = make_history(row, V, 1 + h % 40, h + 11);
    outputs[size_t(r)] = make_history(row, V, (h >> 8) % 20, h + 13);
  }
  std::vector<RowSampling> rows;
  for (int64_t r = 0; r < R; ++r) rows.push_back({&samplers[size_t(r)], prompts[size_t(r)], outputs[size_t(r)]});
  DeviceSampler ds(R, V);
  ASSERT_TRUE(ds.cluster_kernel());
  auto dx = cuda::to_device(x);
  std::vector<SampleResult> got;
  ds.sample(dx.data(), rows, {}, got, nullptr);
  std::vector<SampleResult> want(static_cast<size_t>(R));
  parallel_for(size_t(R), [&](size_t r) {
    std::vector<float> row(x.begin() + int64_t(r) * V, x.begin() + int64_t(r + 1) * V);
    want[r] = samplers[r].sample(row, prompts[r], outputs[r]);
  });
  size_t tok_mis = 0, top_mis = 0, alone_mis = 0;
  double lp_err = 0;
  for (size_t r = 0; r < size_t(R); ++r) {
    tok_mis += !got[r].error.empty() || got[r].token != want[r].token;
    if (samplers[r].params().logprobs) {
      const double e = std::abs(double(got[r].logprob) - double(want[r].logprob));
      lp_err = std::max(lp_err, got[r].logprob == want[r].logprob ? 0.0 : (std::isfinite(e) ? e : INFINITY));
    }
    bool top_ok = got[r].top_logprobs.size() == want[r].top_logprobs.size();
    for (size_t j = 0; top_ok && j < want[r].top_logprobs.size(); ++j) {
      const TokenLogprob &a = got[r].top_logprobs[j], &b = want[r].top_logprobs[j];
      top_ok = a.token == b.token && (a.logprob == b.logprob || std::abs(double(a.logprob) - double(b.logprob)) <= 1e-5);
    }
    top_mis += !top_ok;
  }
  // Alone: each row in a 1-row call (the same raw row), against the batch's result.
  DeviceSampler one(1, V);
  DeviceBuffer<float> d1(static_cast<size_t>(V));
  for (size_t r = 0; r < size_t(R); ++r) {
    d1.upload(std::vector<float>(x.begin() + int64_t(r) * V, x.begin() + int64_t(r + 1) * V));
    std::vector<SampleResult> o;
    one.sample(d1.data(), std::span<const RowSampling>(&rows[r], 1), {}, o, nullptr);
    alone_mis += !same_result(o[0], got[r]);
  }
  const std::string shape = fmt::format("rows={},V={},edge_cases", R, V);
  EXPECT_TRUE(contract_exact("cluster_edge_token_vs_cpu", shape, tok_mis));
  EXPECT_TRUE(contract_exact("cluster_edge_top_logprobs", shape, top_mis));
  EXPECT_TRUE(contract("cluster_edge_logprob_abs_err", shape, lp_err, 1e-5));
  EXPECT_TRUE(contract_exact("cluster_alone_vs_batch_bitwise", shape, alone_mis));
}

}  // namespace
}  // namespace sampling_test

using namespace sampling_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(SamplingCluster, LegacyDeviceSamplerMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  check_device_sampler(64, 32000, 2, 8310, false);
}

TEST(SamplingCluster, EdgeCasesAndBatchInvariance) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 8500;
  for (int64_t R : {1, 2, 63, 64, 65, 256}) check_edge_cases(R, 50000, seed++);
  check_edge_cases(24, 248320, seed++);
  check_edge_cases(12, 37, seed++);  // fewer ids than threads of one CTA
}

TEST(Sampling, DeviceSamplerMatchesCpu) {
  MOEFOLD_REQUIRE_GPU();
  check_device_sampler(128, 32000, 4, 8300);
  check_device_sampler(64, 248320, 3, 8301);
}

TEST(Sampling, DeviceSamplerFrequencies) {
  MOEFOLD_REQUIRE_GPU();
  frequency_suite(20000, true);
}


// -0.0 and +0.0 are equal logits for the CPU sampler (a tie: lower id first). A top_k / top_p boundary
// or a top_logprobs cut inside a run of signed zeros must keep the lowest ids, whatever the sign bits
// (the selection key once ordered +0.0 above -0.0 and kept the wrong zeros).
TEST(SamplingSmall, SignedZeroTies) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t V = 64;
  std::vector<float> row(static_cast<size_t>(V), -1.0f);
  for (int i = 0; i < 10; ++i) row[size_t(i)] = 1.0f;
  for (int i = 10; i < 40; ++i) row[size_t(i)] = i % 2 ? 0.0f : -0.0f;
  SamplingParams k;
  k.temperature = 1.0f;
  k.top_k = 15;  // the 10 ones and zeros 10..14
  check_frequencies(row, k, {}, {}, {}, 4096, 4096, "signed_zeros_top_k");
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.8f;  // the ones carry ~0.41 of the mass, the zeros ~0.45: the boundary lies among the zeros
  check_frequencies(row, p, {}, {}, {}, 4096, 4096, "signed_zeros_top_p");
  // top_logprobs: 15 entries, the zeros by id.
  auto dx = cuda::to_device(row);
  auto dn = cuda::to_device(std::vector<int32_t>{15});
  DeviceBuffer<double> dlse(1);
  DeviceBuffer<int32_t> dids(cu::kMaxTopLogprobs);
  DeviceBuffer<float> dlp(cu::kMaxTopLogprobs);
  cu::raw_logprobs_rows(dx.data(), 1, V, 0, dn.data(), dlse.data(), dids.data(), dlp.data(), nullptr, nullptr);
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids = dids.download();
  const auto want = top_logprobs(row, 15);
  size_t bad = 0;
  for (size_t j = 0; j < want.size(); ++j) bad += ids[j] != want[j].token;
  EXPECT_TRUE(contract_exact("top_logprobs_signed_zero_ties", "V=64,n=15", bad));
}

TEST(SamplingSmall, DeviceSamplerErrorsAndLimits) {
  MOEFOLD_REQUIRE_GPU();
  EXPECT_THROW(DeviceSampler(0, 10), Error);
  DeviceSampler ds(2, 10);
  auto dx = cuda::to_device(std::vector<float>(30, 0.5f));
  std::vector<RowSampling> rows(3);
  std::vector<SampleResult> out;
  EXPECT_THROW(ds.sample(dx.data(), rows, {}, out, nullptr), Error);  // 3 rows > capacity 2
  // Every id masked: nothing can be sampled (the CPU throws too).
  SamplingParams g;
  g.temperature = 0;
  const Sampler s(g);
  rows = {{&s, {}, {}}};
  std::vector<int32_t> all;
  for (int32_t i = 0; i < 10; ++i) all.push_back(i);
  ds.sample(dx.data(), rows, all, out, nullptr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token, -1);
  EXPECT_NE(out[0].error.find("-inf"), std::string::npos) << out[0].error;
}
