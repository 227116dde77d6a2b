// Issue 16's "Done when" items on the CPU backend that prefix_cache_test.cc proves for greedy replies
// only, here with seeded sampling (tokens and logprobs bitwise equal to a cold run): every prompt
// length 1 .. 130 of the list against every shorter cached prefix on and off the grid, a prompt of a
// few thousand tokens against prefixes on and off the grid (greedy and seeded), a 10-turn chat, two
// and eight requests sharing a prefix with unaligned starts in one step, a hit followed by a forced
// preemption, and a cached prefix evicted while a request that resumed from it runs; cached_tokens
// exactly the largest restorable prefix (the 64-token grid for hybrids, whole pages for dense models).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>

#include "fixture_util.h"
#include "models/load_model.h"
#include "runtime/prefix_cache.h"
#include "scheduler_replies.h"

using namespace moefold;
using test::Engine;
using test::Reply;
using test::greedy_params;
using test::lcg_prompt;
using test::run_requests;
using test::seeded_params;

namespace {

Engine make_engine(const Model& m, bool caching, int32_t blocks = 512, int32_t budget = 4096, int32_t seqs = 8,
                   int32_t snapshot_slots = 64, int32_t interval = 0) {
  Engine e;
  e.runner = std::make_unique<ModelRunner>(m, RunnerOptions{blocks, 16, seqs, caching, snapshot_slots, interval});
  e.sched = std::make_unique<Scheduler>(*e.runner, SchedulerOptions{seqs, budget, 0, std::min(8192, blocks * 16)});
  return e;
}

class PrefixCacheSampling : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    static std::map<std::string, std::unique_ptr<Model>> models;
    auto& m = models[GetParam()];
    if (!m) m = load_model((test::kFixtures / GetParam()).string(), LoadFormat::Safetensors);
    model_ = m.get();
    V_ = model_->config().vocab_size;
    hybrid_ = model_->config().num_layers_of(LayerType::LinearAttention) > 0;
    grid_ = hybrid_ ? 64 : 16;
  }
  /// cached_tokens of a `len`-token prompt after its `prefix`-token prefix ran alone: the prefix's last
  /// grid point (hybrid) or whole pages (dense), leaving at least one token to compute.
  int32_t expected_hit(int32_t prefix, int32_t len) const {
    const int32_t g = (prefix / grid_) * grid_;
    if (hybrid_) return g <= len - 1 ? g : 0;
    return std::min(g, ((len - 1) / grid_) * grid_);
  }
  Reply fresh(const std::vector<int32_t>& p, const SamplingParams& sp, int32_t blocks = 512) {
    Engine e = make_engine(*model_, false, blocks);
    return run_requests(*e.sched, {p}, sp)[0];
  }
  const Model* model_ = nullptr;
  int64_t V_ = 0;
  bool hybrid_ = false;
  int32_t grid_ = 16;
};

TEST_P(PrefixCacheSampling, SeededResumedEqualsFreshForEveryLengthAndShorterPrefix) {
  const std::vector<int32_t> base = lcg_prompt(130, 21, V_);
  for (int32_t len : {1, 63, 64, 65, 127, 128, 129, 130}) {
    const std::vector<int32_t> p(base.begin(), base.begin() + len);
    const Reply cold = fresh(p, seeded_params(3));
    for (int32_t pre : {1, 16, 17, 63, 64, 65, 100, 128, 129}) {
      if (pre > len) continue;
      Engine e = make_engine(*model_, true);
      run_requests(*e.sched, {std::vector<int32_t>(base.begin(), base.begin() + pre)}, seeded_params(1, 99));
      const Reply warm = run_requests(*e.sched, {p}, seeded_params(3))[0];
      EXPECT_EQ(warm, cold) << "len " << len << " cached prefix " << pre;
      EXPECT_EQ(warm.cached, expected_hit(pre, len)) << "len " << len << " cached prefix " << pre;
    }
  }
}

// A 2,100-token prompt (snapshots every 512 tokens besides the prompts' ends) against a prefix on the
// 64-token and page grids (greedy) and one off both (seeded); each lookup finds the largest restorable
// point of the prefix that ran.
TEST_P(PrefixCacheSampling, ThousandsOfTokensAgainstOnAndOffGridPrefixes) {
  const int32_t len = 2100;
  const std::vector<int32_t> p = lcg_prompt(len, 22, V_);
  for (bool seeded : {false, true}) {
    const SamplingParams sp = seeded ? seeded_params(2) : greedy_params(2);
    const Reply cold = fresh(p, sp);
    Engine e = make_engine(*model_, true, 512, 4096, 8, 64, 512);
    for (int32_t pre : {seeded ? 1000 : 2048}) {  // off both grids (seeded), on both (greedy)
      e.runner->clear_prefix_cache();
      run_requests(*e.sched, {std::vector<int32_t>(p.begin(), p.begin() + pre)}, greedy_params(1));
      const Reply warm = run_requests(*e.sched, {p}, sp)[0];
      EXPECT_EQ(warm, cold) << (seeded ? "seeded" : "greedy") << " prefix " << pre;
      EXPECT_EQ(warm.cached, expected_hit(pre, len)) << (seeded ? "seeded" : "greedy") << " prefix " << pre;
    }
  }
}

TEST_P(PrefixCacheSampling, SeededTenTurnChat) {
  Engine e = make_engine(*model_, true);
  std::vector<int32_t> conv = lcg_prompt(41, 23, V_);
  int32_t prev_prompt = 0;
  for (int turn = 0; turn < 10; ++turn) {
    const SamplingParams sp = seeded_params(5, 500 + uint64_t(turn));
    const Reply warm = run_requests(*e.sched, {conv}, sp)[0];
    EXPECT_EQ(warm, fresh(conv, sp)) << "turn " << turn << " (" << conv.size() << " tokens)";
    EXPECT_EQ(warm.cached, (prev_prompt / grid_) * grid_) << "turn " << turn;
    prev_prompt = int32_t(conv.size());
    conv.insert(conv.end(), warm.tokens.begin(), warm.tokens.end());
    const std::vector<int32_t> user = lcg_prompt(13 + 5 * turn, 120 + turn, V_);
    conv.insert(conv.end(), user.begin(), user.end());
  }
  EXPECT_EQ(e.runner->prefix_cache_stats().queries, 10);
}

TEST_P(PrefixCacheSampling, SeededRequestsSharingAPrefixInOneStep) {
  const std::vector<int32_t> shared = lcg_prompt(150, 24, V_);
  for (int n : {2, 8}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < n; ++i) {  // shared prefixes of unaligned lengths, then distinct tails
      std::vector<int32_t> q(shared.begin(), shared.begin() + 67 + 11 * i);
      const std::vector<int32_t> tail = lcg_prompt(3 + 7 * i, 240 + i, V_);
      q.insert(q.end(), tail.begin(), tail.end());
      prompts.push_back(std::move(q));
    }
    Engine e = make_engine(*model_, true, 512, 4096, 8, 64, 64);
    run_requests(*e.sched, {std::vector<int32_t>(shared.begin(), shared.begin() + 140)}, greedy_params(1));
    std::map<RequestId, size_t> who;
    for (size_t i = 0; i < prompts.size(); ++i) who[e.sched->add(prompts[i], seeded_params(4, 70 + i))] = i;
    std::vector<Reply> warm(prompts.size());
    for (int step = 0; e.sched->has_work() && step < 1000; ++step) {
      for (const TokenOutput& o : e.sched->step()) {
        EXPECT_TRUE(o.error.empty()) << o.error;
        Reply& r = warm[who.at(o.id)];
        r.tokens.push_back(o.token);
        r.logprobs.push_back(o.logprob);
        r.cached = o.cached_tokens;
      }
      if (step == 0) {
        EXPECT_EQ(e.sched->last_step().size(), size_t(n)) << "all prefills share the first step";
      }
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(warm[size_t(i)], fresh(prompts[size_t(i)], seeded_params(4, 70 + uint64_t(i)))) << n << " requests, #" << i;
      EXPECT_EQ(warm[size_t(i)].cached, expected_hit(std::min(67 + 11 * i, 140), int32_t(prompts[size_t(i)].size())))
          << n << " requests, #" << i;
    }
  }
}

// 20 pages: four requests resuming from a cached 128-token prefix and generating 40 tokens do not fit
// at once; the preempted ones resume (from the cache) and still give the cold seeded replies.
TEST_P(PrefixCacheSampling, SeededPreemptionAfterAHit) {
  const std::vector<int32_t> shared = lcg_prompt(128, 25, V_);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> q = shared;
    const std::vector<int32_t> tail = lcg_prompt(9 + 2 * i, 310 + i, V_);
    q.insert(q.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(q));
  }
  Engine e = make_engine(*model_, true, 20, 4096, 4);
  run_requests(*e.sched, {shared}, greedy_params(1));
  const int64_t pre0 = e.sched->stats().num_preemptions;
  const std::vector<Reply> warm = run_requests(*e.sched, prompts, seeded_params(40));
  EXPECT_GT(e.sched->stats().num_preemptions, pre0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(warm[i], fresh(prompts[i], seeded_params(40))) << "#" << i;
    EXPECT_EQ(warm[i].cached, 128) << "#" << i;
  }
  EXPECT_EQ(e.sched->stats().kv_blocks_used, 0);
}

// 30 pages: b resumes from a's cached pages and holds them; c needs more pages than are free, so the
// cached pages nobody holds are evicted while b runs; b's seeded reply is the cold one.
TEST_P(PrefixCacheSampling, SeededEvictionWhileARequestUsesThePrefix) {
  const std::vector<int32_t> a = lcg_prompt(200, 26, V_), c = lcg_prompt(220, 27, V_);
  std::vector<int32_t> b = a;
  b.push_back(9);
  const Reply cold = fresh(b, seeded_params(30));
  Engine e = make_engine(*model_, true, 30, 4096, 4);
  run_requests(*e.sched, {a}, greedy_params(1));
  run_requests(*e.sched, {lcg_prompt(64, 28, V_)}, greedy_params(1));  // cached pages nobody will hold
  const RequestId rb = e.sched->add(b, seeded_params(30));
  Reply got;
  auto take = [&](const std::vector<TokenOutput>& outs) {
    for (const TokenOutput& o : outs) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.id != rb) continue;
      got.tokens.push_back(o.token);
      got.logprobs.push_back(o.logprob);
    }
  };
  take(e.sched->step());
  EXPECT_EQ(e.sched->cached_tokens(rb), 192);
  const int64_t evicted0 = e.runner->prefix_cache_stats().evicted_pages;
  e.sched->add(c, seeded_params(10, 5));
  for (int step = 0; e.sched->has_work() && step < 10000; ++step) take(e.sched->step());
  EXPECT_GT(e.runner->prefix_cache_stats().evicted_pages, evicted0);
  EXPECT_EQ(got, cold);
  EXPECT_EQ(e.sched->stats().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheSampling, ::testing::Values("qwen3_5_moe", "qwen3_next", "qwen3", "deepseek_v32"),
                         [](const auto& info) { return info.param; });

}  // namespace
