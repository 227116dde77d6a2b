// Reasoning parsers: where the output starts is read from the rendered prompt (the Qwen3.6
// template opens <think>, or closes an empty block when enable_thinking is false; SmolLM2's has
// none), the tags never reach either field, and streaming one character at a time gives the same
// split as the whole text.
#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "text/chat_template.h"
#include "fixture_util.h"

namespace moefold::server {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& model, const Json& kwargs) {
  const ChatTemplate t = ChatTemplate::from_model_dir((test::kFixtures / "chat_templates" / model).string());
  return t.render(Json::parse(R"([{"role": "user", "content": "What is 2+2?"}])"), nullptr, true, kwargs);
}

struct Split {
  std::string reasoning, content;
};

Split split(const std::string& parser, const std::string& prompt, const std::string& text, size_t piece) {
  ReasoningParser p(parser, prompt);
  OutputDelta d;
  if (piece == 0) {
    p.feed(text, d);
  } else {
    for (size_t i = 0; i < text.size(); i += piece) p.feed(std::string_view(text).substr(i, piece), d);
  }
  p.finish(d);
  return {d.reasoning, d.content};
}

void expect_split(const std::string& parser, const std::string& prompt, const std::string& text,
                  const std::string& reasoning, const std::string& content) {
  SCOPED_TRACE(parser + " on " + text);
  for (size_t piece : {0, 1, 2, 5}) {
    const Split s = split(parser, prompt, text, piece);
    EXPECT_EQ(s.reasoning, reasoning) << "pieces of " << piece;
    EXPECT_EQ(s.content, content) << "pieces of " << piece;
  }
}

TEST(ReasoningParser, TemplateOpenedTheThinkBlock) {
  const std::string prompt = render("qwen3_6", Json::object());
  ASSERT_TRUE(prompt.size() >= 8 && prompt.substr(prompt.size() - 8) == "<think>\n") << prompt;
  for (const std::string parser : {"qwen3", "deepseek_r1"}) {
    expect_split(parser, prompt, "2+2 is basic arithmetic.\n</think>\n\nIt is 4.", "2+2 is basic arithmetic.\n", "It is 4.");
    // The model repeating the opening tag does not leak it.
    expect_split(parser, prompt, "<think>\nHmm.\n</think>\n\n4", "\nHmm.\n", "4");
    // Truncated (max_tokens) while thinking: everything is reasoning, a partial tag too.
    expect_split(parser, prompt, "Let me think</thi", "Let me think</thi", "");
    // Nothing after the block.
    expect_split(parser, prompt, "Short.</think>", "Short.", "");
  }
}

TEST(ReasoningParser, TemplateClosedAnEmptyBlock) {
  const std::string prompt = render("qwen3_6", Json{{"enable_thinking", false}});
  ASSERT_NE(prompt.find("<think>\n\n</think>\n\n"), std::string::npos) << prompt;
  for (const std::string parser : {"qwen3", "deepseek_r1"}) {
    expect_split(parser, prompt, "It is 4.", "", "It is 4.");
    expect_split(parser, prompt, "It is 4; a </think> here is text.", "", "It is 4; a </think> here is text.");
  }
}

TEST(ReasoningParser, TemplateWithoutThinking) {
  const std::string prompt = render("smollm2", Json::object());
  ASSERT_EQ(prompt.find("<think>"), std::string::npos);
  // qwen3: content unless the output opens a block itself.
  expect_split("qwen3", prompt, "It is 4.", "", "It is 4.");
  expect_split("qwen3", prompt, "\n<think>\nadd\n</think>\n\nIt is 4.", "\nadd\n", "It is 4.");
  expect_split("qwen3", prompt, "<thinking> is not the tag", "", "<thinking> is not the tag");
  expect_split("qwen3", prompt, "<thi", "", "<thi");
  // deepseek_r1: the output is reasoning until </think>.
  expect_split("deepseek_r1", prompt, "add them</think>4", "add them", "4");
  expect_split("deepseek_r1", prompt, "no end tag", "no end tag", "");
}

TEST(ReasoningParser, UnknownNameIsAnError) {
  EXPECT_THROW(ReasoningParser("granite", ""), Error);
  EXPECT_EQ(reasoning_parser_names().size(), 2u);
}

}  // namespace
}  // namespace moefold::server
