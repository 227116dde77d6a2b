// Scheduler: continuous batching on a dummy-weight tiny model (Gated DeltaNet + attention layers).
// A request's tokens must not depend on what else runs with it: under chunked prefill, under
// preemption by recompute from a tiny KV pool, under admission limits. Cancellation and finished
// requests must give back every KV page and state slot.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int kVocab = 97;

/// A tiny qwen3_5_moe config (two DeltaNet and two attention layers, MoE FFN); `eos` adds an
/// eos_token_id.
std::string write_model_dir(const std::string& name, int eos = -1) {
  json c = {{"vocab_size", kVocab}, {"hidden_size", 48}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"head_dim", 16}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
            {"intermediate_size", 64}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0},
            {"layer_types", {"linear_attention", "full_attention", "linear_attention", "full_attention"}},
            {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"linear_key_head_dim", 8},
            {"linear_value_head_dim", 12}, {"linear_conv_kernel_dim", 4},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
            {"shared_expert_intermediate_size", 24}, {"num_experts", 8}, {"num_experts_per_tok", 2},
            {"moe_intermediate_size", 16}, {"norm_topk_prob", true}};
  if (eos >= 0) c["eos_token_id"] = eos;
  fs::path dir = fs::temp_directory_path() / ("moefold_sched_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << json{{"model_type", "qwen3_5_moe"}, {"text_config", c}}.dump(2);
  return dir.string();
}

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = (i * 31 + seed * 7 + 3) % kVocab;
  return p;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

/// Runs `jobs` all submitted at once through a scheduler; returns each job's tokens and finish.
struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> finish;
  int64_t preemptions = 0;
  int max_running = 0;
};

RunResult run_all(const Model& model, RunnerOptions ro, SchedulerOptions so, const std::vector<Job>& jobs,
                  int stagger = 0, std::vector<int32_t> masked = {}) {
  ModelRunner runner(model, ro);
  Scheduler sched(runner, so);
  sched.set_masked_tokens(std::move(masked));
  RunResult res;
  res.tokens.resize(jobs.size());
  res.finish.assign(jobs.size(), FinishReason::kNone);
  std::map<RequestId, size_t> who;
  size_t submitted = 0;
  auto submit = [&](size_t k) {
    for (; submitted < jobs.size() && submitted < k; ++submitted)
      who[sched.add(jobs[submitted].prompt, jobs[submitted].params)] = submitted;
  };
  submit(stagger > 0 ? 1 : jobs.size());
  for (int step = 0; sched.has_work() || submitted < jobs.size(); ++step) {
    EXPECT_LT(step, 100000) << "scheduler made no progress";
    if (step >= 100000) break;
    if (stagger > 0 && step % stagger == 0) submit(submitted + 1);
    auto outs = sched.step();
    int rows = 0;
    for (const auto& c : sched.last_step()) {
      rows += c.num_tokens;
      if (so.max_prefill_chunk > 0) {
        EXPECT_LE(c.num_tokens, so.max_prefill_chunk);
      }
    }
    EXPECT_LE(rows, so.max_num_batched_tokens);
    res.max_running = std::max(res.max_running, sched.num_running());
    for (const auto& o : outs) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      const size_t j = who.at(o.id);
      res.tokens[j].push_back(o.token);
      if (o.finish != FinishReason::kNone) res.finish[j] = o.finish;
    }
  }
  SchedulerStats st = sched.stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  res.preemptions = st.num_preemptions;
  return res;
}

std::vector<Job> mixed_jobs() {
  std::vector<Job> jobs;
  const int lens[] = {1, 70, 17, 3, 45, 64, 9, 33};
  for (int i = 0; i < 8; ++i) jobs.push_back({prompt(lens[i], i), greedy(4 + 3 * i)});
  return jobs;
}

/// Each job alone, in a scheduler of its own.
RunResult run_alone(const Model& model, const std::vector<Job>& jobs) {
  RunResult all;
  for (const Job& j : jobs) {
    RunResult r = run_all(model, {64, 16, 1}, {1, 4096, 0, 1024}, {j});
    all.tokens.push_back(r.tokens[0]);
    all.finish.push_back(r.finish[0]);
  }
  return all;
}

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(write_model_dir("base"), LoadFormat::Dummy, 11).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
};
Model* SchedulerTest::model_ = nullptr;

TEST_F(SchedulerTest, BatchedGreedyEqualsAlone) {
  auto jobs = mixed_jobs();
  RunResult alone = run_alone(*model_, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(alone.tokens[i].size(), size_t(*jobs[i].params.max_tokens));
    EXPECT_EQ(alone.finish[i], FinishReason::kLength);
  }
  RunResult together = run_all(*model_, {128, 16, 8}, {8, 4096, 0, 1024}, jobs);
  EXPECT_EQ(together.tokens, alone.tokens);
  EXPECT_EQ(together.max_running, 8);
  EXPECT_EQ(together.preemptions, 0);
  // Arriving one per step mixes prefill chunks and decode rows in the same steps.
  RunResult staggered = run_all(*model_, {128, 16, 8}, {8, 4096, 0, 1024}, jobs, 1);
  EXPECT_EQ(staggered.tokens, alone.tokens);
}

TEST_F(SchedulerTest, ChunkedPrefillGivesSameTokens) {
  auto jobs = mixed_jobs();
  RunResult alone = run_alone(*model_, jobs);
  // Forced tiny chunks: at most 5 prompt tokens of one request per step, 16 rows per step.
  RunResult chunked = run_all(*model_, {128, 16, 8}, {8, 16, 5, 1024}, jobs);
  EXPECT_EQ(chunked.tokens, alone.tokens);
  // A budget smaller than the number of running requests still makes progress.
  RunResult tight = run_all(*model_, {128, 16, 8}, {8, 3, 0, 1024}, jobs);
  EXPECT_EQ(tight.tokens, alone.tokens);
}

TEST_F(SchedulerTest, ChunksOfOnePromptAreFedExactlyOnce) {
  ModelRunner runner(*model_, {16, 16, 2});
  Scheduler sched(runner, {2, 64, 8, 200});
  RequestId id = sched.add(prompt(30, 3), greedy(3));
  std::vector<int32_t> chunks;
  std::vector<size_t> outs_per_step;
  while (sched.has_work()) {
    auto outs = sched.step();
    ASSERT_EQ(sched.last_step().size(), 1u);
    EXPECT_EQ(sched.last_step()[0].id, id);
    chunks.push_back(sched.last_step()[0].num_tokens);
    outs_per_step.push_back(outs.size());
  }
  // 30 prompt tokens in chunks of 8, 8, 8, 6 (a token only once the prompt is complete), then
  // two one-token decode rows (the third token is sampled but never fed).
  EXPECT_EQ(chunks, (std::vector<int32_t>{8, 8, 8, 6, 1, 1}));
  EXPECT_EQ(outs_per_step, (std::vector<size_t>{0, 0, 0, 1, 1, 1}));
}

TEST_F(SchedulerTest, PreemptionByRecomputeGivesSameTokens) {
  auto jobs = mixed_jobs();
  RunResult alone = run_alone(*model_, jobs);
  // 10 pages of 16 tokens: the longest request (70 + 25 tokens) fits alone, never all together.
  RunResult tiny = run_all(*model_, {10, 16, 8}, {8, 4096, 0, 160}, jobs);
  EXPECT_GT(tiny.preemptions, 0);
  EXPECT_EQ(tiny.tokens, alone.tokens);
  // Preemption together with tiny prefill chunks.
  RunResult both = run_all(*model_, {10, 16, 8}, {8, 24, 7, 160}, jobs, 2);
  EXPECT_GT(both.preemptions, 0);
  EXPECT_EQ(both.tokens, alone.tokens);
}

TEST_F(SchedulerTest, SeededSamplingSurvivesPreemption) {
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 100 + i;
    p.max_tokens = 20;
    p.frequency_penalty = 0.3f;
    jobs.push_back({prompt(20 + 9 * i, i), p});
  }
  RunResult alone = run_alone(*model_, jobs);
  RunResult tiny = run_all(*model_, {8, 16, 6}, {6, 4096, 0, 128}, jobs);
  EXPECT_GT(tiny.preemptions, 0);
  EXPECT_EQ(tiny.tokens, alone.tokens);
}

TEST_F(SchedulerTest, AdmissionRespectsMaxNumSeqsAndSlots) {
  auto jobs = mixed_jobs();
  RunResult alone = run_alone(*model_, jobs);
  RunResult two = run_all(*model_, {128, 16, 2}, {2, 4096, 0, 1024}, jobs);
  EXPECT_EQ(two.max_running, 2);
  EXPECT_EQ(two.tokens, alone.tokens);
}

TEST_F(SchedulerTest, CancellationReleasesPagesAndSlots) {
  ModelRunner runner(*model_, {64, 16, 4});
  Scheduler sched(runner, {4, 32, 0, 1024});
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(sched.add(prompt(10 + 20 * i, i), greedy(100)));
  for (int s = 0; s < 6; ++s) sched.step();
  SchedulerStats st = sched.stats();
  EXPECT_EQ(st.num_running, 4);
  EXPECT_EQ(st.num_waiting, 2);
  EXPECT_GT(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 4);
  // Cancel one running and one waiting request: the rest go on.
  EXPECT_TRUE(sched.abort(ids[0]));
  EXPECT_TRUE(sched.abort(ids[5]));
  EXPECT_FALSE(sched.abort(ids[5]));
  EXPECT_EQ(sched.stats().state_slots_used, 3);
  sched.step();
  EXPECT_EQ(sched.num_running(), 4);  // the waiting request ids[4] took the free slot
  for (RequestId id : ids) sched.abort(id);
  st = sched.stats();
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
  EXPECT_FALSE(sched.has_work());
  EXPECT_TRUE(sched.step().empty());
}

TEST_F(SchedulerTest, StopTokensAndContextLimit) {
  // Find the greedy continuation, then stop on its third token.
  RunResult base = run_alone(*model_, {{prompt(12, 1), greedy(8)}});
  ASSERT_EQ(base.tokens[0].size(), 8u);
  SamplingParams p = greedy(8);
  p.stop_token_ids = {base.tokens[0][2]};
  const size_t first = size_t(std::find(base.tokens[0].begin(), base.tokens[0].end(), base.tokens[0][2]) -
                              base.tokens[0].begin());
  RunResult stopped = run_alone(*model_, {{prompt(12, 1), p}});
  EXPECT_EQ(stopped.tokens[0], std::vector<int32_t>(base.tokens[0].begin(), base.tokens[0].begin() + first + 1));
  EXPECT_EQ(stopped.finish[0], FinishReason::kStop);
  // The context (max_model_len 16) caps a 12-token prompt at 4 generated tokens.
  RunResult capped = run_all(*model_, {4, 16, 1}, {1, 64, 0, 16}, {{prompt(12, 1), greedy(100)}});
  EXPECT_EQ(capped.tokens[0], std::vector<int32_t>(base.tokens[0].begin(), base.tokens[0].begin() + 4));
  EXPECT_EQ(capped.finish[0], FinishReason::kLength);
}

TEST(SchedulerEos, EosStopsUnlessIgnored) {
  auto plain = load_model(write_model_dir("noeos"), LoadFormat::Dummy, 5);
  RunResult base = run_alone(*plain, {{prompt(9, 2), greedy(6)}});
  ASSERT_EQ(base.tokens[0].size(), 6u);
  const int eos = base.tokens[0][1];
  auto with_eos = load_model(write_model_dir("eos", eos), LoadFormat::Dummy, 5);  // same weights
  RunResult stopped = run_alone(*with_eos, {{prompt(9, 2), greedy(6)}});
  const size_t first = size_t(std::find(base.tokens[0].begin(), base.tokens[0].end(), eos) - base.tokens[0].begin());
  EXPECT_EQ(stopped.tokens[0], std::vector<int32_t>(base.tokens[0].begin(), base.tokens[0].begin() + first + 1));
  EXPECT_EQ(stopped.finish[0], FinishReason::kStop);
  SamplingParams ign = greedy(6);
  ign.ignore_eos = true;
  RunResult ignored = run_alone(*with_eos, {{prompt(9, 2), ign}});
  EXPECT_EQ(ignored.tokens[0], base.tokens[0]);
  EXPECT_EQ(ignored.finish[0], FinishReason::kLength);
}

// Ids given to Scheduler::set_masked_tokens are never sampled; masking ids that greedy never picks
// changes nothing.
TEST_F(SchedulerTest, MaskedTokensAreNeverSampled) {
  RunResult base = run_alone(*model_, {{prompt(9, 3), greedy(8)}});
  const SchedulerOptions so{1, 4096, 0, 1024};
  // Masking the greedy choices forces other tokens, never a masked one.
  const std::vector<int32_t> masked(base.tokens[0].begin(), base.tokens[0].end());
  RunResult forced = run_all(*model_, {64, 16, 1}, so, {{prompt(9, 3), greedy(8)}}, 0, masked);
  ASSERT_EQ(forced.tokens[0].size(), 8u);
  for (int32_t t : forced.tokens[0]) EXPECT_EQ(std::count(masked.begin(), masked.end(), t), 0) << t;
  // Masking tokens greedy never picks changes nothing.
  std::vector<int32_t> others;
  for (int32_t v = 0; v < kVocab; ++v)
    if (std::count(base.tokens[0].begin(), base.tokens[0].end(), v) == 0) others.push_back(v);
  EXPECT_EQ(run_all(*model_, {64, 16, 1}, so, {{prompt(9, 3), greedy(8)}}, 0, others).tokens[0], base.tokens[0]);
  // Sampled (non-greedy) tokens obey the mask too; ids outside the vocabulary are ignored.
  std::vector<int32_t> high;
  for (int32_t v = 10; v < kVocab + 5; ++v) high.push_back(v);
  SamplingParams hot = greedy(20);
  hot.temperature = 1.5f;
  hot.seed = 7;
  RunResult hot_run = run_all(*model_, {64, 16, 1}, so, {{prompt(9, 3), hot}}, 0, high);
  ASSERT_EQ(hot_run.tokens[0].size(), 20u);
  for (int32_t t : hot_run.tokens[0]) EXPECT_LT(t, 10);
}

TEST_F(SchedulerTest, BadRequestsAndOptionsThrow) {
  ModelRunner runner(*model_, {8, 16, 2});
  EXPECT_THROW(Scheduler(runner, {3, 64, 0, 100}), Error);   // more seqs than slots
  EXPECT_THROW(Scheduler(runner, {2, 64, 0, 200}), Error);   // context beyond 8 x 16 pages
  EXPECT_THROW(Scheduler(runner, {2, 0, 0, 100}), Error);    // no budget
  Scheduler sched(runner, {2, 64, 0, 100});
  EXPECT_THROW(sched.add({}, greedy(1)), Error);
  EXPECT_THROW(sched.add(prompt(100, 1), greedy(1)), Error);  // no room for output
  EXPECT_THROW(sched.add({1, kVocab}, greedy(1)), Error);
  EXPECT_THROW(sched.add({1, -1}, greedy(1)), Error);
  SamplingParams bad = greedy(1);
  bad.top_p = 0;
  EXPECT_THROW(sched.add({1, 2}, bad), Error);
  EXPECT_FALSE(sched.has_work());
  // max_tokens is capped by the context.
  RequestId id = sched.add(prompt(90, 1), greedy(50));
  EXPECT_EQ(sched.max_tokens(id), 10);
}

}  // namespace
