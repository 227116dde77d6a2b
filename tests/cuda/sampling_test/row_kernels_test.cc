// sampling_test: the kernels around the selection (masks, penalties, raw logprobs) against their CPU
// counterparts, bytes or 1e-5.
#include "cuda/sampling_test/sampling_test_util.h"

namespace sampling_test {
namespace {

// ---- masks, penalties, raw logprobs and the whole DeviceSampler ------------------------------------

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

}  // namespace
}  // namespace sampling_test

using namespace sampling_test;  // NOLINT(google-build-using-namespace): the helpers above

TEST(SamplingCluster, PenaltiesAndRawLogprobs) {
  MOEFOLD_REQUIRE_GPU();
  check_penalties(64, 248320, 64, 8100, true);
  check_penalties(65, 32000, 40, 8101, true);
  check_raw_logprobs(64, 248320, 8200, true);
  check_raw_logprobs(24, 13, 8201, true);
}

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

TEST(SamplingSmall, MasksPenaltiesLogprobs) {
  MOEFOLD_REQUIRE_GPU();
  check_mask(5, 3000, 3, 8400);
  check_penalties(6, 2000, 4, 8401);
  check_raw_logprobs(6, 3000, 8402);
  check_device_sampler(9, 2000, 2, 8403);
}
