// The prefix cache on the GPU: a request resumed from cached pages and a DeltaNet snapshot (taken by
// the chunked prefill kernel's snapshot API, conv state copied from the conv inputs) gives the tokens
// and logprobs of a cold run of the same prompt, on the hybrid fixtures and a dense one; cached_tokens
// is the largest restorable grid point. Prompts stay within 256 rows, where the batch-invariant
// kernels make a row's bits independent of the chunk it is computed in.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "cuda/contract.h"
#include "fixture_util.h"
#include "models/cuda/cuda_executor.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"

using namespace moefold;

namespace {

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

struct Gpu {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Scheduler> sched;
};

Gpu make(const std::string& fam, bool caching) {
  CudaExecutorOptions o;
  o.num_blocks = 256;
  o.block_size = 16;
  o.num_slots = 8;
  o.num_snapshot_slots = caching ? 16 : 0;
  o.max_rows = 2048;
  RunnerOptions ro{256, 16, 8, caching, caching ? 16 : 0, 64};
  Gpu g;
  g.runner = std::make_unique<ModelRunner>(
      make_cuda_executor((test::kFixtures / fam).string(), LoadFormat::Safetensors, 0, o), ro);
  g.sched = std::make_unique<Scheduler>(*g.runner, SchedulerOptions{8, 2048, 0, 4096});
  return g;
}

std::vector<int32_t> make_prompt(int n, int seed, int64_t vocab) {
  std::vector<int32_t> p;
  uint32_t x = uint32_t(seed) * 2654435761u + 17;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((x = x * 1103515245u + 12345u) >> 9) % int32_t(vocab - 2));
  return p;
}

SamplingParams params(bool seeded) {
  SamplingParams p;
  p.temperature = seeded ? 0.9f : 0.0f;
  if (seeded) p.seed = 77;
  p.max_tokens = 4;
  p.ignore_eos = true;
  p.logprobs = true;
  return p;
}

std::vector<Reply> run(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p) {
  std::map<RequestId, size_t> who;
  for (size_t i = 0; i < prompts.size(); ++i) who[s.add(prompts[i], p)] = i;
  std::vector<Reply> out(prompts.size());
  for (int step = 0; s.has_work() && step < 10000; ++step)
    for (const TokenOutput& o : s.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      Reply& r = out[who.at(o.id)];
      r.tokens.push_back(o.token);
      r.logprobs.push_back(o.logprob);
      r.cached = o.cached_tokens;
    }
  return out;
}

class PrefixCacheGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheGpu, ResumedEqualsCold) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = GetParam();
  const bool hybrid = fam != "qwen3";
  Gpu cold = make(fam, false), warm = make(fam, true);
  const int64_t V = cold.runner->config().vocab_size;
  const std::vector<int32_t> base = make_prompt(200, 3, V);
  for (bool seeded : {false, true})
    for (int len : {1, 63, 64, 65, 127, 128, 129, 130, 200})
      for (int pre : {16, 64, 100, 128, 129}) {
        if (pre > len) continue;
        const std::vector<int32_t> p(base.begin(), base.begin() + len);
        warm.runner->clear_prefix_cache();
        run(*warm.sched, {std::vector<int32_t>(base.begin(), base.begin() + pre)}, params(seeded));
        const Reply got = run(*warm.sched, {p}, params(seeded))[0];
        EXPECT_EQ(got, run(*cold.sched, {p}, params(seeded))[0]) << fam << " len " << len << " prefix " << pre;
        const int grid = hybrid ? 64 : 16;
        EXPECT_EQ(got.cached, std::min((pre / grid) * grid, ((len - 1) / grid) * grid)) << len << " " << pre;
      }
}

TEST_P(PrefixCacheGpu, EightRequestsSharingAPrefixInOneStep) {
  MOEFOLD_REQUIRE_GPU();
  const std::string fam = GetParam();
  Gpu cold = make(fam, false), warm = make(fam, true);
  const int64_t V = cold.runner->config().vocab_size;
  const std::vector<int32_t> shared = make_prompt(150, 5, V);
  run(*warm.sched, {std::vector<int32_t>(shared.begin(), shared.begin() + 130)}, params(false));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + 70 + 9 * i);
    const std::vector<int32_t> tail = make_prompt(5 + 13 * i, 200 + i, V);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  const std::vector<Reply> got = run(*warm.sched, prompts, params(false));
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(got[i], run(*cold.sched, {prompts[i]}, params(false))[0]) << fam << " #" << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheGpu, ::testing::Values("qwen3_5_moe", "qwen3_next", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
