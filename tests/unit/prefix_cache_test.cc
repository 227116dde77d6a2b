// Prefix cache: a request resumed from cached pages (and, for hybrid models, a DeltaNet state
// snapshot) must produce bitwise the tokens and logprobs of a cold run, whatever prefix was cached,
// alone or batched, across preemption and eviction; cached_tokens must be exactly the largest
// restorable prefix. Fixtures: tests/fixtures/qwen3_5_moe and qwen3_next (hybrid), qwen3 (dense).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "fixture_util.h"
#include "models/load_model.h"
#include "ops/cpu/gated_delta_net.h"
#include "runtime/model_runner.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"

using namespace moefold;
using moefold::cpu::GdnShape;
using moefold::cpu::GdnStateSnapshot;
using moefold::cpu::gated_delta_rule_chunked;

namespace {

// ---------------------------------------------------------------------------------------------
// PrefixCache on its own.

std::vector<int32_t> page(int32_t a, int32_t n = 4) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) out.push_back(a + i);
  return out;
}

TEST(PrefixCachePool, RefCountsAndLruEviction) {
  PrefixCache c(3, 4, 8, 0, 0);
  const int32_t a = c.allocate(), b = c.allocate(), d = c.allocate();
  EXPECT_EQ(c.allocate(), -1);  // all held
  const uint64_t ha = c.register_page(a, 0, page(0));
  const uint64_t hb = c.register_page(b, ha, page(4));
  c.acquire(a);  // a second holder
  c.release(a);
  EXPECT_EQ(c.num_free(), 0);
  c.release(b);  // cached, evictable
  c.release(a);
  c.release(d);  // unregistered: free
  EXPECT_EQ(c.num_free(), 3);
  EXPECT_EQ(c.find_page(0, ha, page(0)), a);
  EXPECT_EQ(c.find_page(ha, hb, page(4)), b);
  EXPECT_EQ(c.allocate(), d);  // the free page first
  EXPECT_EQ(c.allocate(), b);  // then the least recently used cached one (b was released first)
  EXPECT_EQ(c.find_page(ha, hb, page(4)), -1);
  EXPECT_EQ(c.find_page(0, ha, page(0)), a);
  EXPECT_EQ(c.stats().evicted_pages, 1);
  EXPECT_THROW(c.release(a), Error);  // a is cached with no holder
}

TEST(PrefixCachePool, LookupComparesTokensNotOnlyHashes) {
  PrefixCache c(2, 4, 8, 0, 0);
  const int32_t a = c.allocate();
  const uint64_t h = c.register_page(a, 0, page(0));
  EXPECT_EQ(c.find_page(0, h, page(0)), a);
  EXPECT_EQ(c.find_page(0, h, page(1)), -1);  // same hash asked for other tokens: no hit
  EXPECT_EQ(c.find_page(7, h, page(0)), -1);  // other parent
}

TEST(PrefixCachePool, SnapshotsDieWithTheirPageAndWithinTheirSlots) {
  PrefixCache c(4, 4, 10, 2, 100);
  const int32_t a = c.allocate(), b = c.allocate();
  const uint64_t ha = c.register_page(a, 0, page(0)), hb = c.register_page(b, ha, page(4));
  const int32_t s1 = *c.reserve_snapshot(), s2 = *c.reserve_snapshot();
  EXPECT_GE(s1, 10);
  EXPECT_FALSE(c.reserve_snapshot().has_value());  // both pending
  c.commit_snapshot(s1, ha);
  c.commit_snapshot(s2, hb);
  EXPECT_EQ(c.stats().snapshot_bytes, 200);
  EXPECT_EQ(c.find_snapshot(ha), s1);  // ha now most recently used
  const int32_t s3 = *c.reserve_snapshot();  // evicts the LRU snapshot (hb)
  EXPECT_EQ(s3, s2);
  EXPECT_FALSE(c.has_snapshot(hb));
  c.cancel_snapshot(s3);
  c.release(b);
  c.release(a);  // LRU: b, a
  c.allocate();
  c.allocate();  // the free pages
  c.allocate();  // evicts b
  c.allocate();  // evicts a, and with it the snapshot keyed on a
  EXPECT_FALSE(c.has_snapshot(ha));
  EXPECT_EQ(c.stats().snapshots, 0);
}

TEST(PrefixCacheKernel, ChunkedRuleSnapshotIsTheStateOfTheShorterCall) {
  const GdnShape sh{2, 4, 8, 6};
  const int64_t T = 150, kd = sh.num_k_heads * sh.k_dim, vd = sh.num_v_heads * sh.v_dim;
  std::vector<float> q(size_t(T * kd)), k(size_t(T * kd)), v(size_t(T * vd)), g(size_t(T * 4)), beta(size_t(T * 4));
  uint32_t x = 1;
  auto rnd = [&] { return float((x = x * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f; };
  for (auto* vec : {&q, &k, &v, &beta}) for (float& f : *vec) f = rnd();
  for (float& f : g) f = -std::abs(rnd());
  const size_t S = size_t(4 * 8 * 6);
  std::vector<float> full(S, 0.0f), snap1(S), snap2(S), o(size_t(T * vd));
  std::vector<GdnStateSnapshot> snaps{{0, snap1.data()}, {1, snap2.data()}};
  gated_delta_rule_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), full.data(), o.data(), T, sh, 64, snaps);
  for (int64_t len : {64, 128}) {
    std::vector<float> st(S, 0.0f), o2(size_t(len * vd));
    gated_delta_rule_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), st.data(), o2.data(), len, sh);
    EXPECT_EQ(0, std::memcmp(st.data(), (len == 64 ? snap1 : snap2).data(), S * sizeof(float))) << len;
  }
}

// ---------------------------------------------------------------------------------------------
// Through the scheduler, on the fixtures.

struct Reply {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int32_t cached = -1;
  bool operator==(const Reply& o) const { return tokens == o.tokens && logprobs == o.logprobs; }
};

void PrintTo(const Reply& r, std::ostream* os) {
  *os << "tokens [";
  for (int32_t t : r.tokens) *os << t << " ";
  *os << "] logprobs [";
  for (float l : r.logprobs) *os << fmt::format("{:a} ", l);
  *os << "] cached " << r.cached;
}

std::vector<int32_t> make_prompt(int n, int seed, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint32_t x = uint32_t(seed) * 2654435761u + 17;
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t((x = x * 1103515245u + 12345u) >> 9) % int32_t(vocab - 2);
  return p;
}

SamplingParams greedy(int n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  p.logprobs = true;
  return p;
}
SamplingParams seeded(int n) {
  SamplingParams p = greedy(n);
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 1234;
  return p;
}

/// Runs `prompts` (all queued at once) to completion; returns a reply per prompt.
std::vector<Reply> run(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p,
                       int64_t* preemptions = nullptr) {
  std::map<RequestId, size_t> who;
  for (size_t i = 0; i < prompts.size(); ++i) who[s.add(prompts[i], p)] = i;
  std::vector<Reply> out(prompts.size());
  const int64_t pre0 = s.stats().num_preemptions;
  for (int step = 0; s.has_work() && step < 100000; ++step)
    for (const TokenOutput& o : s.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      Reply& r = out[who.at(o.id)];
      r.tokens.push_back(o.token);
      r.logprobs.push_back(o.logprob);
      if (r.cached < 0) r.cached = o.cached_tokens;
      EXPECT_EQ(r.cached, o.cached_tokens);
    }
  EXPECT_FALSE(s.has_work());
  if (preemptions) *preemptions = s.stats().num_preemptions - pre0;
  return out;
}

struct Engine {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Scheduler> sched;
};

Engine make_engine(const Model& m, bool caching, int32_t blocks = 512, int32_t budget = 4096, int32_t seqs = 8,
                   int32_t snapshot_slots = 64, int32_t interval = 0, KvCacheDtype kv = KvCacheDtype::Auto) {
  RunnerOptions ro{blocks, 16, seqs, caching, snapshot_slots, interval, kv};
  Engine e;
  e.runner = std::make_unique<ModelRunner>(m, ro);
  e.sched = std::make_unique<Scheduler>(*e.runner, SchedulerOptions{seqs, budget, 0, std::min(4096, blocks * 16)});
  return e;
}

class PrefixCacheFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    static std::map<std::string, std::unique_ptr<Model>> models;
    auto& m = models[GetParam()];
    if (!m) m = load_model((test::kFixtures / GetParam()).string(), LoadFormat::Safetensors);
    model_ = m.get();
    V_ = model_->config().vocab_size;
    hybrid_ = model_->config().num_layers_of(LayerType::LinearAttention) > 0;
  }
  /// The cached_tokens a prompt of `len` tokens gets after a lone prompt of `prefix` tokens (a prefix
  /// of it) ran: the whole pages of that prefix, or for a hybrid model its last 64-token grid point;
  /// always leaving at least one token to compute.
  int32_t expected_hit(int32_t prefix, int32_t len) const {
    const int32_t grid = hybrid_ ? 64 : 16;
    const int32_t g = (prefix / grid) * grid;
    if (hybrid_) return g <= len - 1 ? g : 0;
    return std::min(g, ((len - 1) / grid) * grid);
  }
  /// The reply of a cold run (caching off, fresh runner).
  Reply fresh(const std::vector<int32_t>& p, const SamplingParams& sp) {
    Engine e = make_engine(*model_, false);
    return run(*e.sched, {p}, sp)[0];
  }
  const Model* model_ = nullptr;
  int64_t V_ = 0;
  bool hybrid_ = false;
};

TEST_P(PrefixCacheFixture, ResumedEqualsFreshForEveryShorterPrefix) {
  const std::vector<int32_t> base = make_prompt(130, 1, V_);
  for (int32_t len : {1, 63, 64, 65, 127, 128, 129, 130}) {
    const std::vector<int32_t> p(base.begin(), base.begin() + len);
    const Reply cold = fresh(p, greedy(3));
    for (int32_t pre : {1, 16, 17, 63, 64, 65, 100, 128, 129}) {
      if (pre > len) continue;
      Engine e = make_engine(*model_, true);
      run(*e.sched, {std::vector<int32_t>(base.begin(), base.begin() + pre)}, greedy(1));
      const Reply warm = run(*e.sched, {p}, greedy(3))[0];
      EXPECT_EQ(warm, cold) << "len " << len << " cached prefix " << pre;
      EXPECT_EQ(warm.cached, expected_hit(pre, len)) << "len " << len << " cached prefix " << pre;
    }
  }
}

// --kv-cache-dtype fp8: cached pages are reused as stored (e4m3 bytes, one scale per layer and KV head),
// so a resumed request equals a cold fp8 run bitwise; and the fp8 replies differ from the fp32 pages'
// (the pages really are quantised). MLA (deepseek_v32) refuses fp8 pages with a clear error.
TEST_P(PrefixCacheFixture, Fp8KvCacheResumedEqualsFresh) {
  const KvCacheDtype fp8 = KvCacheDtype::Fp8E4m3;
  if (model_->config().mla.enabled()) {
    try {
      make_engine(*model_, true, 512, 4096, 8, 64, 0, fp8);
      ADD_FAILURE() << "an MLA model took --kv-cache-dtype fp8";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MLA"), std::string::npos) << e.what();
    }
    return;
  }
  const std::vector<int32_t> base = make_prompt(130, 7, V_);
  bool any_differs = false;
  for (int32_t len : {65, 130}) {
    const std::vector<int32_t> p(base.begin(), base.begin() + len);
    Engine cold_e = make_engine(*model_, false, 512, 4096, 8, 64, 0, fp8);
    const Reply cold = run(*cold_e.sched, {p}, greedy(4))[0];
    any_differs = any_differs || !(cold == fresh(p, greedy(4)));
    for (int32_t pre : {17, 64, 129}) {
      if (pre > len) continue;
      Engine e = make_engine(*model_, true, 512, 4096, 8, 64, 0, fp8);
      run(*e.sched, {std::vector<int32_t>(base.begin(), base.begin() + pre)}, greedy(1));
      const Reply warm = run(*e.sched, {p}, greedy(4))[0];
      EXPECT_EQ(warm, cold) << "len " << len << " cached prefix " << pre;
      EXPECT_EQ(warm.cached, expected_hit(pre, len)) << "len " << len << " cached prefix " << pre;
    }
  }
  EXPECT_TRUE(any_differs) << "fp8 pages gave the fp32 pages' logprobs bitwise: nothing was quantised";
}

TEST_P(PrefixCacheFixture, SeededSamplingResumedEqualsFresh) {
  const std::vector<int32_t> base = make_prompt(130, 2, V_);
  for (int32_t len : {65, 129, 130}) {
    const std::vector<int32_t> p(base.begin(), base.begin() + len);
    const Reply cold = fresh(p, seeded(6));
    for (int32_t pre : {64, 100, 128}) {
      if (pre > len) continue;
      Engine e = make_engine(*model_, true);
      run(*e.sched, {std::vector<int32_t>(base.begin(), base.begin() + pre)}, seeded(2));
      const Reply warm = run(*e.sched, {p}, seeded(6))[0];
      EXPECT_EQ(warm, cold) << "len " << len << " prefix " << pre;
      EXPECT_EQ(warm.cached, expected_hit(pre, len));
    }
  }
}

TEST_P(PrefixCacheFixture, LongPromptAgainstOnAndOffGridPrefixes) {
  const std::vector<int32_t> p = make_prompt(1600, 3, V_);
  const Reply cold = fresh(p, greedy(2));
  // One engine, prefixes cached one after another: each lookup finds the longest restorable one.
  Engine e = make_engine(*model_, true, 512, 4096, 8, 64, 512);
  for (int32_t pre : {700, 1590}) {
    run(*e.sched, {std::vector<int32_t>(p.begin(), p.begin() + pre)}, greedy(1));
    const Reply warm = run(*e.sched, {p}, greedy(2))[0];
    EXPECT_EQ(warm, cold) << "prefix " << pre;
    EXPECT_EQ(warm.cached, expected_hit(pre, 1600)) << "prefix " << pre;
    e.runner->clear_prefix_cache();
  }
  // Periodic snapshots (every 512 tokens) of a long prompt: a prompt that diverges after 1100 tokens
  // resumes at 1024 although the cached prompt's last grid point is 1600.
  run(*e.sched, {p}, greedy(1));
  std::vector<int32_t> q(p.begin(), p.begin() + 1100);
  const std::vector<int32_t> tail = make_prompt(50, 9, V_);
  q.insert(q.end(), tail.begin(), tail.end());
  const Reply warm = run(*e.sched, {q}, greedy(2))[0];
  EXPECT_EQ(warm, fresh(q, greedy(2)));
  EXPECT_EQ(warm.cached, hybrid_ ? 1024 : 1088);
}

TEST_P(PrefixCacheFixture, TenTurnChat) {
  Engine e = make_engine(*model_, true);
  std::vector<int32_t> conv = make_prompt(37, 4, V_);
  int32_t prev_prompt = 0;
  for (int turn = 0; turn < 10; ++turn) {
    const Reply warm = run(*e.sched, {conv}, greedy(5))[0];
    EXPECT_EQ(warm, fresh(conv, greedy(5))) << "turn " << turn;
    EXPECT_EQ(warm.cached, (prev_prompt / (hybrid_ ? 64 : 16)) * (hybrid_ ? 64 : 16)) << "turn " << turn;
    prev_prompt = int32_t(conv.size());
    conv.insert(conv.end(), warm.tokens.begin(), warm.tokens.end());
    const std::vector<int32_t> user = make_prompt(11 + 7 * turn, 100 + turn, V_);
    conv.insert(conv.end(), user.begin(), user.end());
  }
  const PrefixCacheStats st = e.runner->prefix_cache_stats();
  EXPECT_GT(st.hit_tokens, 0);
  EXPECT_EQ(st.queries, 10);
}

TEST_P(PrefixCacheFixture, ConcurrentRequestsSharingAPrefixInOneStep) {
  const std::vector<int32_t> shared = make_prompt(150, 5, V_);
  for (int n : {2, 8}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < n; ++i) {
      // Shared prefixes of unaligned lengths, then distinct tails.
      std::vector<int32_t> p(shared.begin(), shared.begin() + 70 + 9 * i);
      const std::vector<int32_t> tail = make_prompt(5 + 13 * i, 200 + i, V_);
      p.insert(p.end(), tail.begin(), tail.end());
      prompts.push_back(std::move(p));
    }
    // Snapshots every 64 tokens: the cached 130-token prompt has them at 64 and 128.
    Engine e = make_engine(*model_, true, 512, 4096, 8, 64, 64);
    run(*e.sched, {std::vector<int32_t>(shared.begin(), shared.begin() + 130)}, greedy(1));
    std::vector<RequestId> ids;
    for (const auto& p : prompts) ids.push_back(e.sched->add(p, greedy(4)));
    std::map<RequestId, Reply> got;
    for (int step = 0; e.sched->has_work() && step < 1000; ++step) {
      for (const TokenOutput& o : e.sched->step()) {
        got[o.id].tokens.push_back(o.token);
        got[o.id].logprobs.push_back(o.logprob);
        got[o.id].cached = o.cached_tokens;
      }
      if (step == 0) {
        EXPECT_EQ(e.sched->last_step().size(), size_t(n)) << "all prefills share the first step";
      }
    }
    std::vector<Reply> warm;
    for (RequestId id : ids) warm.push_back(got[id]);
    EXPECT_EQ(e.sched->stats().num_preemptions, 0);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(warm[size_t(i)], fresh(prompts[size_t(i)], greedy(4))) << n << " requests, #" << i;
      EXPECT_EQ(warm[size_t(i)].cached, expected_hit(std::min(70 + 9 * i, 130), int32_t(prompts[size_t(i)].size())))
          << n << " #" << i;
    }
  }
}

TEST_P(PrefixCacheFixture, PreemptionAfterAHit) {
  const std::vector<int32_t> shared = make_prompt(128, 6, V_);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> tail = make_prompt(10 + i, 300 + i, V_);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  // 20 pages of 16 tokens: the 8 shared pages plus 4 more per request (~140 + 40 tokens) do not fit.
  Engine e = make_engine(*model_, true, 20, 4096, 4);
  run(*e.sched, {shared}, greedy(1));
  int64_t preempted = 0;
  const std::vector<Reply> warm = run(*e.sched, prompts, greedy(40), &preempted);
  EXPECT_GT(preempted, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(warm[i], fresh(prompts[i], greedy(40))) << "#" << i;
    EXPECT_EQ(warm[i].cached, 128) << "#" << i;  // the first admission's hit
  }
  EXPECT_EQ(e.sched->stats().kv_blocks_used, 0);
}

TEST_P(PrefixCacheFixture, EvictionWhileARequestUsesThePrefix) {
  // 30 pages: a's 12 cached pages, then b (a + 1 token) holds them; c needs more pages than are free,
  // so the cached pages nobody holds are evicted under b, whose reply must still be the cold one.
  const std::vector<int32_t> a = make_prompt(200, 7, V_), c = make_prompt(220, 8, V_);
  std::vector<int32_t> b = a;
  b.push_back(5);
  const Reply cold = fresh(b, greedy(30));
  Engine e = make_engine(*model_, true, 30, 4096, 4);
  run(*e.sched, {a}, greedy(1));
  run(*e.sched, {make_prompt(64, 11, V_)}, greedy(1));  // more cached pages nobody will hold
  const RequestId rb = e.sched->add(b, greedy(30));
  Reply got;
  auto take = [&](const std::vector<TokenOutput>& outs) {
    for (const TokenOutput& o : outs) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.id != rb) continue;
      got.tokens.push_back(o.token);
      got.logprobs.push_back(o.logprob);
    }
  };
  take(e.sched->step());  // b resumes from the cache and holds its pages
  EXPECT_EQ(e.sched->cached_tokens(rb), 192);
  const int64_t evicted0 = e.runner->prefix_cache_stats().evicted_pages;
  e.sched->add(c, greedy(10));
  for (int step = 0; e.sched->has_work() && step < 10000; ++step) take(e.sched->step());
  EXPECT_GT(e.runner->prefix_cache_stats().evicted_pages, evicted0);
  EXPECT_EQ(got, cold);
  EXPECT_EQ(e.sched->stats().kv_blocks_used, 0);
}

TEST_P(PrefixCacheFixture, CancellationAfterAHitKeepsTheCacheConsistent) {
  // A request that resumed from the cache is aborted mid-prefill (a 64-token budget) and mid-decode:
  // its pages are released, the cached prefix stays, and the next request still gets the cold reply.
  Engine e = make_engine(*model_, true, 64, 64, 4);
  const std::vector<int32_t> a = make_prompt(300, 12, V_);
  run(*e.sched, {std::vector<int32_t>(a.begin(), a.begin() + 140)}, greedy(1));
  for (int steps : {1, 4}) {
    const RequestId id = e.sched->add(a, greedy(8));
    for (int i = 0; i < steps; ++i) e.sched->step();
    // The second attempt also finds the first one's prompt pages (dense; hybrid: no snapshot at 192).
    EXPECT_EQ(e.sched->cached_tokens(id), steps == 1 || hybrid_ ? 128 : 192);
    EXPECT_TRUE(e.sched->abort(id));
    EXPECT_EQ(e.sched->stats().kv_blocks_used, 0);
  }
  const Reply warm = run(*e.sched, {a}, greedy(3))[0];
  EXPECT_EQ(warm, fresh(a, greedy(3)));
  // The second attempt computed the whole prompt before its abort: its pages (288 tokens) and, for a
  // hybrid model, the snapshot at its last 64-token boundary (256) stay cached.
  EXPECT_EQ(warm.cached, hybrid_ ? 256 : 288);
}

TEST_P(PrefixCacheFixture, ChunkedPrefillWithCachingEqualsFresh) {
  // A 90-token budget: hybrid chunks end on the 64-grid (the last chunk of a prompt excepted).
  Engine e = make_engine(*model_, true, 512, 90, 4);
  const std::vector<int32_t> p = make_prompt(300, 10, V_);
  const Reply warm1 = run(*e.sched, {p}, greedy(3))[0];
  EXPECT_EQ(warm1, fresh(p, greedy(3)));
  std::vector<int32_t> q = p;
  q.push_back(3);
  const Reply warm2 = run(*e.sched, {q}, greedy(3))[0];
  EXPECT_EQ(warm2, fresh(q, greedy(3)));
  EXPECT_EQ(warm2.cached, hybrid_ ? 256 : 288);
}

TEST_P(PrefixCacheFixture, SnapshotMemoryStaysWithinItsBudget) {
  Engine e = make_engine(*model_, true, 256, 4096, 4, 3);
  for (int i = 0; i < 12; ++i) run(*e.sched, {make_prompt(70 + 10 * i, 400 + i, V_)}, greedy(2));
  const PrefixCacheStats st = e.runner->prefix_cache_stats();
  if (hybrid_) {
    EXPECT_EQ(st.snapshot_slots, 3);
    EXPECT_LE(st.snapshots, 3);
    EXPECT_GT(st.snapshots, 0);
    EXPECT_GT(st.evicted_snapshots, 0);
    EXPECT_EQ(st.snapshot_bytes, int64_t(st.snapshots) * e.runner->executor().state_slot_bytes());
  } else {
    EXPECT_EQ(st.snapshot_slots, 0);
  }
  EXPECT_GT(st.cached_pages, 0);
}

// A long multi-turn load: 6 conversations of 8 turns, each turn's requests of all conversations queued
// together over 4 sequences, 48 pages (under two turns' worth of prompts) and 3 snapshot slots. At
// every step the snapshots stay within their slots and memory; no request fails (for memory or
// anything else); every reply equals a cold run's; later turns hit.
TEST_P(PrefixCacheFixture, LongMultiTurnLoadStaysWithinBudgets) {
  Engine e = make_engine(*model_, true, 48, 256, 4, 3, 64);
  const int64_t slot_bytes = e.runner->executor().state_slot_bytes();
  std::vector<std::vector<int32_t>> convs;
  for (int c = 0; c < 6; ++c) convs.push_back(make_prompt(20 + 9 * c, 500 + c, V_));
  int64_t hits = 0, steps = 0;
  for (int turn = 0; turn < 8; ++turn) {
    std::map<RequestId, size_t> who;
    for (size_t c = 0; c < convs.size(); ++c) who[e.sched->add(convs[c], greedy(3))] = c;
    std::vector<Reply> got(convs.size());
    for (; e.sched->has_work() && steps < 100000; ++steps) {
      for (const TokenOutput& o : e.sched->step()) {
        EXPECT_TRUE(o.error.empty()) << "turn " << turn << ": " << o.error;
        Reply& r = got[who.at(o.id)];
        r.tokens.push_back(o.token);
        r.logprobs.push_back(o.logprob);
        r.cached = o.cached_tokens;
      }
      const PrefixCacheStats st = e.runner->prefix_cache_stats();
      ASSERT_LE(st.snapshots, 3) << "step " << steps;
      ASSERT_LE(st.snapshot_bytes, 3 * slot_bytes) << "step " << steps;
      ASSERT_EQ(st.snapshot_bytes, int64_t(st.snapshots) * slot_bytes);
    }
    ASSERT_FALSE(e.sched->has_work());
    for (size_t c = 0; c < convs.size(); ++c) {
      ASSERT_EQ(got[c].tokens.size(), 3u) << "turn " << turn << " conversation " << c;
      if (turn == 7 || c == 0) {
        EXPECT_EQ(got[c], fresh(convs[c], greedy(3))) << "turn " << turn << " conversation " << c;
      }
      if (turn > 0) hits += got[c].cached;
      convs[c].insert(convs[c].end(), got[c].tokens.begin(), got[c].tokens.end());
      const std::vector<int32_t> user = make_prompt(6 + 3 * turn, 600 + 10 * turn + int(c), V_);
      convs[c].insert(convs[c].end(), user.begin(), user.end());
    }
  }
  EXPECT_GT(hits, 0);
  const PrefixCacheStats st = e.runner->prefix_cache_stats();
  EXPECT_GT(st.evicted_pages, 0);  // the pool was too small to keep everything
  if (hybrid_) {
    EXPECT_GT(st.evicted_snapshots, 0);
  }
  EXPECT_EQ(e.sched->stats().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheFixture, ::testing::Values("qwen3_5_moe", "qwen3_next", "qwen3", "deepseek_v32"),
                         [](const auto& info) { return info.param; });

}  // namespace
