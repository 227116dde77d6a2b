// Mixed steps on the CPU backend: a request's decode steps give bitwise the same tokens and logprobs
// (greedy and seeded sampling) alone and while other requests prefill in the same steps (prompts of
// 1, 63, 64, 65 and 300 tokens arriving mid-generation), and beside chunked prefills; the requests
// that arrive give their replies alone too. The CPU runs every sequence's rows through its own form
// (a decode row the recurrent DeltaNet step and one-row attention, prompt rows the chunked rule), so
// this is the reference that tests/cuda/mixed_step_cuda_test.cc holds the GPU executor to.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "fixture_util.h"
#include "models/load_model.h"
#include "scheduler_replies.h"

using namespace moefold;

namespace {

class MixedStepFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    static std::map<std::string, std::unique_ptr<Model>> models;
    auto& m = models[GetParam()];
    if (!m) m = load_model((test::kFixtures / GetParam()).string(), LoadFormat::Safetensors);
    model_ = m.get();
  }
  test::EngineFactory factory() const {
    return [m = model_](int32_t budget, bool caching) {
      test::Engine e;
      e.runner = std::make_unique<ModelRunner>(*m, RunnerOptions{256, 16, 8, caching, caching ? 16 : 0, 0});
      e.sched = std::make_unique<Scheduler>(*e.runner, SchedulerOptions{8, budget, 0, 4096});
      return e;
    };
  }
  int64_t vocab() const { return model_->config().vocab_size; }
  const Model* model_ = nullptr;
};

TEST_P(MixedStepFixture, GreedyDecodeAloneEqualsBesidePrefills) {
  test::expect_decode_alone_equals_beside_prefills(factory(), vocab(), false, false, GetParam() + " greedy");
}

TEST_P(MixedStepFixture, SeededDecodeAloneEqualsBesidePrefills) {
  test::expect_decode_alone_equals_beside_prefills(factory(), vocab(), true, false, GetParam() + " seeded");
}

TEST_P(MixedStepFixture, DecodeBesideChunkedPrefillsEqualsAlone) {
  test::expect_decode_alone_equals_beside_prefills(factory(), vocab(), false, true, GetParam() + " greedy chunked");
  test::expect_decode_alone_equals_beside_prefills(factory(), vocab(), true, true, GetParam() + " seeded chunked");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MixedStepFixture, ::testing::ValuesIn(test::fixture_families()),
                         [](const auto& info) { return info.param; });

}  // namespace
