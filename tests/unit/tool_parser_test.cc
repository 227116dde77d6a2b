// Tool-call parsers (qwen3_coder, hermes) and the chat output pipeline on model outputs written in
// the formats the Qwen3.5/3.6 and Qwen3/Hermes chat templates ask for: complete calls, several
// calls, text before and after, outputs truncated mid-call, malformed blocks, thinking before a
// call. Every case is parsed whole, one character at a time and in uneven pieces; the streamed
// deltas must concatenate to the whole message and start each call with its id and name.
#include "server/tool_parsers/tool_parser.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "server/chat_output.h"
#include "server/tool_parsers/qwen3_coder_parser.h"
#include "text/chat_template.h"
#include "fixture_util.h"

namespace moefold::server {
namespace {

using Json = nlohmann::ordered_json;

std::vector<ToolSpec> weather_tools() {
  return {
      {"get_weather", Json::parse(R"({"type": "object", "properties": {
          "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
          "lat": {"type": "number"}, "zip": {"type": "string"}, "hours": {"type": "array", "items": {"type": "integer"}},
          "opts": {"type": "object"}, "note": {"type": ["string", "null"]}}, "required": ["city"]})")},
      {"get_time", Json::parse(R"({"type": "object", "properties": {"tz": {"type": "string"}}})")},
  };
}

/// Deterministic ids: call_0, call_1, ... per parser.
ToolCallIdFn counting_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments JSON text
  std::string reasoning;
  bool has_reasoning = false;
};

ChatOutputOptions options(const std::string& tool_parser, const std::string& reasoning = "",
                          const std::string& prompt = "") {
  ChatOutputOptions o;
  o.tool_parser = tool_parser;
  o.tools = weather_tools();
  o.reasoning_parser = reasoning;
  o.prompt = prompt;
  o.make_id = counting_ids();
  return o;
}

/// Feeds `text` in pieces of `sizes` (cycled; 0 = all at once) and checks the delta shapes.
ChatMessage parse_in_pieces(const ChatOutputOptions& o, const std::string& text, std::vector<size_t> sizes) {
  ChatOutputParser p(o);
  ChatMessage m;
  std::map<int32_t, bool> seen;
  auto check = [&](const OutputDelta& d) {
    for (const ToolCallDelta& t : d.tool_calls) {
      if (!seen[t.index]) {
        EXPECT_FALSE(t.id.empty()) << "the first fragment of call " << t.index << " carries its id";
        EXPECT_FALSE(t.name.empty()) << "the first fragment of call " << t.index << " carries its name";
        EXPECT_EQ(t.index, int32_t(seen.size()) - 1) << "calls are numbered in order";
        seen[t.index] = true;
      } else {
        EXPECT_TRUE(t.id.empty() && t.name.empty()) << "later fragments carry arguments only";
      }
    }
    m.append(d);
  };
  size_t pos = 0, k = 0;
  while (pos < text.size()) {
    size_t n = sizes[k++ % sizes.size()];
    if (n == 0) n = text.size();
    n = std::min(n, text.size() - pos);
    check(p.feed(std::string_view(text).substr(pos, n)));
    pos += n;
  }
  check(p.finish());
  EXPECT_EQ(p.num_tool_calls(), int32_t(m.tool_calls.size()));
  return m;
}

void expect_message(const ChatOutputOptions& o, const std::string& text, const Expected& e) {
  SCOPED_TRACE(text);
  const ChatMessage whole = parse_in_pieces(o, text, {0});
  EXPECT_EQ(whole.content, e.content);
  EXPECT_EQ(whole.reasoning, e.reasoning);
  EXPECT_EQ(whole.has_reasoning, e.has_reasoning);
  ASSERT_EQ(whole.tool_calls.size(), e.calls.size());
  for (size_t i = 0; i < e.calls.size(); ++i) {
    EXPECT_EQ(whole.tool_calls[i].id, "call_" + std::to_string(i));
    EXPECT_EQ(whole.tool_calls[i].name, e.calls[i].first);
    EXPECT_EQ(whole.tool_calls[i].arguments, e.calls[i].second);
  }
  for (const std::vector<size_t>& sizes : {std::vector<size_t>{1}, {2}, {3, 1, 7}, {5, 11, 2}}) {
    const ChatMessage s = parse_in_pieces(o, text, sizes);
    EXPECT_EQ(s.content, whole.content) << "pieces of " << sizes[0];
    EXPECT_EQ(s.reasoning, whole.reasoning);
    ASSERT_EQ(s.tool_calls.size(), whole.tool_calls.size());
    for (size_t i = 0; i < s.tool_calls.size(); ++i) {
      EXPECT_EQ(s.tool_calls[i].name, whole.tool_calls[i].name);
      EXPECT_EQ(s.tool_calls[i].arguments, whole.tool_calls[i].arguments) << "pieces of " << sizes[0];
    }
  }
}

// --- qwen3_coder ------------------------------------------------------------------------------

TEST(Qwen3CoderParser, OneCallWithTextBefore) {
  expect_message(options("qwen3_coder"),
                 "I'll look up the weather in Paris.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                 "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                 {"I'll look up the weather in Paris.", {{"get_weather", R"({"city": "Paris", "days": 3})"}}});
}

TEST(Qwen3CoderParser, CallOnlyHasEmptyContent) {
  expect_message(options("qwen3_coder"),
                 "<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Paris\n</parameter>\n</function>\n</tool_call>",
                 {"", {{"get_time", R"({"tz": "Europe/Paris"})"}}});
}

TEST(Qwen3CoderParser, SeveralCallsAndTextAfter) {
  expect_message(options("qwen3_coder"),
                 "Checking both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
                 "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Oslo\n</parameter>\n</function>\n"
                 "</tool_call>\n\nI will report back.\n",
                 {"Checking both.I will report back.",
                  {{"get_weather", R"({"city": "Oslo"})"}, {"get_time", R"({"tz": "Europe/Oslo"})"}}});
}

TEST(Qwen3CoderParser, ValuesFollowTheSchemaTypes) {
  expect_message(
      options("qwen3_coder"),
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n7\n"
      "</parameter>\n<parameter=metric>\nFalse\n</parameter>\n<parameter=lat>\n37.77\n</parameter>\n<parameter=zip>\n"
      "04103\n</parameter>\n<parameter=hours>\n[6, 12, 18]\n</parameter>\n<parameter=opts>\n{\"units\": \"si\", "
      "\"alerts\": true}\n</parameter>\n<parameter=note>\nnull\n</parameter>\n<parameter=extra>\nfirst line\n"
      "second \"line\"\n</parameter>\n</function>\n</tool_call>",
      {"",
       {{"get_weather",
         R"({"city": "San Francisco", "days": 7, "metric": false, "lat": 37.77, "zip": "04103", "hours": [6,12,18], )"
         R"("opts": {"units":"si","alerts":true}, "note": null, "extra": "first line\nsecond \"line\""})"}}});
}

TEST(Qwen3CoderParser, ValuesThatDoNotFitTheirTypeStayStrings) {
  EXPECT_EQ(convert_parameter_value("three", Json::parse(R"({"type": "integer"})")), "\"three\"");
  EXPECT_EQ(convert_parameter_value("2.5", Json::parse(R"({"type": "integer"})")), "2.5");
  EXPECT_EQ(convert_parameter_value("yes", Json::parse(R"({"type": "boolean"})")), "\"yes\"");
  EXPECT_EQ(convert_parameter_value("[1, 2", Json::parse(R"({"type": "array"})")), "\"[1, 2\"");
  EXPECT_EQ(convert_parameter_value("42", Json()), "\"42\"");  // no schema: a string
  EXPECT_EQ(convert_parameter_value("42", Json::parse(R"({"anyOf": [{"type": "integer"}, {"type": "string"}]})")), "42");
  EXPECT_EQ(convert_parameter_value("null", Json::parse(R"({"type": "string"})")), "\"null\"");
}

TEST(Qwen3CoderParser, TruncatedMidCall) {
  // max_tokens ran out inside a value: the call keeps what was complete (finish_reason "length").
  expect_message(options("qwen3_coder"),
                 "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                 "<parameter=days>\n1",
                 {"Let me check.", {{"get_weather", R"({"city": "Paris")"}}});
  expect_message(options("qwen3_coder"), "<tool_call>\n<function=get_weather>\n<param",
                 {"", {{"get_weather", ""}}});
  // Before the function name is complete nothing names a call: the text is content.
  expect_message(options("qwen3_coder"), "Sure. <tool_call>\n<function=get_wea",
                 {"Sure. <tool_call>\n<function=get_wea", {}});
}

TEST(Qwen3CoderParser, UnclosedParameterAndFunctionEndAtTheBlockEnd) {
  expect_message(options("qwen3_coder"),
                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\n2\n</tool_call>",
                 {"", {{"get_weather", R"({"city": "Rome", "days": 2})"}}});
  expect_message(options("qwen3_coder"), "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
                 {"", {{"get_time", "{}"}}});
}

TEST(Qwen3CoderParser, TextWithoutCallsIsUnchanged) {
  const std::string text = "Plain answer with a <tag> and a <tool_ mention.\n\n";
  expect_message(options("qwen3_coder"), text, {text, {}});
  expect_message(options("qwen3_coder"), "Ends in a partial tag <tool_ca", {"Ends in a partial tag <tool_ca", {}});
}

TEST(Qwen3CoderParser, BlockWithoutFunctionIsContent) {
  expect_message(options("qwen3_coder"), "A <tool_call>nothing here</tool_call> B",
                 {"A <tool_call>nothing here</tool_call> B", {}});
}

// --- hermes -----------------------------------------------------------------------------------

TEST(HermesParser, OneCallWithTextBefore) {
  expect_message(options("hermes"),
                 "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                 "\"days\": 3}}\n</tool_call>",
                 {"Let me check.", {{"get_weather", R"({"city": "Paris", "days": 3})"}}});
}

TEST(HermesParser, SeveralCallsAndTextAfter) {
  expect_message(options("hermes"),
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
                 "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Oslo\"}}\n</tool_call>\nDone.",
                 {"Done.", {{"get_weather", R"({"city": "Oslo"})"}, {"get_time", R"({"tz": "Europe/Oslo"})"}}});
}

TEST(HermesParser, BracesAndQuotesInsideStrings) {
  expect_message(options("hermes"),
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a } b \\\" { [\", \"hours\": "
                 "[1, [2]], \"opts\": {\"x\": {}}}}\n</tool_call>",
                 {"", {{"get_weather", R"({"city": "a } b \" { [", "hours": [1, [2]], "opts": {"x": {}}})"}}});
}

TEST(HermesParser, RawControlCharactersInStringsAreEscaped) {
  expect_message(options("hermes"),
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\tb\nc\"}}\n</tool_call>",
                 {"", {{"get_weather", R"({"city": "a\u0009b\u000ac"})"}}});
}

TEST(HermesParser, OtherKeyOrdersAndStringArguments) {
  expect_message(options("hermes"),
                 "<tool_call>\n{\"arguments\": {\"city\": \"Lima\"}, \"name\": \"get_weather\"}\n</tool_call>",
                 {"", {{"get_weather", R"({"city":"Lima"})"}}});
  expect_message(options("hermes"),
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Lima\\\"}\"}\n</tool_call>",
                 {"", {{"get_weather", R"({"city": "Lima"})"}}});
  expect_message(options("hermes"), "<tool_call>\n{\"name\": \"get_time\", \"parameters\": {}}\n</tool_call>",
                 {"", {{"get_time", "{}"}}});
}

TEST(HermesParser, TruncatedMidCall) {
  expect_message(options("hermes"),
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
                 {"", {{"get_weather", R"({"city": "Par)"}}});
  expect_message(options("hermes"), "Hm <tool_call>\n{\"name\": \"get_wea", {"Hm <tool_call>\n{\"name\": \"get_wea", {}});
}

TEST(HermesParser, MalformedBlockIsContent) {
  expect_message(options("hermes"), "<tool_call>\nnot json at all\n</tool_call>",
                 {"<tool_call>\nnot json at all\n</tool_call>", {}});
}

// --- with thinking ----------------------------------------------------------------------------

TEST(ChatOutput, ThinkingThenCall) {
  // The Qwen3.6 template opened <think> in the prompt.
  expect_message(options("qwen3_coder", "qwen3", "<|im_start|>assistant\n<think>\n"),
                 "The user wants the weather; <tool_call> comes later.\n</think>\n\n<tool_call>\n<function=get_weather>"
                 "\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
                 {"", {{"get_weather", R"({"city": "Paris"})"}}, "The user wants the weather; <tool_call> comes later.\n",
                  true});
  expect_message(options("hermes", "qwen3", "<|im_start|>assistant\n"),
                 "<think>\nOne call.\n</think>\n\nCalling.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
                 "</tool_call>",
                 {"Calling.", {{"get_time", "{}"}}, "\nOne call.\n", true});
}

TEST(ChatOutput, TruncatedWhileThinking) {
  expect_message(options("qwen3_coder", "qwen3", "<|im_start|>assistant\n<think>\n"), "Still thinking about <tool_c",
                 {"", {}, "Still thinking about <tool_c", true});
}

TEST(ChatOutput, NoParsersPassTextThrough) {
  ChatOutputOptions o;
  expect_message(o, "<think>x</think><tool_call>\n<function=f>\n</function>\n</tool_call>",
                 {"<think>x</think><tool_call>\n<function=f>\n</function>\n</tool_call>", {}});
}

// --- registry ---------------------------------------------------------------------------------

TEST(ToolParserRegistry, NamesIdsAndTemplateDetection) {
  EXPECT_THROW(make_tool_parser("mistral", {}), Error);
  for (const std::string& n : tool_parser_names()) EXPECT_NE(make_tool_parser(n, {}), nullptr);
  const std::string id = random_tool_call_id();
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(id.size(), 29u);
  EXPECT_NE(id, random_tool_call_id());
  auto tmpl = [](const std::string& model) {
    return *ChatTemplate::from_model_dir((test::kFixtures / "chat_templates" / model).string()).source();
  };
  EXPECT_EQ(tool_parser_for_template(tmpl("qwen3_6")), "qwen3_coder");
  EXPECT_EQ(tool_parser_for_template(tmpl("qwen3")), "hermes");
  EXPECT_EQ(tool_parser_for_template(tmpl("smollm2")), "");
}

}  // namespace
}  // namespace moefold::server
