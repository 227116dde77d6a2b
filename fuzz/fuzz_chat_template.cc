// libFuzzer target: the Jinja chat-template renderer with the template taken from the input (a
// checkpoint's tokenizer_config.json is untrusted) and fixed request data: a conversation with a system
// prompt, a user turn with content parts, an assistant turn with a tool call and reasoning, a tool
// result, and one tool spec. Rendering runs under the default budgets (text/jinja_limits.h), so a
// template that loops or allocates without bound must fail with TemplateLimitError, not hang.
#include "fuzz_util.h"
#include "text/chat_template.h"

namespace {
const moefold::ChatTemplate::Json& messages() {
  static const auto m = moefold::ChatTemplate::Json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
    {"role": "assistant", "content": "", "reasoning_content": "add",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "4"},
    {"role": "user", "content": "Thanks"}])");
  return m;
}
const moefold::ChatTemplate::Json& tools() {
  static const auto t = moefold::ChatTemplate::Json::parse(R"([{"type": "function", "function": {"name": "add",
    "description": "Adds", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])");
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moefold::fuzz::expect_ok_or_error([&] {
    auto t = moefold::ChatTemplate::from_string(moefold::fuzz::as_string(data, size),
                                                {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    t.render(messages(), tools(), /*add_generation_prompt=*/true, {{"enable_thinking", false}});
  });
  return 0;
}
