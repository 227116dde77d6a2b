// sampling_test: token selection (greedy argmax, sampled selection draw by draw, the distribution of
// stratified draws) of the pass-by-pass kernels and the cluster kernel against the CPU sampler.
#include "cuda/sampling_test/sampling_test_util.h"

namespace sampling_test {
namespace {

struct HostArgmax {
  int32_t token;
  int32_t flags;
};

HostArgmax host_argmax(const float* x, int64_t V) {
  HostArgmax r{-1, 0};
  float best = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(x[i])) {
      r.flags |= cu::kSampleNaN;
      continue;
    }
    if (x[i] == INFINITY) r.flags |= cu::kSamplePosInf;
    if (r.token < 0 || x[i] > best) best = x[i], r.token = int32_t(i);
  }
  if (r.token < 0 || best == -INFINITY) r.flags |= cu::kSampleEmpty;
  return r;
}

void check_argmax(int64_t R, int64_t V, int64_t live, uint64_t seed, bool cluster = false) {
  auto x = make_logits(R, V, seed);
  for (int64_t r = 0; r < R; ++r) {
    float* row = x.data() + r * V;
    const int64_t a = int64_t(mix64(seed + uint64_t(r)) % uint64_t(V)), b = int64_t(mix64(seed + 99 + uint64_t(r)) % uint64_t(V));
    row[a] = row[b] = 100.0f;  // a tie at the maximum
    if (r % 5 == 1) row[std::min(a, b) == 0 ? 1 : 0] = NAN, row[V / 2] = NAN;  // NaN rows
    if (r % 7 == 3) row[std::max(a, b)] = NAN;                                  // NaN on a tied max
  }
  if (R >= 3) {
    float* row = x.data() + 2 * V;
    for (int64_t i = 0; i < V; ++i) row[i] = i % 3 ? -INFINITY : NAN;  // nothing selectable
  }
  auto dx = cuda::to_device(x);
  DeviceBuffer<int32_t> dt(static_cast<size_t>(R)), df(static_cast<size_t>(R));
  dt.upload(std::vector<int32_t>(size_t(R), -7));
  df.upload(std::vector<int32_t>(size_t(R), -7));
  auto dl = cuda::to_device(std::vector<int32_t>{int32_t(live)});
  if (cluster)
    cluster_select(dx.data(), R, V, nullptr, dt.data(), df.data(), live < R ? dl.data() : nullptr);
  else
    cu::argmax_rows(dx.data(), R, V, 0, dt.data(), df.data(), live < R ? dl.data() : nullptr, nullptr);
  sync();
  const auto tok = dt.download(), fl = df.download();
  size_t mis = 0, cpu_mis = 0;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (int64_t r = 0; r < R; ++r) {
    if (r >= live) {
      mis += tok[size_t(r)] != -7 || fl[size_t(r)] != -7;
      continue;
    }
    const HostArgmax h = host_argmax(x.data() + r * V, V);
    mis += tok[size_t(r)] != h.token || fl[size_t(r)] != h.flags;
    if (h.flags == 0)  // the CPU sampler accepts only clean rows
      cpu_mis += sample_token(std::span<const float>(x.data() + r * V, static_cast<size_t>(V)), {}, {}, greedy, 1, 0).token !=
                 tok[size_t(r)];
  }
  const std::string shape = fmt::format("rows={},live={},V={},ties+nan{}", R, live, V, cluster ? ",cluster" : "");
  EXPECT_TRUE(contract_exact("argmax", shape, mis));
  EXPECT_TRUE(contract_exact("argmax_vs_cpu_sampler", shape, cpu_mis));
}

void check_sampling_vs_cpu(int64_t R, int64_t V, int draws, uint64_t seed, bool cluster = false) {
  auto x = make_logits(R, V, seed);
  std::vector<float> temp(static_cast<size_t>(R)), top_p(static_cast<size_t>(R)), min_p(static_cast<size_t>(R));
  std::vector<int32_t> top_k(static_cast<size_t>(R));
  std::vector<SamplingParams> params(static_cast<size_t>(R));
  std::vector<uint64_t> seeds(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    params[size_t(r)] = row_params(mix64(seed + uint64_t(r)));
    temp[size_t(r)] = params[size_t(r)].temperature;
    top_k[size_t(r)] = params[size_t(r)].top_k;
    top_p[size_t(r)] = params[size_t(r)].top_p;
    min_p[size_t(r)] = params[size_t(r)].min_p;
    seeds[size_t(r)] = mix64(seed * 31 + uint64_t(r));
  }
  auto dx = cuda::to_device(x);
  auto dtemp = cuda::to_device(temp), dtp = cuda::to_device(top_p), dmp = cuda::to_device(min_p);
  auto dtk = cuda::to_device(top_k);
  DeviceBuffer<double> du(static_cast<size_t>(R));
  DeviceBuffer<int32_t> dt(static_cast<size_t>(R)), df(static_cast<size_t>(R));
  cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), dmp.data(), du.data()};
  size_t mis = 0, total = 0, flag_bad = 0;
  for (int d = 0; d < draws; ++d) {
    std::vector<double> u(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) u[size_t(r)] = sampling_uniform(seeds[size_t(r)], uint64_t(d));
    du.upload(u);
    if (cluster)
      cluster_select(dx.data(), R, V, &sp, dt.data(), df.data(), nullptr);
    else
      cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), df.data(), nullptr, nullptr);
    sync();
    const auto tok = dt.download(), fl = df.download();
    std::vector<int32_t> want(static_cast<size_t>(R));
    parallel_for(size_t(R), [&](size_t r) {
      want[r] = sample_token(std::span<const float>(x.data() + int64_t(r) * V, static_cast<size_t>(V)), {}, {}, params[r], seeds[r],
                             uint64_t(d))
                    .token;
    });
    for (int64_t r = 0; r < R; ++r) {
      mis += tok[size_t(r)] != want[size_t(r)];
      flag_bad += fl[size_t(r)] != 0;
      ++total;
    }
  }
  const std::string shape = fmt::format("rows={},V={},draws={},mixed_params{}", R, V, draws, cluster ? ",cluster" : "");
  EXPECT_TRUE(contract("sample_vs_cpu_mismatch_frac", shape, double(mis) / double(total), 2e-3));
  EXPECT_TRUE(contract_exact("sample_flags", shape, flag_bad));
}

void check_sampling_distribution(int64_t V, const SamplingParams& p, int N, uint64_t seed, bool cluster = false) {
  auto row = make_logits(1, V, seed);
  std::vector<float> x;
  x.reserve(size_t(N * V));
  for (int i = 0; i < N; ++i) x.insert(x.end(), row.begin(), row.end());
  std::vector<double> u(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) u[size_t(i)] = (i + 0.5) / N;  // stratified draws
  auto dx = cuda::to_device(x);
  auto dtemp = cuda::to_device(std::vector<float>(size_t(N), p.temperature));
  auto dtp = cuda::to_device(std::vector<float>(size_t(N), p.top_p));
  auto dmp = cuda::to_device(std::vector<float>(size_t(N), p.min_p));
  auto dtk = cuda::to_device(std::vector<int32_t>(size_t(N), p.top_k));
  auto du = cuda::to_device(u);
  DeviceBuffer<int32_t> dt(static_cast<size_t>(N));
  cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), dmp.data(), du.data()};
  if (cluster)
    cluster_select(dx.data(), N, V, &sp, dt.data(), nullptr, nullptr);
  else
    cu::sample_rows(dx.data(), N, V, 0, sp, dt.data(), nullptr, nullptr, nullptr);
  sync();
  const auto tok = dt.download();
  const auto dist = sampling_distribution(row, {}, {}, p);
  std::vector<double> freq(size_t(V), 0.0);
  for (int32_t t : tok) {
    if (t < 0 || t >= V) {
      freq.assign(size_t(V), INFINITY);
      break;
    }
    freq[size_t(t)] += 1.0 / N;
  }
  double maxdiff = 0;
  for (int64_t i = 0; i < V; ++i) maxdiff = std::max(maxdiff, std::abs(freq[size_t(i)] - dist[size_t(i)]));
  const std::string shape = fmt::format("V={},N={},T={:g},top_k={},top_p={:g},min_p={:g}{}", V, N, p.temperature,
                                        p.top_k, p.top_p, p.min_p, cluster ? ",cluster" : "");
  // Stratified u: each token's count is within one draw of N * p (inverse CDF over ascending ids).
  EXPECT_TRUE(contract("sample_distribution_maxdiff", shape, maxdiff, 1.01 / N));
}

}  // namespace
}  // namespace sampling_test

using namespace sampling_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(SamplingCluster, ArgmaxExact) {
  MOEFOLD_REQUIRE_GPU();
  ASSERT_TRUE(cu::cluster_sampler_supported(248320));
  uint64_t seed = 7600;
  for (int64_t R : {1, 17, 64})
    for (int64_t V : {151936, 248320}) check_argmax(R, V, R, seed++, true);
  check_argmax(65, 32000, 17, seed++, true);
  check_argmax(5, 3000, 3, seed++, true);
}

TEST(SamplingCluster, MatchesCpuSampler) {
  MOEFOLD_REQUIRE_GPU();
  check_sampling_vs_cpu(64, 32000, 8, 7100, true);
  check_sampling_vs_cpu(17, 151936, 2, 7200, true);
  check_sampling_vs_cpu(6, 2000, 2, 7500, true);
}

TEST(SamplingCluster, Distribution) {
  MOEFOLD_REQUIRE_GPU();
  SamplingParams p;
  p.temperature = 0.8f;
  check_sampling_distribution(64, p, 4096, 7300, true);
  p.top_k = 20;
  p.top_p = 0.9f;
  check_sampling_distribution(64, p, 4096, 7301, true);
  p.top_k = 0;
  p.top_p = 0.7f;
  p.min_p = 0.02f;
  p.temperature = 1.3f;
  check_sampling_distribution(300, p, 4096, 7302, true);
}

TEST(Sampling, ArgmaxExact) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (int64_t R : {1, 17, 64})
    for (int64_t V : {151936, 248320}) check_argmax(R, V, R, seed++);
  check_argmax(65, 32000, 17, seed++);
}

TEST(Sampling, MatchesCpuSampler) {
  MOEFOLD_REQUIRE_GPU();
  check_sampling_vs_cpu(64, 32000, 8, 7100);
  check_sampling_vs_cpu(17, 151936, 2, 7200);
}

TEST(Sampling, Distribution) {
  MOEFOLD_REQUIRE_GPU();
  SamplingParams p;
  p.temperature = 0.8f;
  check_sampling_distribution(64, p, 4096, 7300);
  p.top_k = 20;
  p.top_p = 0.9f;
  check_sampling_distribution(64, p, 4096, 7301);
  p.top_k = 0;
  p.top_p = 0.7f;
  p.min_p = 0.02f;
  p.temperature = 1.3f;
  check_sampling_distribution(300, p, 4096, 7302);
}

TEST(SamplingSmall, Basic) {
  MOEFOLD_REQUIRE_GPU();
  check_argmax(5, 3000, 3, 7400);
  check_sampling_vs_cpu(6, 2000, 1, 7500);
}
