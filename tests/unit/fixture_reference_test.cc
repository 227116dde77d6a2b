// Every family's tiny checkpoint (tests/fixtures/<family>, made by scripts/make_fixtures.py with
// transformers) against transformers' reference: logits at every position within 1e-3 x max|ref|,
// and greedy tokens equal wherever the reference's top-two margin exceeds 1e-2 (teacher-forced,
// so each step is checked on its own); prompts run together in one batch equal prompts run alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "models/load_model.h"
#include "runtime/model_runner.h"
#include "fixture_util.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using test::kFixtures;
const auto families = test::fixture_families;

using test::argmax;
const auto reference = test::fixture_reference;

class FixtureReference : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureReference, LogitsAndGreedyMatchTransformers) {
  const std::string fam = GetParam();
  auto ref = reference(fam);
  auto model = load_model((kFixtures / fam).string(), LoadFormat::Safetensors);
  const int64_t V = model->config().vocab_size;
  ASSERT_FALSE(ref["prompts"].empty());
  for (auto& p : ref["prompts"]) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto expect = read_npy((kFixtures / fam / p["logits"].get<std::string>()).string());
    ASSERT_EQ(expect.shape, (std::vector<int64_t>{int64_t(ids.size()), V}));
    ModelRunner r(*model, {64, 16, 1});
    int32_t s = r.add_sequence(ids);
    auto got = r.step({{s, int32_t(ids.size()), true}})[0];
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << fam << " T=" << ids.size() << " element " << i;
      maxref = std::max(maxref, double(std::fabs(expect.data[i])));
      maxdiff = std::max(maxdiff, double(std::fabs(got[i] - expect.data[i])));
    }
    EXPECT_LE(maxdiff, 1e-3 * maxref) << fam << " prompt length " << ids.size();
    // Greedy continuation, teacher-forced with the reference's tokens.
    auto greedy = p["greedy"].get<std::vector<int32_t>>();
    auto margins = p["greedy_margins"].get<std::vector<double>>();
    const float* last = got.data() + (ids.size() - 1) * size_t(V);
    std::vector<float> step_logits(last, last + V);
    int checked = 0;
    for (size_t i = 0; i < greedy.size(); ++i) {
      if (margins[i] > 1e-2) {
        EXPECT_EQ(argmax(step_logits.data(), V), greedy[i]) << fam << " T=" << ids.size() << " step " << i;
        ++checked;
      }
      r.append_token(s, greedy[i]);
      step_logits = r.step({{s, 1, false}})[0];
    }
    EXPECT_GT(checked, 8) << fam << ": too few confident steps to be a meaningful check";
  }
}

TEST_P(FixtureReference, PromptsTogetherEqualPromptsAlone) {
  const std::string fam = GetParam();
  auto ref = reference(fam);
  auto model = load_model((kFixtures / fam).string(), LoadFormat::Safetensors);
  const int64_t V = model->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (auto& p : ref["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  auto run = [&](const std::vector<size_t>& which, ModelRunner& r) {
    return test::greedy_together(r, prompts, which, 8, V);
  };
  std::vector<size_t> all;
  for (size_t i = 0; i < prompts.size(); ++i) all.push_back(i);
  ModelRunner together_runner(*model, {256, 16, int32_t(prompts.size())});
  auto together = run(all, together_runner);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ModelRunner alone_runner(*model, {64, 16, 1});
    EXPECT_EQ(run({i}, alone_runner)[i], together[i]) << fam << " prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FixtureReference, ::testing::ValuesIn(families()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FixtureReference);

TEST(FixtureReference, AllFamiliesPresent) {
  auto f = families();
  for (const char* want : {"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "qwen3_moe", "qwen3", "llama", "deepseek_v32"})
    EXPECT_NE(std::find(f.begin(), f.end(), want), f.end()) << "missing fixture " << want;
}

}  // namespace
