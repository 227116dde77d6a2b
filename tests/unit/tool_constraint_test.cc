// The grammar of forced tool calls (tool_constraint.h) and the parsers agree: random walks through
// the grammar (a uniformly random allowed token each step, the worst case of a random-weight
// model) always end in complete tool calls that the request's parser reads back, with arguments
// that are JSON objects holding the required parameters of the schema, in both formats.
#include "server/tool_constraint.h"

#include <gtest/gtest.h>

#include <random>

#include "server/chat_output.h"
#include "text/detokenizer.h"
#include "fixture_util.h"

namespace moefold::server {
namespace {

using Json = nlohmann::ordered_json;

const Tokenizer& tokenizer() {
  static const Tokenizer t =
      Tokenizer::from_file(moefold::test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json");
  return t;
}

int32_t eos() { return tokenizer().token_to_id("<|im_end|>").value(); }

const GrammarCompiler& compiler() {
  static const GrammarCompiler c(tokenizer(), tokenizer().vocab_size(), {eos()});
  return c;
}

std::vector<ToolSpec> tools() {
  return {
      {"get_weather", Json::parse(R"({"type": "object", "properties": {
          "city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "days", "unit"], "additionalProperties": false})")},
      {"get_time", Json::parse(R"({"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]},
          "verbose": {"type": "boolean"}}, "required": ["tz", "verbose"], "additionalProperties": false})")},
  };
}

/// Text of a random walk through `c` (seeded); `done` is false when it did not reach EOS within max_steps.
std::string random_walk(const std::shared_ptr<const CompiledConstraint>& c, uint64_t seed, int max_steps, bool& done) {
  done = false;
  GrammarMatcher m(c);
  std::vector<uint32_t> mask(bitmask_words(compiler().vocab_size()));
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids;
  for (int step = 0; step < max_steps; ++step) {
    m.fill_next_token_bitmask(mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < int32_t(compiler().vocab_size()); ++t)
      if (bitmask_allows(mask, t)) allowed.push_back(t);
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    EXPECT_TRUE(m.accept_token(t));
    if (t == eos()) {
      done = true;
      break;
    }
    ids.push_back(t);
  }
  return tokenizer().decode(ids, true);
}

void check_format(const std::string& parser, const ToolRequest& base, bool close_think = false) {
  ToolRequest req = base;
  req.parser = parser;
  const auto c = compiler().compile(tool_call_constraint(req, close_think ? "</think>\n\n" : ""));
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    bool done = false;
    const std::string text = random_walk(c, seed, 3000, done);
    SCOPED_TRACE(parser + " seed " + std::to_string(seed) + ": " + text);
    ASSERT_TRUE(done) << "the walk did not complete";
    ChatOutputOptions o;
    o.tool_parser = parser;
    o.tools = req.tools;
    if (close_think) {
      EXPECT_EQ(text.rfind("</think>\n\n<tool_call>", 0), 0u);
      o.reasoning_parser = "qwen3";
      o.prompt = "<|im_start|>assistant\n<think>\n";
    }
    const ChatMessage msg = ChatOutputParser(o).parse(text);
    EXPECT_EQ(msg.content, "");
    EXPECT_FALSE(msg.has_reasoning);
    ASSERT_GE(msg.tool_calls.size(), 1u);
    if (!req.parallel_tool_calls || req.choice == ToolChoice::kNamed) {
      EXPECT_EQ(msg.tool_calls.size(), 1u);
    }
    for (const ToolCall& call : msg.tool_calls) {
      if (req.choice == ToolChoice::kNamed) {
        EXPECT_EQ(call.name, req.named);
      }
      const Json args = Json::parse(call.arguments, nullptr, false);
      ASSERT_TRUE(args.is_object()) << call.arguments;
      for (const ToolSpec& t : req.tools) {
        if (t.name != call.name) continue;
        for (const Json& r : t.parameters["required"]) {
          EXPECT_TRUE(args.contains(r.get<std::string>())) << call.arguments;
        }
      }
      if (call.name == "get_weather") {
        EXPECT_TRUE(args["days"].is_number_integer()) << call.arguments;
        EXPECT_TRUE(args["city"].is_string() && args["city"].get<std::string>().size() <= 8 * 4) << call.arguments;
      }
      if (call.name == "get_time") {
        EXPECT_TRUE(args["verbose"].is_boolean()) << call.arguments;
      }
    }
  }
}

TEST(ToolConstraint, RequiredWalksParseAsToolCalls) {
  ToolRequest req;
  req.tools = tools();
  req.choice = ToolChoice::kRequired;
  for (const std::string& p : tool_parser_names()) check_format(p, req);
  req.parallel_tool_calls = false;
  for (const std::string& p : tool_parser_names()) check_format(p, req);
}

TEST(ToolConstraint, NamedWalksCallThatFunction) {
  ToolRequest req;
  req.tools = tools();
  req.choice = ToolChoice::kNamed;
  req.named = "get_time";
  for (const std::string& p : tool_parser_names()) check_format(p, req);
}

TEST(ToolConstraint, AnOpenThinkBlockIsClosedFirst) {
  ToolRequest req;
  req.tools = tools();
  req.choice = ToolChoice::kNamed;
  req.named = "get_weather";
  for (const std::string& p : tool_parser_names()) check_format(p, req, true);
}

TEST(ToolConstraint, TheTagNamesEachToolInItsFormat) {
  ToolRequest req;
  req.tools = tools();
  req.choice = ToolChoice::kRequired;
  req.parser = "qwen3_coder";
  const Json tag = Json::parse(tool_call_structural_tag(req));
  EXPECT_EQ(tag["type"], "structural_tag");
  EXPECT_EQ(tag["format"]["tags"][0]["begin"], "<tool_call>\n<function=get_weather>\n");
  req.parser = "hermes";
  EXPECT_EQ(Json::parse(tool_call_structural_tag(req))["format"]["tags"][1]["begin"],
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ");
  req.parser = "mistral";
  EXPECT_THROW(tool_call_structural_tag(req), Error);
}

}  // namespace
}  // namespace moefold::server
