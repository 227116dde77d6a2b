// Sampling inside the executor (Executor::forward_sample, ModelRunner::step_sample): the default
// implementation samples each masked host row exactly as the CPU Sampler does and fails only the rows
// whose sampling fails; the scheduler and generate_text sample through it and never ask for host
// logits (a GPU executor overrides forward_sample and downloads only the tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "fixture_util.h"
#include "runtime/executor.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "runtime/text_generation.h"
#include "text/tokenizer.h"

using namespace moefold;

namespace {

constexpr int32_t kPoison = 13;  // a row whose token is kPoison gets a NaN logit

/// A model-free executor: the logits of a row are a fixed pseudo-random function of its token and
/// position (NaN at one id when the token is kPoison). Counts the calls of each entry point.
class TableExecutor : public Executor {
 public:
  explicit TableExecutor(int64_t vocab, int32_t blocks = 64) : blocks_(blocks) {
    cfg_.vocab_size = vocab;
  }
  const ModelConfig& config() const override { return cfg_; }
  std::string device() const override { return "table"; }
  int32_t num_kv_blocks() const override { return blocks_; }
  void reset_slot(int32_t) override {}
  int32_t num_state_slots() const override { return 1 << 20; }
  void copy_slot(int32_t, int32_t) override {}
  int64_t state_slot_bytes() const override { return 0; }
  void set_routing(RoutingControl) override {}
  void forward(const ForwardBatch& b, std::vector<float>& logits) override {
    ++forward_calls;
    if (forbid_forward) throw Error("host logits were requested");
    const int64_t V = cfg_.vocab_size;
    logits.assign(b.logits_rows.size() * size_t(V), 0.0f);
    for (size_t i = 0; i < b.logits_rows.size(); ++i) {
      const int32_t row = b.logits_rows[i];
      row_logits(b.token_ids[size_t(row)], b.positions[size_t(row)], {logits.data() + i * size_t(V), size_t(V)});
    }
  }
  /// The logits forward() computes for a row of (token, position).
  static void row_logits(int32_t token, int32_t pos, std::span<float> x) {
    uint64_t h = uint64_t(token) * 0x9E3779B97F4A7C15ull + uint64_t(pos) * 0xBF58476D1CE4E5B9ull + 1;
    for (size_t v = 0; v < x.size(); ++v) {
      h ^= h >> 29;
      h *= 0x94D049BB133111EBull;
      x[v] = float(int64_t(h >> 40) % 97) / 16.0f - 3.0f;  // multiples of 1/16: ties happen
    }
    if (token == kPoison) x[x.size() / 2] = std::nanf("");
  }

  ModelConfig cfg_;
  int32_t blocks_;
  int forward_calls = 0;
  bool forbid_forward = false;
};

/// The same, sampling "on the device": forward_sample picks (token + position + 1) % V for every
/// sampled row and never calls forward(); rows of a token in fail_tokens report an error.
class DeviceLikeExecutor : public TableExecutor {
 public:
  using TableExecutor::TableExecutor;
  void forward_sample(const ForwardBatch& b, std::span<const RowSampling> rows, std::span<const int32_t> masked,
                      std::vector<SampleResult>& out) override {
    ++sample_calls;
    ASSERT_EQ(rows.size(), b.logits_rows.size());
    masked_seen.assign(masked.begin(), masked.end());
    out.assign(rows.size(), SampleResult{});
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].sampler) {
        ++null_rows;
        continue;
      }
      const int32_t row = b.logits_rows[i];
      const int32_t tok = b.token_ids[size_t(row)];
      if (fail_tokens.count(tok)) {
        out[i].error = "device says no";
        continue;
      }
      // The history handed over is the request's: prompt + output so far end with this row's token.
      const int32_t last = rows[i].output.empty() ? rows[i].prompt.back() : rows[i].output.back();
      EXPECT_EQ(last, tok);
      out[i].token = int32_t((tok + b.positions[size_t(row)] + 1) % cfg_.vocab_size);
    }
  }
  int sample_calls = 0, null_rows = 0;
  std::map<int32_t, int> fail_tokens;
  std::vector<int32_t> masked_seen;
};

SamplingParams params(float temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = int64_t(seed);
  return p;
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The default forward_sample gives, row by row, exactly Sampler::sample on the masked row (greedy,
// seeded sampling with truncation, penalties, logprobs, top_logprobs); a null sampler skips a row.
TEST(ForwardSample, DefaultMatchesTheHostSamplerRowByRow) {
  const int64_t V = 300;
  TableExecutor exec(V);
  ForwardBatch b;
  const std::vector<int32_t> toks = {5, 7, 9, 11, 21, 40};
  for (size_t i = 0; i < toks.size(); ++i) {
    b.token_ids.push_back(toks[i]);
    b.positions.push_back(int32_t(3 * i));
    b.logits_rows.push_back(int32_t(i));
  }
  std::vector<Sampler> samplers;
  SamplingParams g = params(0.0f, 1);
  g.logprobs = true;
  g.top_logprobs = 5;
  samplers.emplace_back(g);
  SamplingParams t = params(0.9f, 42);
  t.top_k = 40;
  t.top_p = 0.9f;
  samplers.emplace_back(t);
  SamplingParams pen = params(1.1f, 7);
  pen.repetition_penalty = 1.3f;
  pen.frequency_penalty = 0.4f;
  pen.presence_penalty = 0.2f;
  pen.logprobs = true;
  pen.top_logprobs = 3;
  samplers.emplace_back(pen);
  SamplingParams mp = params(0.7f, 99);
  mp.min_p = 0.1f;
  samplers.emplace_back(mp);
  samplers.emplace_back(params(0.0f, 3));
  const std::vector<int32_t> prompt = {1, 2, 3, 250, 2};
  const std::vector<int32_t> output = {4, 4, 250, 17};
  std::vector<RowSampling> rows;
  for (size_t i = 0; i < samplers.size(); ++i) rows.push_back({&samplers[i], prompt, output});
  rows.push_back({nullptr, prompt, output});  // not sampled
  const std::vector<int32_t> masked = {0, 17, 250, -4, int32_t(V) + 3};

  std::vector<SampleResult> out;
  exec.forward_sample(b, rows, masked, out);
  ASSERT_EQ(out.size(), rows.size());
  for (size_t i = 0; i < samplers.size(); ++i) {
    std::vector<float> x(static_cast<size_t>(V));
    TableExecutor::row_logits(toks[i], int32_t(3 * i), x);
    mask_tokens(x, masked);
    const SampleResult want = samplers[i].sample(x, prompt, output);
    EXPECT_TRUE(out[i].error.empty()) << out[i].error;
    EXPECT_EQ(out[i].token, want.token) << "row " << i;
    EXPECT_TRUE(same_float(out[i].logprob, want.logprob)) << "row " << i;
    EXPECT_EQ(out[i].top_logprobs, want.top_logprobs) << "row " << i;
    EXPECT_NE(out[i].token, 17);
    EXPECT_NE(out[i].token, 250);
  }
  EXPECT_EQ(out.back().token, -1);
  EXPECT_TRUE(out.back().error.empty());
  // rows must match the batch's logits rows.
  EXPECT_THROW(exec.forward_sample(b, std::span(rows).first(2), masked, out), Error);
}

// A row whose sampling fails (NaN logits, a history id outside the vocabulary) reports its error;
// the other rows of the step are sampled as usual.
TEST(ForwardSample, AFailingRowFailsAlone) {
  const int64_t V = 64;
  TableExecutor exec(V);
  ForwardBatch b;
  const std::vector<int32_t> toks = {3, kPoison, 8, 9};
  for (size_t i = 0; i < toks.size(); ++i) {
    b.token_ids.push_back(toks[i]);
    b.positions.push_back(int32_t(i));
    b.logits_rows.push_back(int32_t(i));
  }
  const Sampler s(params(0.8f, 5));
  SamplingParams pp = params(0.8f, 5);
  pp.presence_penalty = 0.5f;
  const Sampler pen(pp);
  const std::vector<int32_t> good = {1, 2}, bad = {1, int32_t(V)};
  std::vector<RowSampling> rows = {{&s, good, {}}, {&s, good, {}}, {&pen, good, bad}, {&s, good, bad}};
  std::vector<SampleResult> out;
  exec.forward_sample(b, rows, {}, out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_TRUE(out[0].error.empty());
  EXPECT_GE(out[0].token, 0);
  EXPECT_NE(out[1].error.find("NaN"), std::string::npos) << out[1].error;
  EXPECT_EQ(out[1].token, -1);
  EXPECT_NE(out[2].error.find("outside the vocabulary"), std::string::npos) << out[2].error;
  EXPECT_TRUE(out[3].error.empty()) << out[3].error;  // no penalty: the history is not read
}

/// Runs prompts through a scheduler on `exec` until done; returns tokens (or the error) per request.
std::map<RequestId, std::vector<int32_t>> serve(Scheduler& sched, const std::vector<std::vector<int32_t>>& prompts,
                                                int max_tokens, std::map<RequestId, std::string>* errors) {
  std::map<RequestId, std::vector<int32_t>> toks;
  SamplingParams p = params(0.0f, 1);
  p.max_tokens = max_tokens;
  for (const auto& pr : prompts) toks[sched.add(pr, p)];
  for (int step = 0; sched.has_work() && step < 1000; ++step)
    for (const TokenOutput& o : sched.step()) {
      if (!o.error.empty()) {
        if (errors) (*errors)[o.id] = o.error;
        continue;
      }
      toks[o.id].push_back(o.token);
    }
  return toks;
}

// The scheduler samples through forward_sample (never forward()): its tokens are the executor's; a
// partial prefill chunk's row is passed unsampled; the mask list reaches the executor.
TEST(ForwardSample, SchedulerSamplesInsideTheExecutor) {
  auto owned = std::make_unique<DeviceLikeExecutor>(50);
  DeviceLikeExecutor& exec = *owned;
  exec.forbid_forward = true;
  ModelRunner runner(std::move(owned), {64, 16, 4});
  Scheduler sched(runner, {4, 64, /*max_prefill_chunk=*/4, 256});
  sched.set_masked_tokens({7, 8});
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 9, 10, 11, 12, 20, 21}, {30}};
  const auto toks = serve(sched, prompts, 5, nullptr);
  EXPECT_EQ(exec.forward_calls, 0);
  EXPECT_GT(exec.sample_calls, 0);
  EXPECT_GT(exec.null_rows, 0);  // the 10-token prompt's first chunks
  EXPECT_EQ(exec.masked_seen, (std::vector<int32_t>{7, 8}));
  for (size_t r = 0; r < prompts.size(); ++r) {
    // Token k follows the rule (last token + position + 1) % V.
    std::vector<int32_t> want;
    int32_t last = prompts[r].back(), pos = int32_t(prompts[r].size()) - 1;
    for (int k = 0; k < 5; ++k) {
      last = (last + pos + 1) % 50;
      want.push_back(last);
      ++pos;
    }
    EXPECT_EQ(toks.at(RequestId(r)), want) << "request " << r;
  }
}

// A per-row failure from forward_sample fails that request only (TokenOutput::error, pages freed).
TEST(ForwardSample, SchedulerFailsOnlyTheRequestWhoseRowFailed) {
  auto owned = std::make_unique<DeviceLikeExecutor>(50);
  DeviceLikeExecutor& exec = *owned;
  exec.fail_tokens[33] = 1;
  ModelRunner runner(std::move(owned), {64, 16, 4});
  Scheduler sched(runner, {4, 64, 0, 256});
  std::map<RequestId, std::string> errors;
  const auto toks = serve(sched, {{1, 2}, {5, 33}, {6}}, 4, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors.begin()->first, 1);
  EXPECT_NE(errors.begin()->second.find("sampling failed: device says no"), std::string::npos);
  EXPECT_EQ(toks.at(0).size(), 4u);
  EXPECT_EQ(toks.at(2).size(), 4u);
  EXPECT_EQ(sched.stats().kv_blocks_used, 0);
  EXPECT_EQ(sched.stats().state_slots_used, 0);
}

// With the default forward_sample, a NaN row fails its request and the scheduler goes on.
TEST(ForwardSample, SchedulerReportsHostSamplingErrorsPerRequest) {
  ModelRunner runner(std::make_unique<TableExecutor>(50), {64, 16, 4});
  Scheduler sched(runner, {4, 64, 0, 256});
  std::map<RequestId, std::string> errors;
  const auto toks = serve(sched, {{1, 2}, {4, kPoison}, {6}}, 3, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors.begin()->first, 1);
  EXPECT_NE(errors.begin()->second.find("sampling failed: sampler: logits contain NaN"), std::string::npos)
      << errors.begin()->second;
  EXPECT_EQ(toks.at(0).size(), 3u);
  EXPECT_EQ(toks.at(2).size(), 3u);
}

// generate_text (moefold generate / chat) samples through step_sample too.
TEST(ForwardSample, GenerateTextSamplesInsideTheExecutor) {
  const Tokenizer tok =
      Tokenizer::from_file((test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json").string());
  auto owned = std::make_unique<DeviceLikeExecutor>(int64_t(tok.vocab_size()));
  DeviceLikeExecutor& exec = *owned;
  exec.forbid_forward = true;
  ModelRunner runner(std::move(owned), {64, 16, 1});
  SamplingParams p = params(0.0f, 1);
  p.max_tokens = 6;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = tok.encode("Hello there", false);
  TextGenerationResult r;
  ASSERT_NO_THROW(r = generate_text(runner, tok, prompt, p, 1024));
  ASSERT_EQ(r.output_ids.size(), 6u);
  EXPECT_EQ(exec.forward_calls, 0);
  EXPECT_EQ(exec.sample_calls, 6);
  const int64_t V = int64_t(tok.vocab_size());
  EXPECT_EQ(r.output_ids[0], int32_t((prompt.back() + int64_t(prompt.size()) - 1 + 1) % V));
  // The padding ids the tokenizer cannot decode are handed over as the mask (none in this vocabulary).
  EXPECT_EQ(exec.masked_seen, tok.unknown_ids(V));
}

}  // namespace
