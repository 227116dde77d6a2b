// Tests of ChatTemplate (text/chat_template.h) against real model templates: every case in
// tests/fixtures/chat_templates/{smollm2,qwen3_6,qwen3,llama3_2}/cases.json must render byte-identical to
// transformers' apply_chat_template (expected strings made by scripts/make_chat_fixtures.py), and
// cases on which transformers fails must fail here too.
#include "text/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "fixture_util.h"

namespace moefold {
namespace {

using Json = ChatTemplate::Json;

std::string fixture_dir(const std::string& name) {
  return (moefold::test::kFixtures / "chat_templates" / name).string();
}

Json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

/// Renders every fixture case of `model` and compares with transformers' output.
void check_fixture_cases(const std::string& model, size_t min_cases) {
  ChatTemplate tpl = ChatTemplate::from_model_dir(fixture_dir(model));
  Json fixture = load_json(fixture_dir(model) + "/cases.json");
  EXPECT_EQ(tpl.special_tokens(), fixture["special_tokens"]);
  const Json& cases = fixture["cases"];
  ASSERT_GE(cases.size(), min_cases);
  for (const auto& c : cases) {
    SCOPED_TRACE(model + "/" + c["name"].get<std::string>());
    Json tools = c.contains("tools") ? c["tools"] : Json();
    Json kwargs = c.contains("kwargs") ? c["kwargs"] : Json::object();
    bool agp = c.value("add_generation_prompt", false);
    if (c.contains("error")) {
      EXPECT_THROW(tpl.render(c["messages"], tools, agp, kwargs), Error) << "transformers: " << c["error"];
      continue;
    }
    try {
      EXPECT_EQ(tpl.render(c["messages"], tools, agp, kwargs), c["expected"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

TEST(ChatTemplate, SmolLM2MatchesTransformers) { check_fixture_cases("smollm2", 8); }

TEST(ChatTemplate, Qwen36MatchesTransformers) { check_fixture_cases("qwen3_6", 20); }

TEST(ChatTemplate, Qwen3MatchesTransformers) { check_fixture_cases("qwen3", 8); }

TEST(ChatTemplate, Llama32MatchesTransformers) { check_fixture_cases("llama3_2", 6); }

TEST(ChatTemplate, Llama32UsesStrftimeNowWithoutDateString) {
  ChatTemplate tpl = ChatTemplate::from_model_dir(fixture_dir("llama3_2"));
  std::string out = tpl.render(Json::parse(R"([{"role": "user", "content": "x"}])"), nullptr, true);
  size_t p = out.find("Today Date: ");
  ASSERT_NE(p, std::string::npos) << out;
  std::string date = out.substr(p + 12, out.find('\n', p) - p - 12);  // e.g. "05 Mar 2026"
  EXPECT_EQ(date.size(), 11u) << date;
  EXPECT_NE(date, "26 Jul 2024");
}

TEST(ChatTemplate, Qwen36ThinkingPrompts) {
  ChatTemplate tpl = ChatTemplate::from_model_dir(fixture_dir("qwen3_6"));
  Json msgs = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(tpl.render(msgs, nullptr, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(tpl.render(msgs, nullptr, true, Json{{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, RaiseExceptionBecomesErrorNamingTheLine) {
  ChatTemplate tpl = ChatTemplate::from_model_dir(fixture_dir("qwen3_6"));
  try {
    tpl.render(Json::parse(R"([{"role": "assistant", "content": "x"}])"), nullptr, true);
    FAIL() << "expected moefold::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("No user query found in messages."), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 79"), std::string::npos) << msg;
  }
}

TEST(ChatTemplate, SyntaxErrorNamesTheLine) {
  try {
    ChatTemplate::from_string("ok\n{% for m in messages %}\n{{ m.content }\n{% endfor %}");
    FAIL() << "expected moefold::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, SpecialTokensAndKwargs) {
  ChatTemplate tpl = ChatTemplate::from_string("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ extra }}",
                                               Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  Json msgs = Json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(tpl.render(msgs, nullptr, false), "<s>x</s>");
  EXPECT_EQ(tpl.render(msgs, nullptr, false, Json{{"extra", 1}, {"eos_token", "E"}}), "<s>xE1");
}

TEST(ChatTemplate, AcceptsUnorderedJsonWithSortedKeys) {
  ChatTemplate tpl = ChatTemplate::from_string("{{ messages[0]|tojson }}{{ x }}");
  nlohmann::json msgs = nlohmann::json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(tpl.render(msgs, nlohmann::json(), false, nlohmann::json{{"x", 1}}), R"({"content": "x", "role": "user"}1)");
  EXPECT_EQ(tpl.render(Json::parse(R"([{"role": "user", "content": "x"}])"), nullptr, false),
            R"({"role": "user", "content": "x"})");
}

TEST(ChatTemplate, ToolsNullIsDefinedNone) {
  ChatTemplate tpl = ChatTemplate::from_string("{{ tools is defined }}|{{ tools is none }}|{{ tools|length if tools }}");
  Json msgs = Json::array();
  EXPECT_EQ(tpl.render(msgs, nullptr, false), "True|True|");
  EXPECT_EQ(tpl.render(msgs, Json::parse(R"([{"type": "function"}])"), false), "True|False|1");
}

TEST(ChatTemplate, LoadsTemplateListAndAddedTokenObjects) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("moefold_chat_template_list_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "tokenizer_config.json");
    out << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
               "chat_template": [{"name": "default", "template": "D{{ bos_token }}"},
                                 {"name": "tool_use", "template": "T{{ tools|length }}"}]})";
  }
  ChatTemplate tpl = ChatTemplate::from_model_dir(dir.string());
  EXPECT_EQ(tpl.render(Json::array(), nullptr, false), "D<s>");
  EXPECT_EQ(tpl.render(Json::array(), Json::parse(R"([{}, {}])"), false), "T2");
  EXPECT_EQ(tpl.render_named("default", Json::array(), Json::array(), false), "D<s>");

  // A chat_template.jinja file takes priority over tokenizer_config.json.
  {
    std::ofstream out(dir / "chat_template.jinja");
    out << "F{{ eos_token }}\n";
  }
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.string()).render(Json::array(), nullptr, false), "F</s>");
  fs::remove_all(dir);
}

TEST(ChatTemplate, MissingTemplateIsAnError) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("moefold_chat_template_missing_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_THROW(ChatTemplate::from_model_dir(dir.string()), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moefold
