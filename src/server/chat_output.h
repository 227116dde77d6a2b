// One choice's chat output pipeline: the reasoning split (when --reasoning-parser is set), then
// tool-call parsing of the content (when the request's tool_choice is not "none"). Fed the
// choice's text as the engine releases it; the deltas concatenate to the non-streamed message.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/request_parser.h"
#include "server/tool_parsers/output_delta.h"
#include "server/tool_parsers/tool_parser.h"

namespace moefold::server {

struct ChatOutputOptions {
  std::string reasoning_parser;  ///< "" = none (thinking stays in content)
  std::string prompt;            ///< the rendered prompt (decides where the output starts)
  std::string tool_parser;       ///< "" = none (tool calls stay in content)
  std::vector<ToolSpec> tools;
  ToolCallIdFn make_id;          ///< null: random_tool_call_id
};

/// The pipeline a chat request asks for (its tools, the server's reasoning parser, its prompt).
ChatOutputOptions chat_output_options(const ParsedRequest& req);

class ChatOutputParser {
 public:
  /// Throws moefold::Error for an unknown parser name.
  explicit ChatOutputParser(const ChatOutputOptions& o);

  /// The split of the next piece of text.
  OutputDelta feed(std::string_view text);
  /// The rest, at the end of the output.
  OutputDelta finish();
  /// The whole message of `text` (feed + finish).
  ChatMessage parse(std::string_view text);

  bool has_reasoning_parser() const { return reasoning_.has_value(); }
  int32_t num_tool_calls() const { return tools_ ? tools_->num_calls() : 0; }

 private:
  void route(OutputDelta& d, bool final);

  std::optional<ReasoningParser> reasoning_;
  std::unique_ptr<ToolParser> tools_;
};

}  // namespace moefold::server
