// Contract tests of the GPU token selection against the CPU sampler (runtime/sampler.h), which
// defines the semantics: greedy argmax must match exactly (ties -> lower id, NaN never chosen and
// flagged); sampled selection (temperature, min_p, top_k, top_p, inverse CDF with the host's
// uniform u = sampling_uniform(seed, step)) is compared draw by draw with sample_token() on the
// same u (logits quantised to create many ties), and its distribution with sampling_distribution()
// through 4096 stratified draws. Padding rows are left untouched.
// The kernels around the selection are checked against their CPU counterparts: mask_logits_rows vs
// mask_tokens and apply_penalties_rows vs apply_penalties (bytes), raw_logprobs_rows vs the CPU's
// log-sum-exp and top_logprobs (1e-5, same ids); the whole DeviceSampler vs Sampler::sample on the
// masked rows with every option, histories and failing rows (tokens equal: 0 mismatches allowed);
// and its token frequencies over seeded draws vs sampling_distribution (5-sigma binomial bounds,
// fixed seeds) for toy distributions (V = 5, 12, 50) and the real V = 248,320 with a peaked head.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/sampling.h"
#include "models/cuda/device_sampler.h"
#include "runtime/sampler.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

/// The cluster kernel with only tokens / flags (and the sampling parameters when sp is given).
void cluster_select(float* x, int64_t R, int64_t V, const cu::SampleRowParams* sp, int32_t* tokens, int32_t* flags,
                    const int32_t* live) {
  cu::ClusterSampleArgs a;
  if (sp) a.sample = *sp;
  a.tokens = tokens;
  a.flags = flags;
  cu::sample_rows_cluster(x, R, V, 0, a, live, nullptr);
}

/// Logits ~ N(0, 2^2) quantised to multiples of 1/16 (ties everywhere), rows [R, V].
std::vector<float> make_logits(int64_t R, int64_t V, uint64_t seed) {
  auto v = randn(size_t(R * V), seed, 2.0f);
  for (float& x : v) x = std::round(x * 16.0f) / 16.0f;
  return v;
}

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

SamplingParams row_params(uint64_t h) {
  SamplingParams p;
  const float temps[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.3f};
  const int32_t ks[] = {0, 1, 2, 20, 50, 0, 1000};
  const float ps[] = {1.0f, 0.95f, 0.8f, 0.5f, 1.0f, 0.1f};
  const float mps[] = {0.0f, 0.0f, 0.05f, 0.0f};
  p.temperature = temps[h % 5];
  p.top_k = ks[(h / 5) % 7];
  p.top_p = ps[(h / 35) % 6];
  p.min_p = mps[(h / 210) % 4];
  return p;
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

// ---- masks, penalties, raw logprobs and the whole DeviceSampler ------------------------------------

/// Logits ~ N(0, 1.5^2) rounded to 1/8 (ties), with a few -inf entries.
std::vector<float> make_rows(int64_t R, int64_t V, uint64_t seed) {
  auto v = randn(size_t(R * V), seed, 1.5f);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i] * 8.0f) / 8.0f;
    if (mix64(seed ^ (i * 0x9E37ull)) % 997 == 0) v[i] = -INFINITY;
  }
  return v;
}

/// n ids uniform in [0, V).
std::vector<int32_t> random_history(int64_t V, size_t n, uint64_t seed) {
  std::vector<int32_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = int32_t(mix64(seed * 0x9E37ull + i) % uint64_t(V));
  return h;
}

bool same_bytes(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

void check_mask(int64_t R, int64_t V, int64_t live, uint64_t seed) {
  auto x = make_rows(R, V, seed);
  std::vector<int32_t> ids = {0, int32_t(V - 1), -3, int32_t(V), int32_t(V + 100), 5 % int32_t(V), 5 % int32_t(V)};
  for (int j = 0; j < 300; ++j) ids.push_back(int32_t(mix64(seed + uint64_t(j)) % uint64_t(V)));
  auto dx = cuda::to_device(x);
  auto di = cuda::to_device(ids);
  auto dn = cuda::to_device(std::vector<int32_t>{int32_t(ids.size())});
  auto dl = cuda::to_device(std::vector<int32_t>{int32_t(live)});
  cu::mask_logits_rows(dx.data(), R, V, 0, di.data(), dn.data(), int64_t(ids.size()), dl.data(), nullptr);
  sync();
  const auto got = dx.download();
  size_t bad = 0;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> want(x.begin() + r * V, x.begin() + (r + 1) * V);
    if (r < live) mask_tokens(want, ids);  // padding rows: untouched
    bad += !same_bytes(got.data() + r * V, want.data(), size_t(V));
  }
  EXPECT_TRUE(contract_exact("mask_logits", fmt::format("rows={},live={},V={},ids={}", R, live, V, ids.size()), bad));
}

/// Random penalty parameters of one row (every penalty alone and together, negative ones too).
SamplingParams penalty_params(uint64_t h) {
  SamplingParams p;
  const float reps[] = {1.0f, 1.3f, 0.7f, 1.0f, 2.0f};
  const float freqs[] = {0.0f, 0.5f, -0.3f, 0.0f};
  const float pres[] = {0.0f, 0.0f, 0.8f, -0.5f};
  p.repetition_penalty = reps[h % 5];
  p.frequency_penalty = freqs[(h / 5) % 4];
  p.presence_penalty = pres[(h / 20) % 4];
  return p;
}

/// A history of n ids: half among the row's 30 largest logits (so that penalties matter), with repeats.
std::vector<int32_t> make_history(const float* row, int64_t V, size_t n, uint64_t seed) {
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
  const size_t k = std::min<size_t>(30, size_t(V));
  std::partial_sort(order.begin(), order.begin() + long(k), order.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  std::vector<int32_t> h(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t z = mix64(seed + i);
    h[i] = z % 2 ? order[(z >> 8) % k] : int32_t((z >> 8) % uint64_t(V));
  }
  return h;
}

void check_penalties(int64_t R, int64_t V, int64_t live, uint64_t seed, bool cluster = false) {
  auto x = make_rows(R, V, seed);
  std::vector<float> rep(static_cast<size_t>(R)), freq(static_cast<size_t>(R)), pres(static_cast<size_t>(R));
  std::vector<int32_t> offsets{0}, tokens, counts;
  std::vector<float> want = x, raw_saved;
  for (int64_t r = 0; r < R; ++r) {
    const SamplingParams p = penalty_params(mix64(seed * 7 + uint64_t(r)));
    rep[size_t(r)] = p.repetition_penalty, freq[size_t(r)] = p.frequency_penalty, pres[size_t(r)] = p.presence_penalty;
    const float* row = x.data() + r * V;
    const auto prompt = make_history(row, V, size_t(mix64(seed + 5 + uint64_t(r)) % 200), seed * 3 + uint64_t(r));
    const auto output = make_history(row, V, size_t(mix64(seed + 9 + uint64_t(r)) % 120), seed * 5 + uint64_t(r));
    // The device input: distinct ids (prompt too when the repetition penalty is on) + output counts.
    std::map<int32_t, int32_t> cnt;
    if (p.repetition_penalty != 1.0f)
      for (int32_t t : prompt) cnt[t];
    for (int32_t t : output) ++cnt[t];
    for (auto [t, c] : cnt) {
      tokens.push_back(t);
      counts.push_back(c);
      raw_saved.push_back(row[t]);
    }
    offsets.push_back(int32_t(tokens.size()));
    if (r < live) apply_penalties(std::span<float>(want.data() + r * V, size_t(V)), prompt, output, p);
  }
  auto dx = cuda::to_device(x);
  auto drep = cuda::to_device(rep), dfreq = cuda::to_device(freq), dpres = cuda::to_device(pres);
  auto doff = cuda::to_device(offsets), dtok = cuda::to_device(tokens), dcnt = cuda::to_device(counts);
  DeviceBuffer<float> dsaved(std::max<size_t>(tokens.size(), 1));
  dsaved.fill_bytes(0xFF);
  auto dl = cuda::to_device(std::vector<int32_t>{int32_t(live)});
  const cu::PenaltyRows pr{drep.data(), dfreq.data(), dpres.data(), doff.data(), dtok.data(), dcnt.data(), dsaved.data()};
  DeviceBuffer<int32_t> dsel(static_cast<size_t>(R));
  if (cluster) {  // greedy selection after the penalties: the rows are modified the same way
    cu::ClusterSampleArgs a;
    a.penalties = pr;
    a.tokens = dsel.data();
    cu::sample_rows_cluster(dx.data(), R, V, 0, a, dl.data(), nullptr);
  } else {
    cu::apply_penalties_rows(dx.data(), R, V, 0, pr, dl.data(), nullptr);
  }
  sync();
  const auto got = dx.download();
  const auto saved = dsaved.download();
  size_t bad = 0, bad_saved = 0;
  for (int64_t r = 0; r < R; ++r) bad += !same_bytes(got.data() + r * V, want.data() + r * V, size_t(V));
  for (size_t j = 0; j < size_t(offsets[size_t(live)]); ++j) bad_saved += !same_bytes(&saved[j], &raw_saved[j], 1);
  const std::string shape =
      fmt::format("rows={},live={},V={},entries={}{}", R, live, V, tokens.size(), cluster ? ",cluster" : "");
  EXPECT_TRUE(contract_exact("penalties_vs_apply_penalties", shape, bad));
  EXPECT_TRUE(contract_exact("penalties_saved_raw", shape, bad_saved));
}

void check_raw_logprobs(int64_t R, int64_t V, uint64_t seed, bool cluster = false) {
  auto x = make_rows(R, V, seed);
  std::vector<int32_t> top_n(static_cast<size_t>(R));
  const int32_t ns[] = {-1, 0, 1, 5, 20, 7};
  for (int64_t r = 0; r < R; ++r) top_n[size_t(r)] = ns[r % 6];
  auto dx = cuda::to_device(x);
  auto dn = cuda::to_device(top_n);
  DeviceBuffer<double> dlse(static_cast<size_t>(R));
  DeviceBuffer<int32_t> dids(size_t(R) * cu::kMaxTopLogprobs);
  DeviceBuffer<float> dlp(size_t(R) * cu::kMaxTopLogprobs);
  dlse.fill_bytes(0xFF);
  dids.fill_bytes(0xFF);
  DeviceBuffer<int32_t> dtok(static_cast<size_t>(R));
  DeviceBuffer<float> dtlp(static_cast<size_t>(R));
  if (cluster) {  // greedy, with the raw logprobs of every row with top_n >= 0
    cu::ClusterSampleArgs a;
    a.top_n = dn.data();
    a.lse = dlse.data();
    a.top_ids = dids.data();
    a.top_logprobs = dlp.data();
    a.logprob = dtlp.data();
    a.tokens = dtok.data();
    cu::sample_rows_cluster(dx.data(), R, V, 0, a, nullptr, nullptr);
  } else {
    cu::raw_logprobs_rows(dx.data(), R, V, 0, dn.data(), dlse.data(), dids.data(), dlp.data(), nullptr, nullptr);
  }
  sync();
  const auto lse = dlse.download();
  const auto ids = dids.download();
  const auto lp = dlp.download();
  size_t bad_ids = 0, untouched = 0;
  double lse_err = 0, lp_err = 0;
  for (int64_t r = 0; r < R; ++r) {
    const std::span<const float> row(x.data() + r * V, size_t(V));
    if (top_n[size_t(r)] < 0) {
      untouched += std::isnan(lse[size_t(r)]) ? 0 : 1;  // still poison
      continue;
    }
    // The CPU's definition: m + log(sum exp(x - m)) in double, sequentially.
    const float m = *std::max_element(row.begin(), row.end());
    double s = 0;
    for (float v : row) s += std::exp(double(v) - double(m));
    lse_err = std::max(lse_err, std::abs(lse[size_t(r)] - (double(m) + std::log(s))));
    const auto want = top_logprobs(row, top_n[size_t(r)]);
    for (size_t j = 0; j < want.size(); ++j) {
      bad_ids += ids[size_t(r) * cu::kMaxTopLogprobs + j] != want[j].token;
      const float g = lp[size_t(r) * cu::kMaxTopLogprobs + j];
      lp_err = std::max(lp_err, want[j].logprob == -INFINITY ? (g == -INFINITY ? 0.0 : INFINITY)
                                                             : std::abs(double(g) - double(want[j].logprob)));
    }
  }
  const std::string shape = fmt::format("rows={},V={},top_n=-1..20{}", R, V, cluster ? ",cluster" : "");
  EXPECT_TRUE(contract("raw_lse_abs_err", shape, lse_err, 1e-9));
  EXPECT_TRUE(contract("top_logprobs_abs_err", shape, lp_err, 1e-5));
  EXPECT_TRUE(contract_exact("top_logprobs_ids", shape, bad_ids));
  EXPECT_TRUE(contract_exact("raw_logprobs_rows_off_untouched", shape, untouched));
}

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

/// DeviceSampler vs the CPU sampler on the same masked rows, histories and (seed, step): tokens
/// equal, logprobs within 1e-5, top_logprobs the same ids; failing rows fail on both sides only.
void check_device_sampler(int64_t R, int64_t V, int calls, uint64_t seed, bool cluster = true) {
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

TEST(SamplingCluster, PenaltiesAndRawLogprobs) {
  MOEFOLD_REQUIRE_GPU();
  check_penalties(64, 248320, 64, 8100, true);
  check_penalties(65, 32000, 40, 8101, true);
  check_raw_logprobs(64, 248320, 8200, true);
  check_raw_logprobs(24, 13, 8201, true);
}

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

namespace {
}  // namespace

TEST(Sampling, MaskExact) {
  MOEFOLD_REQUIRE_GPU();
  check_mask(17, 248320, 17, 8000);
  check_mask(65, 32000, 33, 8001);
}

TEST(Sampling, PenaltiesExact) {
  MOEFOLD_REQUIRE_GPU();
  check_penalties(64, 248320, 64, 8100);
  check_penalties(65, 32000, 40, 8101);
}

TEST(Sampling, RawLogprobs) {
  MOEFOLD_REQUIRE_GPU();
  check_raw_logprobs(64, 248320, 8200);
  check_raw_logprobs(24, 13, 8201);  // top_n clamps to the vocabulary; -inf entries listed last
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

TEST(SamplingSmall, MasksPenaltiesLogprobs) {
  MOEFOLD_REQUIRE_GPU();
  check_mask(5, 3000, 3, 8400);
  check_penalties(6, 2000, 4, 8401);
  check_raw_logprobs(6, 3000, 8402);
  check_device_sampler(9, 2000, 2, 8403);
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

// ---- timings (run with --gtest_also_run_disabled_tests --gtest_filter='*Perf*') -----------------
TEST(SamplingPerf, DISABLED_Timings) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t V = 248320;
  for (int64_t R : {1, 64}) {
    auto x = make_logits(R, V, 9000);
    auto dx = cuda::to_device(x);
    DeviceBuffer<int32_t> dt(static_cast<size_t>(R));
    double us = time_us([&] { cu::argmax_rows(dx.data(), R, V, 0, dt.data(), nullptr, nullptr, nullptr); });
    perf_line("argmax", fmt::format("rows={},V={}", R, V), us, fmt::format("TB/s={:.2f}", double(R * V) * 4 / us * 1e-6));
    struct P {
      float t;
      int32_t k;
      float p;
      const char* name;
    };
    for (const P& pp : {P{0.8f, 0, 1.0f, "temp"}, P{0.8f, 50, 1.0f, "top_k=50"}, P{0.8f, 0, 0.9f, "top_p=0.9"},
                        P{0.8f, 20, 0.95f, "top_k=20,top_p=0.95"}}) {
      auto dtemp = cuda::to_device(std::vector<float>(size_t(R), pp.t));
      auto dtk = cuda::to_device(std::vector<int32_t>(size_t(R), pp.k));
      auto dtp = cuda::to_device(std::vector<float>(size_t(R), pp.p));
      auto du = cuda::to_device(std::vector<double>(size_t(R), 0.37));
      cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), nullptr, du.data()};
      us = time_us([&] { cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), nullptr, nullptr, nullptr); });
      perf_line("sample", fmt::format("rows={},V={},{}", R, V, pp.name), us, "-");
    }
  }
}

// The whole DeviceSampler call (uploads, kernels, downloads, one synchronisation) per step size.
// The logits are not restored between calls (masking and penalties are idempotent enough for timing).
TEST(SamplingPerf, DISABLED_DeviceSampler) {
  MOEFOLD_REQUIRE_GPU();
  const int64_t V = 248320;
  std::vector<int32_t> mask;
  for (int64_t i = 0; i < 200; ++i) mask.push_back(int32_t(V - 1 - i));
  const std::vector<int32_t> prompt = random_history(V, 1024, 1), output = random_history(V, 256, 2);
  for (int64_t R : {1, 64, 256}) {
    auto dx = cuda::to_device(make_logits(R, V, 9100));
    DeviceSampler ds(R, V);
    struct Case {
      const char* name;
      SamplingParams p;
    };
    SamplingParams greedy;
    greedy.temperature = 0;
    SamplingParams sampled;
    sampled.temperature = 0.8f, sampled.top_k = 50, sampled.top_p = 0.95f, sampled.seed = 1;
    SamplingParams full = sampled;
    full.repetition_penalty = 1.1f, full.frequency_penalty = 0.2f, full.presence_penalty = 0.2f;
    full.logprobs = true, full.top_logprobs = 5;
    for (const Case& c : {Case{"greedy", greedy}, Case{"top_k=50,top_p=0.95", sampled},
                          Case{"+penalties(1024+256),logprobs,top5", full}}) {
      const Sampler s(c.p);
      const std::vector<RowSampling> rows(size_t(R), RowSampling{&s, prompt, output});
      std::vector<SampleResult> out;
      const double us = time_us([&] { ds.sample(dx.data(), rows, mask, out, nullptr); });
      perf_line("device_sampler", fmt::format("rows={},V={},{}", R, V, c.name), us, "-");
    }
  }
}

// The cluster kernel beside the pass-by-pass kernels, in the order A B B A inside this run, with the
// device copy bandwidth measured first (run with --gtest_also_run_disabled_tests
// --gtest_filter='*ClusterVsLegacy*').
TEST(SamplingPerf, DISABLED_ClusterVsLegacy) {
  MOEFOLD_REQUIRE_GPU();
  {
    const size_t bytes = size_t(256) << 20;
    DeviceBuffer<uint8_t> a(bytes), b(bytes);
    const double us = time_us([&] {
      MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr));
    });
    perf_line("d2d_copy", "bytes=256MiB", us, fmt::format("TB/s={:.2f}(read+write)", 2.0 * double(bytes) / us * 1e-6));
  }
  const int64_t V = 248320;
  std::printf("cluster size %d, %d clusters resident\n", cu::cluster_sampler_size(V),
              cu::cluster_sampler_active_clusters(V));
  auto abba = [](const std::string& name, const std::string& shape, const std::function<void()>& a,
                 const std::function<void()>& b, double bytes) {
    const double a1 = time_us(a), b1 = time_us(b), b2 = time_us(b), a2 = time_us(a);
    perf_line(name + "_legacy", shape, 0.5 * (a1 + a2), fmt::format("A={:.1f},{:.1f}", a1, a2));
    perf_line(name + "_cluster", shape, 0.5 * (b1 + b2),
              fmt::format("B={:.1f},{:.1f} x{:.1f} TB/s={:.2f}", b1, b2, (a1 + a2) / (b1 + b2), bytes / (0.5 * (b1 + b2)) * 1e-6));
  };
  for (int64_t R : {1, 64, 256}) {
    auto dx = cuda::to_device(make_logits(R, V, 9000));
    DeviceBuffer<int32_t> dt(static_cast<size_t>(R));
    const double bytes = double(R * V) * 4;
    abba("argmax", fmt::format("rows={},V={}", R, V),
         [&] { cu::argmax_rows(dx.data(), R, V, 0, dt.data(), nullptr, nullptr, nullptr); },
         [&] { cluster_select(dx.data(), R, V, nullptr, dt.data(), nullptr, nullptr); }, bytes);
    struct P {
      float t;
      int32_t k;
      float p, min_p;
      const char* name;
    };
    for (const P& pp : {P{0.8f, 0, 1.0f, 0.0f, "temp"}, P{0.8f, 50, 1.0f, 0.0f, "top_k=50"},
                        P{0.8f, 0, 0.9f, 0.0f, "top_p=0.9"}, P{0.8f, 20, 0.95f, 0.0f, "top_k=20,top_p=0.95"},
                        P{0.8f, 0, 0.9f, 0.05f, "min_p=0.05,top_p=0.9"}}) {
      auto dtemp = cuda::to_device(std::vector<float>(size_t(R), pp.t));
      auto dtk = cuda::to_device(std::vector<int32_t>(size_t(R), pp.k));
      auto dtp = cuda::to_device(std::vector<float>(size_t(R), pp.p));
      auto dmp = cuda::to_device(std::vector<float>(size_t(R), pp.min_p));
      auto du = cuda::to_device(std::vector<double>(size_t(R), 0.37));
      cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), dmp.data(), du.data()};
      abba("sample", fmt::format("rows={},V={},{}", R, V, pp.name),
           [&] { cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), nullptr, nullptr, nullptr); },
           [&] { cluster_select(dx.data(), R, V, &sp, dt.data(), nullptr, nullptr); }, bytes);
    }
    {  // kernels only, every option: penalties (1024 prompt + 256 output ids per row), logprobs, top-5
      const auto prompt = random_history(V, 1024, 1), output = random_history(V, 256, 2);
      std::map<int32_t, int32_t> cnt;
      for (int32_t t : prompt) cnt[t];
      for (int32_t t : output) ++cnt[t];
      std::vector<int32_t> offsets{0}, toks, counts;
      for (int64_t r = 0; r < R; ++r) {
        for (auto [t, n] : cnt) toks.push_back(t), counts.push_back(n);
        offsets.push_back(int32_t(toks.size()));
      }
      auto doff = cuda::to_device(offsets), dtoks = cuda::to_device(toks), dcnt = cuda::to_device(counts);
      auto drep = cuda::to_device(std::vector<float>(size_t(R), 1.1f));
      auto dfr = cuda::to_device(std::vector<float>(size_t(R), 0.2f));
      auto dpr = cuda::to_device(std::vector<float>(size_t(R), 0.2f));
      DeviceBuffer<float> dsaved(toks.size());
      const cu::PenaltyRows pen{drep.data(), dfr.data(), dpr.data(), doff.data(), dtoks.data(), dcnt.data(), dsaved.data()};
      auto dtemp = cuda::to_device(std::vector<float>(size_t(R), 0.8f));
      auto dtk = cuda::to_device(std::vector<int32_t>(size_t(R), 50));
      auto dtp = cuda::to_device(std::vector<float>(size_t(R), 0.95f));
      auto du = cuda::to_device(std::vector<double>(size_t(R), 0.37));
      auto dn = cuda::to_device(std::vector<int32_t>(size_t(R), 5));
      DeviceBuffer<double> dlse(static_cast<size_t>(R));
      DeviceBuffer<int32_t> dids(size_t(R) * cu::kMaxTopLogprobs);
      DeviceBuffer<float> dtlp(size_t(R) * cu::kMaxTopLogprobs), dlp(static_cast<size_t>(R));
      const cu::SampleRowParams sp{dtemp.data(), dtk.data(), dtp.data(), nullptr, du.data()};
      cu::ClusterSampleArgs ca;
      ca.sample = sp, ca.top_n = dn.data(), ca.lse = dlse.data(), ca.top_ids = dids.data();
      ca.top_logprobs = dtlp.data(), ca.logprob = dlp.data(), ca.penalties = pen, ca.tokens = dt.data();
      abba("sample", fmt::format("rows={},V={},top_k=50,top_p=0.95,+penalties(1024+256),logprobs,top5", R, V),
           [&] {
             cu::raw_logprobs_rows(dx.data(), R, V, 0, dn.data(), dlse.data(), dids.data(), dtlp.data(), nullptr, nullptr);
             cu::apply_penalties_rows(dx.data(), R, V, 0, pen, nullptr, nullptr);
             cu::sample_rows(dx.data(), R, V, 0, sp, dt.data(), nullptr, nullptr, nullptr);
             cu::token_logprobs_rows(dx.data(), R, V, 0, dt.data(), dn.data(), dlse.data(), &pen, dlp.data(), nullptr,
                                     nullptr);
           },
           [&] { cu::sample_rows_cluster(dx.data(), R, V, 0, ca, nullptr, nullptr); }, bytes);
    }
  }
  // The whole DeviceSampler call (uploads, kernels, downloads, one synchronisation).
  std::vector<int32_t> mask;
  for (int64_t i = 0; i < 200; ++i) mask.push_back(int32_t(V - 1 - i));
  const std::vector<int32_t> prompt = random_history(V, 1024, 1), output = random_history(V, 256, 2);
  for (int64_t R : {1, 64, 256}) {
    auto dx = cuda::to_device(make_logits(R, V, 9100));
    DeviceSampler ds(R, V);
    SamplingParams greedy;
    greedy.temperature = 0;
    SamplingParams sampled;
    sampled.temperature = 0.8f, sampled.top_k = 50, sampled.top_p = 0.95f, sampled.seed = 1;
    SamplingParams top_p = sampled;
    top_p.top_k = 0, top_p.top_p = 0.9f;
    SamplingParams full = sampled;
    full.repetition_penalty = 1.1f, full.frequency_penalty = 0.2f, full.presence_penalty = 0.2f;
    full.logprobs = true, full.top_logprobs = 5;
    struct Case {
      const char* name;
      SamplingParams p;
    };
    for (const Case& c : {Case{"greedy", greedy}, Case{"top_k=50,top_p=0.95", sampled}, Case{"top_p=0.9", top_p},
                          Case{"top_k=50,top_p=0.95,+penalties(1024+256),logprobs,top5", full}}) {
      const Sampler s(c.p);
      const std::vector<RowSampling> rows(size_t(R), RowSampling{&s, prompt, output});
      std::vector<SampleResult> out;
      abba("device_sampler", fmt::format("rows={},V={},{}", R, V, c.name),
           [&] {
             ds.set_cluster_kernel(false);
             ds.sample(dx.data(), rows, mask, out, nullptr);
           },
           [&] {
             ds.set_cluster_kernel(true);
             ds.sample(dx.data(), rows, mask, out, nullptr);
           },
           double(R * V) * 4);
    }
  }
}
