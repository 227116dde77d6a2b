// Scheduler + grammar constraints on a dummy-weight tiny model (vocab 300: the fixture tokenizer's
// special tokens, its 256 byte tokens and a few merges): constrained requests, greedy and sampled, batched with
// unconstrained ones, all end with finish "stop" on EOS and decode to documents that match; the
// unconstrained neighbours produce the tokens they produce alone; max_tokens still cuts a constrained
// request ("length"); a constraint compiled for another vocabulary is refused at add().
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "fixture_util.h"
#include "models/load_model.h"
#include "runtime/grammar_constraint.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "text/tokenizer.h"

using namespace moefold;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int kVocab = 300;  // every single-byte token of the fixture tokenizer (ids < 259)
constexpr int32_t kEos = 2;  // <|im_end|> in the fixture tokenizer

std::string write_model_dir() {
  json c = {{"vocab_size", kVocab}, {"hidden_size", 48}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"head_dim", 16}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
            {"intermediate_size", 64}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0},
            {"layer_types", {"linear_attention", "full_attention", "linear_attention", "full_attention"}},
            {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"linear_key_head_dim", 8},
            {"linear_value_head_dim", 12}, {"linear_conv_kernel_dim", 4},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
            {"shared_expert_intermediate_size", 24}, {"num_experts", 8}, {"num_experts_per_tok", 2},
            {"moe_intermediate_size", 16}, {"norm_topk_prob", true}, {"eos_token_id", kEos}};
  fs::path dir = fs::temp_directory_path() / ("moefold_sched_grammar_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << json{{"model_type", "qwen3_5_moe"}, {"text_config", c}}.dump(2);
  return dir.string();
}

struct Fixture {
  Tokenizer tok = Tokenizer::from_file(test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json");
  std::unique_ptr<Model> model = load_model(write_model_dir(), LoadFormat::Dummy, 3);
  GrammarCompiler grammar{tok, kVocab, {kEos}};
};

Fixture& fx() {
  static Fixture f;
  return f;
}

const char* kSchema = R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
  "c": {"enum": ["red", "blue"]}, "w": {"type": "string", "pattern": "^[a-z]{1,5}$"}}, "required": ["n", "c", "w"]})";

struct Out {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
};

std::map<RequestId, Out> run(const std::vector<std::pair<std::vector<int32_t>, SamplingParams>>& jobs) {
  ModelRunner runner(*fx().model, RunnerOptions{64, 16, 8});
  Scheduler sched(runner, SchedulerOptions{8, 256, 0, 1024});
  std::map<RequestId, Out> out;
  for (const auto& [p, sp] : jobs) out[sched.add(p, sp)];
  for (int guard = 0; sched.has_work() && guard < 2000; ++guard)
    for (const TokenOutput& o : sched.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      out[o.id].tokens.push_back(o.token);
      if (o.finish != FinishReason::kNone) out[o.id].finish = o.finish;
    }
  EXPECT_FALSE(sched.has_work());
  return out;
}

SamplingParams params(float temperature, int64_t seed, int max_tokens, std::shared_ptr<const CompiledConstraint> c) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.constraint = std::move(c);
  return p;
}

}  // namespace

TEST(SchedulerGrammar, ConstrainedRequestsEndInValidDocuments) {
  const auto schema = fx().grammar.compile(ConstraintSpec::json_schema(kSchema));
  const auto choice = fx().grammar.compile(ConstraintSpec::choice({"yes", "no"}));
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back({{5, 6, int32_t(7 + i)}, params(i % 2 ? 1.0f : 0.0f, i, 300, schema)});
  jobs.push_back({{9, 9}, params(1.0f, 1, 50, choice)});
  jobs.push_back({{10, 11, 12}, params(0.0f, 0, 12, nullptr)});  // unconstrained neighbour
  const auto out = run(jobs);
  ASSERT_EQ(out.size(), jobs.size());
  for (RequestId id = 0; id < 6; ++id) {
    const Out& o = out.at(id);
    ASSERT_EQ(o.finish, FinishReason::kStop) << fx().tok.decode(o.tokens);
    ASSERT_EQ(o.tokens.back(), kEos);
    const std::string text = fx().tok.decode(std::span<const int32_t>(o.tokens.data(), o.tokens.size() - 1));
    const json j = json::parse(text);
    EXPECT_TRUE(j.at("n").is_number_integer() && j["n"] >= 0 && j["n"] <= 99) << text;
    EXPECT_TRUE(j.at("c") == "red" || j.at("c") == "blue") << text;
    EXPECT_TRUE(std::regex_match(j.at("w").get<std::string>(), std::regex("[a-z]{1,5}"))) << text;
    EXPECT_EQ(j.size(), 3u) << text;
  }
  const Out& c = out.at(6);
  ASSERT_EQ(c.finish, FinishReason::kStop);
  const std::string answer = fx().tok.decode(std::span<const int32_t>(c.tokens.data(), c.tokens.size() - 1));
  EXPECT_TRUE(answer == "yes" || answer == "no") << answer;
  // The unconstrained request is unaffected by its constrained neighbours.
  const auto alone = run({jobs.back()});
  EXPECT_EQ(out.at(7).tokens, alone.at(0).tokens);
}

TEST(SchedulerGrammar, MaxTokensStillCutsAConstrainedRequest) {
  const auto schema = fx().grammar.compile(ConstraintSpec::json_schema(kSchema));
  const auto out = run({{{5, 6}, params(0.0f, 0, 4, schema)}});
  EXPECT_EQ(out.at(0).finish, FinishReason::kLength);
  EXPECT_EQ(out.at(0).tokens.size(), 4u);
  EXPECT_EQ(fx().tok.decode(out.at(0).tokens).substr(0, 2), "{\"");
}

TEST(SchedulerGrammar, ConstraintOfAnotherVocabularyIsRefused) {
  const GrammarCompiler other(fx().tok, 200, {kEos});
  ModelRunner runner(*fx().model, RunnerOptions{16, 16, 2});
  Scheduler sched(runner, SchedulerOptions{2, 64, 0, 256});
  EXPECT_THROW(sched.add({1, 2}, params(0.0f, 0, 4, other.compile(ConstraintSpec::regex("a+")))), Error);
}

