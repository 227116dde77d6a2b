// tools / tool_choice parsing (contract: tool_request.h).
#include "server/tool_request.h"

#include "server/api_error.h"

namespace moefold::server {

using Json = nlohmann::ordered_json;

namespace {

std::vector<ToolSpec> parse_tools(const Json& body) {
  std::vector<ToolSpec> out;
  auto t = body.find("tools");
  if (t == body.end() || t->is_null()) return out;
  if (!t->is_array()) bad_request("tools", "'tools' must be an array.");
  for (size_t i = 0; i < t->size(); ++i) {
    const Json& tool = (*t)[i];
    const std::string where = fmt::format("tools[{}]", i);
    if (!tool.is_object()) bad_request(where, "'{}' must be an object.", where);
    if (tool.contains("type") && tool["type"] != "function")
      bad_request(where + ".type", "'{}.type' must be \"function\".", where);
    auto f = tool.find("function");
    if (f == tool.end() || !f->is_object()) bad_request(where + ".function", "'{}.function' must be an object.", where);
    auto n = f->find("name");
    if (n == f->end() || !n->is_string() || n->get<std::string>().empty())
      bad_request(where + ".function.name", "'{}.function.name' must be a non-empty string.", where);
    ToolSpec spec{n->get<std::string>(), nullptr};
    if (auto p = f->find("parameters"); p != f->end() && !p->is_null()) {
      if (!p->is_object()) bad_request(where + ".function.parameters", "'{}.function.parameters' must be an object.", where);
      spec.parameters = *p;
    }
    for (const ToolSpec& s : out)
      if (s.name == spec.name) bad_request(where + ".function.name", "Two tools are named '{}'.", clip(spec.name));
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace

ToolRequest parse_tool_request(const Json& body, const ToolServing& serving) {
  ToolRequest r;
  r.tools = parse_tools(body);
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) bad_request("parallel_tool_calls", "'parallel_tool_calls' must be a boolean.");
    r.parallel_tool_calls = p->get<bool>();
  }
  auto c = body.find("tool_choice");
  if (c == body.end() || c->is_null()) {
    r.choice = r.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  } else if (c->is_string()) {
    const std::string s = c->get<std::string>();
    if (s == "none") r.choice = ToolChoice::kNone;
    else if (s == "auto") r.choice = ToolChoice::kAuto;
    else if (s == "required") r.choice = ToolChoice::kRequired;
    else bad_request("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got '{}'.", clip(s));
  } else if (c->is_object()) {
    auto f = c->find("function");
    if ((c->contains("type") && (*c)["type"] != "function") || f == c->end() || !f->is_object() ||
        !f->contains("name") || !(*f)["name"].is_string())
      bad_request("tool_choice", "A named 'tool_choice' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}.");
    r.choice = ToolChoice::kNamed;
    r.named = (*f)["name"].get<std::string>();
  } else {
    bad_request("tool_choice", "'tool_choice' must be a string or an object.");
  }
  if (r.forced() && r.tools.empty())
    bad_request("tool_choice", "'tool_choice' \"required\" or a named function needs 'tools'.");
  if (r.choice == ToolChoice::kNamed) {
    bool found = false;
    for (const ToolSpec& t : r.tools) found |= t.name == r.named;
    if (!found) bad_request("tool_choice", "The tool_choice function '{}' is not among the tools.", clip(r.named));
  }
  if (r.choice == ToolChoice::kAuto && !r.tools.empty() &&
      (!serving.enable_auto_tool_choice || serving.tool_parser.empty()))
    bad_request("tool_choice",
                "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set "
                "(the server was started without them); use \"none\", \"required\" or a named function.");
  if (r.choice == ToolChoice::kAuto && r.tools.empty()) r.choice = ToolChoice::kNone;
  if (r.choice != ToolChoice::kNone) r.parser = serving.tool_parser.empty() ? "hermes" : serving.tool_parser;
  return r;
}

void prepare_tool_messages(Json& messages) {
  for (Json& m : messages) {
    if (!m.is_object()) continue;
    if (auto c = m.find("content"); c == m.end() || c->is_null()) m["content"] = "";
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (Json& call : *calls) {
      if (!call.is_object()) continue;
      auto f = call.find("function");
      if (f == call.end() || !f->is_object()) continue;
      auto a = f->find("arguments");
      if (a == f->end() || !a->is_string()) continue;
      Json parsed = Json::parse(a->get<std::string>(), nullptr, false);
      if (parsed.is_object()) *a = std::move(parsed);
    }
  }
}

}  // namespace moefold::server
