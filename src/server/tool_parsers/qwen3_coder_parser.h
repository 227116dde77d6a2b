// The qwen3_coder tool-call format (Qwen3.5/3.6, Qwen3-Coder), vLLM's `qwen3_coder` parser:
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// The name is sent as soon as <function=NAME> is complete, then one argument fragment per
// finished parameter ('{"P": VALUE', ', "Q": VALUE', ... and '}' at </function>). One whitespace
// character (the model's newline; a space or tab under the tool-call grammar) right after
// <parameter=P> and one right before </parameter> belong to the markup.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "server/tool_parsers/tool_parser.h"

namespace moefold::server {

/// The JSON text of a raw parameter value, typed by its JSON schema `schema` (the property's
/// schema; null when unknown): integer, number, boolean, null, object and array values that
/// parse as that type are written as such; anything else (and every "string") is a JSON string.
std::string convert_parameter_value(const std::string& value, const nlohmann::ordered_json& schema);

class Qwen3CoderToolParser : public ToolParser {
 public:
  Qwen3CoderToolParser(std::vector<ToolSpec> tools, ToolCallIdFn make_id) : ToolParser(std::move(tools), std::move(make_id)) {}

 protected:
  void begin_call() override;
  bool on_inner(std::string_view inner, bool closed, bool final, OutputDelta& out) override;

 private:
  void parameter(const std::string& name, std::string value, OutputDelta& out);

  size_t pos_ = 0;        ///< parsed up to here in the block
  bool named_ = false;    ///< <function=NAME> seen
  bool done_ = false;     ///< the arguments object is closed
  int32_t params_ = 0;    ///< parameters emitted
  std::string function_;
};

}  // namespace moefold::server
