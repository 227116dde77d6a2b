// Tool-call parsers: turn a model's generated text into content plus OpenAI tool calls, one text
// piece at a time (streaming) or all at once. Both formats wrap every call in
// <tool_call>...</tool_call>; what is inside differs:
//   qwen3_coder (Qwen3.5/3.6, Qwen3-Coder):
//       <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
//     VALUE is raw text, converted to the JSON type the tool's parameter schema declares.
//   hermes (Qwen3, Hermes and other chat models):
//       <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
// Text outside the blocks is content. Whitespace right before a call, between calls and after
// the last one is dropped; without calls the content is the text unchanged. Tags split across
// pieces are held back until they are complete, so the deltas of a text fed one character at a
// time concatenate to the same message as the text fed at once. A call still open at the end of
// the text (a truncated output) keeps the arguments produced so far; a block that never got a
// function name is returned as content.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_parsers/output_delta.h"

namespace moefold::server {

/// A function the request offered (`tools[i].function`).
struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  ///< its JSON schema (an object), or null
};

/// Makes the ids of tool calls ("call_" + 24 random alphanumerics by default).
using ToolCallIdFn = std::function<std::string()>;
/// The default id maker: "call_" + 24 random characters [a-zA-Z0-9].
std::string random_tool_call_id();

class ToolParser {
 public:
  virtual ~ToolParser() = default;

  /// Parses the next piece of generated text, appending content and tool-call fragments to `out`.
  void feed(std::string_view text, OutputDelta& out);
  /// End of the output: releases everything held back.
  void finish(OutputDelta& out);
  /// Tool calls started so far.
  int32_t num_calls() const { return calls_; }

 protected:
  ToolParser(std::vector<ToolSpec> tools, ToolCallIdFn make_id);

  /// A new block starts (after <tool_call>); `inner` of on_inner() restarts empty.
  virtual void begin_call() = 0;
  /// The block's text after <tool_call> so far (it grows; it may end in a partial closing
  /// tag). `closed`: </tool_call> came (`inner` is complete); `final`: the output ended inside.
  /// Emits fragments through start_call() / arguments(). Returns false when the block never
  /// named a function (then, once closed or final, the raw block becomes content).
  virtual bool on_inner(std::string_view inner, bool closed, bool final, OutputDelta& out) = 0;

  /// Emits the first fragment of a new call; returns its index.
  int32_t start_call(const std::string& name, OutputDelta& out);
  /// Emits more argument text of the current call.
  void arguments(const std::string& text, OutputDelta& out);
  /// The parameter schema of tool `name` (null when unknown).
  const nlohmann::ordered_json& parameters_of(const std::string& name) const;

 private:
  void emit_content(std::string text, OutputDelta& out);
  void close_block(bool final, OutputDelta& out);

  std::vector<ToolSpec> tools_;
  ToolCallIdFn make_id_;
  std::string buf_;         ///< unparsed text outside a block, or the current block's inner text
  bool in_block_ = false;
  std::string pending_ws_;  ///< trailing whitespace of the content, held back
  bool after_call_ = false; ///< a call ended and no content came since: leading whitespace dropped
  int32_t calls_ = 0;
};

/// Names accepted by --tool-call-parser.
const std::vector<std::string>& tool_parser_names();
/// A parser by name ("qwen3_coder" or "hermes"). Throws moefold::Error for another name.
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name, std::vector<ToolSpec> tools,
                                             ToolCallIdFn make_id = random_tool_call_id);
/// The tool-call format a chat template asks the model for: "qwen3_coder" when it shows
/// <function=...> / <parameter=...> blocks, "hermes" when it shows <tool_call> with JSON, ""
/// when it mentions no tool calls.
std::string tool_parser_for_template(const std::string& template_source);

}  // namespace moefold::server
