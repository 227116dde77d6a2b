// Structural tags for forced tool calls (contract: tool_constraint.h).
#include "server/tool_constraint.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moefold::server {

using Json = nlohmann::ordered_json;

namespace {

/// Whitespace runs between JSON tokens and around XML parameter values: enough for ": ", ", " and
/// the newline around a value (which the qwen3_coder parser drops), and a bound, so that a model
/// that keeps sampling whitespace still has to finish the call.
constexpr int kMaxJsonWhitespace = 1;
constexpr int kMaxXmlWhitespace = 1;

Json schema_of(const ToolSpec& t) {
  if (t.parameters.is_object()) return t.parameters;
  return Json{{"type", "object"}};
}

Json tag_for(const ToolSpec& t, const std::string& parser) {
  const std::string name = t.name;
  if (parser == "qwen3_coder")
    return Json{{"type", "tag"},
                {"begin", "<tool_call>\n<function=" + name + ">\n"},
                {"content", {{"type", "qwen_xml_parameter"}, {"json_schema", schema_of(t)}, {"max_whitespace_cnt", kMaxXmlWhitespace}}},
                {"end", "</function>\n</tool_call>"}};
  if (parser == "hermes")
    return Json{{"type", "tag"},
                {"begin", "<tool_call>\n{\"name\": " + Json(name).dump() + ", \"arguments\": "},
                {"content", {{"type", "json_schema"}, {"json_schema", schema_of(t)}, {"max_whitespace_cnt", kMaxJsonWhitespace}}},
                {"end", "}\n</tool_call>"}};
  fail("no tool-call grammar for the '{}' format", parser);
}

}  // namespace

std::string tool_call_structural_tag(const ToolRequest& req, const std::string& prefix) {
  MOEFOLD_CHECK(req.forced(), "tool_call_structural_tag: tool_choice is neither \"required\" nor named");
  Json format;
  if (req.choice == ToolChoice::kNamed) {
    for (const ToolSpec& t : req.tools)
      if (t.name == req.named) format = tag_for(t, req.parser);
    MOEFOLD_CHECK(!format.is_null(), "tool_call_structural_tag: '{}' is not among the tools", req.named);
  } else {
    Json tags = Json::array();
    for (const ToolSpec& t : req.tools) tags.push_back(tag_for(t, req.parser));
    format = Json{{"type", "tags_with_separator"},
                  {"tags", std::move(tags)},
                  {"separator", "\n"},
                  {"at_least_one", true},
                  {"stop_after_first", !req.parallel_tool_calls}};
  }
  if (!prefix.empty())
    format = Json{{"type", "sequence"},
                  {"elements", Json::array({Json{{"type", "const_string"}, {"value", prefix}}, std::move(format)})}};
  return Json{{"type", "structural_tag"}, {"format", std::move(format)}}.dump();
}

ConstraintSpec tool_call_constraint(const ToolRequest& req, const std::string& prefix) {
  return ConstraintSpec::structural_tag(tool_call_structural_tag(req, prefix));
}

}  // namespace moefold::server
