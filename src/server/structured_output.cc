// Structured-output request fields (contract: structured_output.h).
#include "server/structured_output.h"

#include <string>
#include <vector>

#include "server/api_error.h"

namespace moefold::server {

using Json = nlohmann::ordered_json;

namespace {

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string need_string(const Json& v, const std::string& name) {
  if (!v.is_string()) bad_request(name, "'{}' must be a string.", name);
  return v.get<std::string>();
}

/// A JSON schema given as an object (or a boolean schema) or as a string holding one.
std::string schema_text(const Json& v, const std::string& name) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    Json parsed;
    try {
      parsed = Json::parse(s);
    } catch (const std::exception& e) {
      bad_request(name, "'{}' is not valid JSON: {}", name, clip(e.what(), 2 * kMaxEchoedChars));
    }
    if (!parsed.is_object() && !parsed.is_boolean()) bad_request(name, "'{}' must be a JSON schema object.", name);
    return parsed.dump();
  }
  bad_request(name, "'{}' must be a JSON schema object.", name);
}

std::vector<std::string> choice_list(const Json& v, const std::string& name) {
  if (!v.is_array() || v.empty()) bad_request(name, "'{}' must be a non-empty list of strings.", name);
  std::vector<std::string> out;
  for (const Json& c : v) {
    if (!c.is_string()) bad_request(name, "'{}' must be a non-empty list of strings.", name);
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::optional<ConstraintSpec> from_response_format(const Json& rf) {
  if (!rf.is_object()) bad_request("response_format", "'response_format' must be an object.");
  const Json* type = field(rf, "type");
  if (!type || !type->is_string())
    bad_request("response_format.type", "'response_format.type' must be one of 'text', 'json_object', "
                                        "'json_schema', 'structural_tag'.");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") return ConstraintSpec::json_object();
  if (t == "json_schema") {
    const Json* js = field(rf, "json_schema");
    if (!js || !js->is_object())
      bad_request("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'.");
    const Json* schema = field(*js, "schema");
    if (!schema) bad_request("response_format.json_schema.schema", "'response_format.json_schema.schema' is required.");
    return ConstraintSpec::json_schema(schema_text(*schema, "response_format.json_schema.schema"));
  }
  if (t == "structural_tag") return ConstraintSpec::structural_tag(rf.dump());
  bad_request("response_format.type",
              "'response_format.type' must be one of 'text', 'json_object', 'json_schema', 'structural_tag', got '{}'.",
              clip(t));
}

}  // namespace

std::optional<ConstraintSpec> parse_structured_output(const Json& body, std::string& param) {
  std::optional<ConstraintSpec> out;
  auto set = [&](std::optional<ConstraintSpec> spec, const std::string& name) {
    if (!spec) return;
    if (out)
      bad_request(name, "Only one structured-output constraint is allowed per request: '{}' and '{}' were both given.",
                  param, name);
    out = std::move(spec);
    param = name;
  };
  if (const Json* rf = field(body, "response_format")) set(from_response_format(*rf), "response_format");
  if (const Json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) bad_request("structured_outputs", "'structured_outputs' must be an object.");
    if (const Json* v = field(*so, "json")) set(ConstraintSpec::json_schema(schema_text(*v, "structured_outputs.json")), "structured_outputs.json");
    if (const Json* v = field(*so, "regex"))
      set(ConstraintSpec::regex(need_string(*v, "structured_outputs.regex")), "structured_outputs.regex");
    if (const Json* v = field(*so, "choice"))
      set(ConstraintSpec::choice(choice_list(*v, "structured_outputs.choice")), "structured_outputs.choice");
    if (const Json* v = field(*so, "grammar"))
      set(ConstraintSpec::grammar(need_string(*v, "structured_outputs.grammar")), "structured_outputs.grammar");
    if (const Json* v = field(*so, "structural_tag"))
      set(ConstraintSpec::structural_tag(v->is_string() ? v->get<std::string>() : v->dump()),
          "structured_outputs.structural_tag");
    if (const Json* v = field(*so, "json_object")) {
      if (!v->is_boolean()) bad_request("structured_outputs.json_object", "'structured_outputs.json_object' must be a boolean.");
      if (v->get<bool>()) set(ConstraintSpec::json_object(), "structured_outputs.json_object");
    }
  }
  if (const Json* v = field(body, "guided_json")) set(ConstraintSpec::json_schema(schema_text(*v, "guided_json")), "guided_json");
  if (const Json* v = field(body, "guided_regex")) set(ConstraintSpec::regex(need_string(*v, "guided_regex")), "guided_regex");
  if (const Json* v = field(body, "guided_choice")) set(ConstraintSpec::choice(choice_list(*v, "guided_choice")), "guided_choice");
  if (const Json* v = field(body, "guided_grammar"))
    set(ConstraintSpec::grammar(need_string(*v, "guided_grammar")), "guided_grammar");
  if (const Json* v = field(body, "guided_decoding_backend")) need_string(*v, "guided_decoding_backend");
  return out;
}

}  // namespace moefold::server
