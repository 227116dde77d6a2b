// The hermes tool-call format (Qwen3, Hermes and other chat models), vLLM's `hermes` parser:
//   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
// When the object starts with "name" and then "arguments" (or "parameters"), the name is sent as
// soon as it is complete and the arguments' JSON text is streamed as it arrives, byte for byte.
// Other layouts (keys in another order, arguments given as a JSON string) are parsed once the
// block is closed.
#pragma once
#include <string>

#include "server/tool_parsers/tool_parser.h"

namespace moefold::server {

class HermesToolParser : public ToolParser {
 public:
  HermesToolParser(std::vector<ToolSpec> tools, ToolCallIdFn make_id) : ToolParser(std::move(tools), std::move(make_id)) {}

 protected:
  void begin_call() override;
  bool on_inner(std::string_view inner, bool closed, bool final, OutputDelta& out) override;

 private:
  enum class Mode { kHeader, kArguments, kWhole, kDone };
  /// kHeader: tries to read '{"name": "...", "arguments":'. Returns false while more text is needed.
  bool read_header(std::string_view inner, bool closed, OutputDelta& out);
  void stream_arguments(std::string_view inner, OutputDelta& out);
  void parse_whole(std::string_view inner, OutputDelta& out);

  Mode mode_ = Mode::kHeader;
  bool named_ = false;
  size_t pos_ = 0;      ///< kArguments: next byte of the block to scan
  int depth_ = 0;       ///< bracket depth of the arguments value
  bool started_ = false, in_string_ = false, escape_ = false;
};

}  // namespace moefold::server
