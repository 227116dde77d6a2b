// What the chat output parsers (reasoning split, tool calls) produce from a piece of generated
// text: reasoning text, answer text and tool-call fragments, in the shape of an OpenAI stream
// delta. Concatenating the deltas of one choice gives its whole message (ChatMessage).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moefold::server {

/// One fragment of a tool call. The first fragment of call `index` carries its id and name (and
/// possibly the start of its arguments); later fragments carry only more argument text.
struct ToolCallDelta {
  int32_t index = 0;      ///< the call's position in the message (0, 1, ...)
  std::string id;         ///< "call_..." in the first fragment, else empty
  std::string name;       ///< the function name in the first fragment, else empty
  std::string arguments;  ///< JSON text of the arguments, to append to what came before
};

/// A piece of one choice's parsed output.
struct OutputDelta {
  std::string reasoning;  ///< reasoning_content to append
  std::string content;    ///< content to append
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  /// Appends `o` after this delta (texts concatenated, fragments of one call merged).
  void append(const OutputDelta& o);
};

/// A complete tool call of a message.
struct ToolCall {
  std::string id, name, arguments;  ///< arguments: a JSON text (an object for well-formed calls)
};

/// One choice's whole message: the concatenation of its deltas.
struct ChatMessage {
  std::string reasoning, content;
  bool has_reasoning = false;  ///< any reasoning was produced (else reasoning_content is null)
  std::vector<ToolCall> tool_calls;

  /// Appends a delta (fragments of call i go to tool_calls[i]).
  void append(const OutputDelta& d);
};

}  // namespace moefold::server
