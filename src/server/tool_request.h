// The tool fields of a chat request: `tools`, `tool_choice` and `parallel_tool_calls`, checked
// against what the server was started with (--tool-call-parser, --enable-auto-tool-choice), as
// vLLM does:
//  - tool_choice "none": tools are still shown to the template; the output is not parsed;
//  - "auto" (the default when tools are given): needs --enable-auto-tool-choice and a parser;
//  - "required" / {"type": "function", "function": {"name": ...}}: the output is constrained to
//    tool calls in the parser's format (hermes when the server has no parser).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/tool_parsers/tool_parser.h"

namespace moefold::server {

/// What the server offers for tool calls.
struct ToolServing {
  std::string tool_parser;               ///< resolved --tool-call-parser ("" = none)
  bool enable_auto_tool_choice = false;  ///< --enable-auto-tool-choice
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  std::vector<ToolSpec> tools;
  ToolChoice choice = ToolChoice::kNone;
  std::string named;                 ///< kNamed: the function
  std::string parser;                ///< format the output is parsed in ("" when choice is kNone)
  bool parallel_tool_calls = true;   ///< false: at most one call (required / named)

  /// True when the output must be tool calls (required / named).
  bool forced() const { return choice == ToolChoice::kRequired || choice == ToolChoice::kNamed; }
};

/// Parses and checks `tools`, `tool_choice` and `parallel_tool_calls` of a chat body. Throws
/// ApiError 400 naming the field (malformed tools, an unknown tool_choice, a named function that
/// is not among the tools, "required" / named without tools, "auto" without
/// --enable-auto-tool-choice and a parser).
ToolRequest parse_tool_request(const nlohmann::ordered_json& body, const ToolServing& serving);

/// `messages` made ready for a chat template the way vLLM does: the `function.arguments` JSON
/// strings of assistant `tool_calls` become objects (templates iterate over them), and a null or
/// missing `content` becomes "" (templates concatenate it).
void prepare_tool_messages(nlohmann::ordered_json& messages);

}  // namespace moefold::server
