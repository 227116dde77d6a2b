// parse_request: nesting-depth limit, integer ranges, clipped echoes, generation_config defaults.
#include "server/request_parser.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "server/api_error.h"
#include "server/generation_config.h"
#include "server/json_depth.h"
#include "fixture_util.h"

namespace moefold::server {
namespace {

using Json = nlohmann::ordered_json;

const Tokenizer& tokenizer() {
  static const Tokenizer t =
      Tokenizer::from_file(moefold::test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json");
  return t;
}

const ChatTemplate& chat_template() {
  static const ChatTemplate t = ChatTemplate::from_string(
      "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
      "{% if tools %}tools: {{ tools | length }}\n{% endif %}");
  return t;
}

ModelInfo info() {
  ModelInfo i;
  i.name = "tiny";
  i.max_model_len = 1024;
  i.vocab_size = 1000;
  i.tokenizer = &tokenizer();
  i.chat_template = &chat_template();
  return i;
}

/// The ApiError parse_request throws for `body` (fails the test if it does not throw).
ApiError error_of(Api api, const std::string& body, const ModelInfo& mi = info()) {
  try {
    parse_request(api, body, mi);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body.substr(0, 200);
  return ApiError(0, "", "");
}

std::string nested(size_t depth, const std::string& leaf = "1") {
  return std::string(depth, '[') + leaf + std::string(depth, ']');
}

std::string nested_objects(size_t depth) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

TEST(JsonDepth, CountsLevelsWithoutRecursion) {
  EXPECT_EQ(json_depth(Json(3)), 0);
  EXPECT_EQ(json_depth(Json::array()), 1);
  EXPECT_EQ(json_depth(Json::parse(R"({"a": [1, {"b": []}], "c": 2})")), 4);
  // Far deeper than any stack would take recursively; the walk stops early when told to.
  const Json deep = Json::parse(nested(100000));
  EXPECT_EQ(json_depth(deep, 1 << 30), 100000);
  EXPECT_EQ(json_depth(deep, 10), 11);
}

// Before the limit, each of these overflowed the stack (a crash of the whole server).
TEST(RequestParser, DeeplyNestedFieldsAre400NotACrash) {
  const size_t depth = 30000;
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<std::pair<Api, std::string>> bodies = {
      {Api::kChat, R"({"messages": [{"role": "user", "content": "hi", "extra": )" + nested(depth) + "}]}"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "hi", "extra": )" + nested_objects(depth) + "}]}"},
      {Api::kChat, "{" + msgs + R"(, "tools": )" + nested(depth) + "}"},
      {Api::kChat, "{" + msgs + R"(, "tools": [{"type": "function", "function": )" + nested_objects(depth) + "}]}"},
      {Api::kChat, "{" + msgs + R"(, "chat_template_kwargs": {"x": )" + nested(depth) + "}}"},
      {Api::kCompletions, R"({"prompt": )" + nested(depth) + "}"},
      // nlohmann's parser and destructor are iterative: a million levels (2 MB) parse and free.
      {Api::kCompletions, R"({"prompt": "x", "stop": )" + nested(1000000) + "}"},
  };
  for (const auto& [api, body] : bodies) {
    const ApiError e = error_of(api, body);
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "json_too_deep");
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxRequestJsonDepth)), std::string::npos) << e.what();
  }
}

TEST(RequestParser, NestingUpToTheLimitIsAccepted) {
  // messages (1) > message (2) > extra: nested to depth kMaxRequestJsonDepth in total.
  const std::string ok = R"({"messages": [{"role": "user", "content": "hi", "extra": )" +
                         nested(size_t(kMaxRequestJsonDepth - 3)) + "}]}";
  EXPECT_NO_THROW(parse_request(Api::kChat, ok, info()));
  const std::string deeper = R"({"messages": [{"role": "user", "content": "hi", "extra": )" +
                             nested(size_t(kMaxRequestJsonDepth - 2)) + "}]}";
  EXPECT_EQ(error_of(Api::kChat, deeper).code(), "json_too_deep");
}

TEST(RequestParser, IntegersOutOfRangeAre400NamingTheField) {
  struct Case {
    const char* field;
    const char* value;
  };
  const Case cases[] = {
      {"seed", "9223372036854775808"},      // INT64_MAX + 1: used to wrap to INT64_MIN
      {"seed", "18446744073709551615"},     // UINT64_MAX: used to wrap to -1
      {"seed", "18446744073709551616"},     // beyond 64 bits (a double)
      {"seed", "-9223372036854775809"},
      {"seed", "1e300"},
      {"top_k", "9223372036854775808"},
      {"top_k", "4294967296"},              // used to saturate silently
      {"top_k", "-2"},
      {"max_tokens", "18446744073709551615"},
      {"max_tokens", "1e30"},
      {"n", "18446744073709551617"},
      {"n", "0"},
      {"logprobs", "18446744073709551615"},
      {"logprobs", "21"},
      {"best_of", "18446744073709551615"},
  };
  for (const Case& c : cases) {
    const std::string body = fmt::format(R"({{"prompt": "hello", "{}": {}}})", c.field, c.value);
    const ApiError e = error_of(Api::kCompletions, body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), c.field) << body << ": " << e.what();
  }
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": )";
  EXPECT_EQ(error_of(Api::kChat, chat + "9223372036854775808}").param(), "top_logprobs");
  EXPECT_EQ(error_of(Api::kChat, chat + "4294967297}").param(), "top_logprobs");
  EXPECT_EQ(error_of(Api::kCompletions, R"({"prompt": "x", "stop_token_ids": [4294967296]})").param(), "stop_token_ids");
  EXPECT_EQ(error_of(Api::kCompletions, R"({"prompt": "x", "stop_token_ids": [-1]})").param(), "stop_token_ids");
}

TEST(RequestParser, NonIntegersAre400) {
  for (const char* field : {"seed", "top_k", "max_tokens", "n"}) {
    const ApiError e = error_of(Api::kCompletions, fmt::format(R"({{"prompt": "x", "{}": 2.5}})", field));
    EXPECT_EQ(e.param(), field);
    EXPECT_NE(std::string(e.what()).find("integer"), std::string::npos) << e.what();
  }
}

TEST(RequestParser, IntegersInRangeKeepTheirValue) {
  const ParsedRequest r = parse_request(
      Api::kCompletions,
      R"({"prompt": "x", "seed": 9223372036854775807, "top_k": 2147483647, "max_tokens": 4.0, "n": 2})", info());
  EXPECT_EQ(*r.params.seed, INT64_MAX);
  EXPECT_EQ(r.params.top_k, INT32_MAX);
  EXPECT_EQ(r.max_tokens[0], 4);
  EXPECT_EQ(r.n, 2);
  const ParsedRequest neg = parse_request(Api::kCompletions, R"({"prompt": "x", "seed": -9223372036854775808})", info());
  EXPECT_EQ(*neg.params.seed, INT64_MIN);
}

TEST(RequestParser, EchoedValuesAreClipped) {
  const std::string huge(10 << 20, 'm');
  const ApiError e = error_of(Api::kCompletions, R"({"prompt": "x", "model": ")" + huge + "\"}");
  EXPECT_EQ(e.param(), "model");
  EXPECT_LT(std::string(e.what()).size(), 400u);
  EXPECT_NE(std::string(e.what()).find(std::string(kMaxEchoedChars, 'm') + "..."), std::string::npos);
  // Every message is capped, whatever it repeats.
  EXPECT_LE(ApiError::error_body(huge, "t", "", "").dump().size(), kMaxMessageChars + 200);
}

TEST(Clip, KeepsShortStringsAndUtf8Characters) {
  EXPECT_EQ(clip("abc", 5), "abc");
  EXPECT_EQ(clip("abcdef", 3), "abc...");
  EXPECT_EQ(clip("a\xc3\xa9" "b", 2), "a...");  // does not cut the two-byte é
}

TEST(RequestParser, GenerationConfigDefaultsApplyAndRequestsOverrideThem) {
  ModelInfo mi = info();
  mi.sampling_defaults.temperature = 0.25f;
  mi.sampling_defaults.top_k = 20;
  mi.sampling_defaults.repetition_penalty = 1.1f;
  const ParsedRequest d = parse_request(Api::kCompletions, R"({"prompt": "x"})", mi);
  EXPECT_FLOAT_EQ(d.params.temperature, 0.25f);
  EXPECT_EQ(d.params.top_k, 20);
  EXPECT_FLOAT_EQ(d.params.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(d.params.top_p, 1.0f);  // not in the defaults: SamplingParams' own
  const ParsedRequest o = parse_request(Api::kCompletions, R"({"prompt": "x", "temperature": 0.9, "top_k": -1})", mi);
  EXPECT_FLOAT_EQ(o.params.temperature, 0.9f);
  EXPECT_EQ(o.params.top_k, -1);
}

class GenerationConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("moefold_gencfg_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "generation_config.json") << text; }
  std::filesystem::path dir_;
};

TEST_F(GenerationConfigFile, MissingFileGivesNoDefaults) { EXPECT_TRUE(load_generation_config(dir_.string()).empty()); }

TEST_F(GenerationConfigFile, ReadsTheFiveSamplingFields) {
  write(R"({"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.05, "max_new_tokens": 100, "eos_token_id": [1, 2], "bos_token_id": null})");
  const SamplingDefaults d = load_generation_config(dir_.string());
  EXPECT_FLOAT_EQ(*d.temperature, 0.7f);
  EXPECT_FLOAT_EQ(*d.top_p, 0.8f);
  EXPECT_EQ(*d.top_k, 20);
  EXPECT_FLOAT_EQ(*d.min_p, 0.05f);
  EXPECT_FLOAT_EQ(*d.repetition_penalty, 1.05f);
  EXPECT_EQ(d.describe(), "temperature=0.7 top_p=0.8 top_k=20 min_p=0.05 repetition_penalty=1.05");
}

TEST_F(GenerationConfigFile, BadValuesFailAtStartUpNamingTheField) {
  write(R"({"top_p": 1.5})");
  try {
    load_generation_config(dir_.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
  }
  write(R"({"top_k": 2.5})");
  EXPECT_THROW(load_generation_config(dir_.string()), Error);
  write(R"({"temperature": "hot"})");
  EXPECT_THROW(load_generation_config(dir_.string()), Error);
  write("[1]");
  EXPECT_THROW(load_generation_config(dir_.string()), Error);
}

}  // namespace
}  // namespace moefold::server
