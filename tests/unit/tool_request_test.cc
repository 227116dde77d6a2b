// tools / tool_choice in chat requests: the checks of tool_request.h, and a multi-turn exchange
// (assistant tool_calls with JSON-string arguments and content null, then the tool's result)
// rendered through the Qwen3.6 chat template in its own tool-call format.
#include "server/tool_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request_parser.h"
#include "fixture_util.h"

namespace moefold::server {
namespace {

using Json = nlohmann::ordered_json;

const Tokenizer& tokenizer() {
  static const Tokenizer t =
      Tokenizer::from_file(moefold::test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json");
  return t;
}

const ChatTemplate& qwen36() {
  static const ChatTemplate t =
      ChatTemplate::from_model_dir((moefold::test::kFixtures / "chat_templates" / "qwen3_6").string());
  return t;
}

const GrammarCompiler& grammar() {
  static const GrammarCompiler g(tokenizer(), 3000, {tokenizer().token_to_id("<|im_end|>").value()});
  return g;
}

ModelInfo info(bool auto_tools) {
  ModelInfo i;
  i.name = "tiny";
  i.max_model_len = 8192;
  i.vocab_size = 3000;
  i.tokenizer = &tokenizer();
  i.chat_template = &qwen36();
  i.tool_serving = {"qwen3_coder", auto_tools};
  i.grammar = &grammar();
  i.reasoning_parser = "qwen3";
  return i;
}

const char* kTools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])";

std::string body(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": )" + std::string(kTools) + extra +
         "}";
}

ApiError error_of(const std::string& b, const ModelInfo& mi) {
  try {
    parse_request(Api::kChat, b, mi);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << b;
  return ApiError(0, "", "");
}

ApiError error_of(const std::string& b, bool auto_tools = true) { return error_of(b, info(auto_tools)); }

TEST(ToolRequest, ChoicesAndTheirParser) {
  ParsedRequest r = parse_request(Api::kChat, body(""), info(true));
  EXPECT_EQ(r.tools.choice, ToolChoice::kAuto);  // the default with tools
  EXPECT_EQ(r.tools.parser, "qwen3_coder");
  ASSERT_EQ(r.tools.tools.size(), 1u);
  EXPECT_EQ(r.tools.tools[0].name, "get_weather");
  r = parse_request(Api::kChat, body(R"(, "tool_choice": "none")"), info(false));
  EXPECT_EQ(r.tools.choice, ToolChoice::kNone);
  EXPECT_EQ(r.tools.parser, "");
  EXPECT_NE(r.prompt_text.find("<tools>"), std::string::npos) << "tools are still shown to the template";
  r = parse_request(Api::kChat, body(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
                    info(false));
  EXPECT_EQ(r.tools.choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tools.named, "get_weather");
  r = parse_request(Api::kChat, body(R"(, "tool_choice": "required", "parallel_tool_calls": false)"), info(false));
  EXPECT_TRUE(r.tools.forced());
  EXPECT_FALSE(r.tools.parallel_tool_calls);
  EXPECT_NE(r.params.constraint, nullptr) << "forced calls are enforced by the grammar";
  EXPECT_EQ(r.reasoning_parser, "qwen3") << "the grammar closes the think block the template opened";
  r = parse_request(Api::kChat, body(R"(, "tool_choice": "required", "chat_template_kwargs": {"enable_thinking": false})"),
                    info(false));
  EXPECT_EQ(r.reasoning_parser, "") << "no think block open: the constrained output is not split";
  r = parse_request(Api::kChat, body(R"(, "tool_choice": "none", "response_format": {"type": "json_object"})"), info(false));
  EXPECT_EQ(r.reasoning_parser, "") << "a JSON constraint starts at the first token";
  EXPECT_EQ(parse_request(Api::kChat, body(""), info(true)).reasoning_parser, "qwen3");
  // A server without a parser still forces calls, in the hermes format.
  ModelInfo bare = info(false);
  bare.tool_serving = {};
  EXPECT_EQ(parse_request(Api::kChat, body(R"(, "tool_choice": "required")"), bare).tools.parser, "hermes");
}

TEST(ToolRequest, BadFieldsAre400NamingThem) {
  EXPECT_NE(std::string(error_of(body(""), false).what()).find("--enable-auto-tool-choice"), std::string::npos);
  EXPECT_EQ(error_of(body(R"(, "tool_choice": "always")")).param(), "tool_choice");
  EXPECT_EQ(error_of(body(R"(, "tool_choice": {"type": "function", "function": {"name": "other"}})")).param(),
            "tool_choice");
  EXPECT_EQ(error_of(body(R"(, "parallel_tool_calls": 1)")).param(), "parallel_tool_calls");
  EXPECT_EQ(error_of(body(R"(, "tool_choice": "required", "response_format": {"type": "json_object"})")).param(),
            "tool_choice");
  ModelInfo no_grammar = info(true);
  no_grammar.grammar = nullptr;
  EXPECT_EQ(error_of(body(R"(, "tool_choice": "required")"), no_grammar).status(), 400);
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})").param(),
            "tool_choice");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": ""}}]})").param(), "tools[0].function.name");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": [1]}}]})").param(), "tools[0].function.parameters");
}

TEST(ToolRequest, ToolResultRoundTripsThroughTheTemplate) {
  const std::string b = R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18}"}],
    "tools": )" + std::string(kTools) + R"(, "tool_choice": "auto"})";
  const ParsedRequest r = parse_request(Api::kChat, b, info(true));
  EXPECT_NE(r.prompt_text.find("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                               "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>"),
            std::string::npos)
      << r.prompt_text;
  EXPECT_NE(r.prompt_text.find("<|im_start|>user\n<tool_response>\n{\"temperature\": 18}\n</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n<think>\n"),
            std::string::npos)
      << r.prompt_text;
}

TEST(ToolRequest, PrepareMessagesLeavesUnparsableArgumentsAlone) {
  Json m = Json::parse(R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}])");
  prepare_tool_messages(m);
  EXPECT_EQ(m[0]["content"], "");
  EXPECT_EQ(m[0]["tool_calls"][0]["function"]["arguments"], "not json");
}

}  // namespace
}  // namespace moefold::server
