// qwen3_coder tool calls (contract: qwen3_coder_parser.h).
#include "server/tool_parsers/qwen3_coder_parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>

namespace moefold::server {

using Json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=";
constexpr std::string_view kParameterEnd = "</parameter>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

/// The types a property schema allows, in its order ("type" as a string or a list, or the
/// types of its anyOf / oneOf alternatives).
std::vector<std::string> schema_types(const Json& schema) {
  std::vector<std::string> out;
  if (!schema.is_object()) return out;
  auto add = [&](const Json& t) {
    if (t.is_string()) out.push_back(t.get<std::string>());
    else if (t.is_array())
      for (const Json& x : t)
        if (x.is_string()) out.push_back(x.get<std::string>());
  };
  if (auto it = schema.find("type"); it != schema.end()) add(*it);
  for (const char* k : {"anyOf", "oneOf"})
    if (auto it = schema.find(k); it != schema.end() && it->is_array())
      for (const Json& alt : *it)
        if (alt.is_object() && alt.contains("type")) add(alt["type"]);
  if (out.empty() && schema.contains("enum") && schema["enum"].is_array())
    for (const Json& v : schema["enum"]) out.push_back(v.is_string() ? "string" : v.is_boolean() ? "boolean" : v.is_number() ? "number" : "null");
  return out;
}

/// `text` as JSON of `type`, or null when it is not one.
std::optional<Json> as_type(const std::string& text, const std::string& type) {
  const std::string t = trim(text);
  if (type == "integer") {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec == std::errc() && p == t.data() + t.size() && !t.empty()) return Json(v);
    return std::nullopt;
  }
  if (type == "boolean") {
    const std::string l = lower(t);
    if (l == "true") return Json(true);
    if (l == "false") return Json(false);
    return std::nullopt;
  }
  if (type == "null") {
    if (lower(t) == "null" || lower(t) == "none") return Json(nullptr);
    return std::nullopt;
  }
  Json j = Json::parse(t, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  if (type == "number" && j.is_number()) return j;
  if (type == "object" && j.is_object()) return j;
  if (type == "array" && j.is_array()) return j;
  return std::nullopt;
}

}  // namespace

std::string convert_parameter_value(const std::string& value, const Json& schema) {
  const std::vector<std::string> types = schema_types(schema);
  bool string_ok = types.empty();
  for (const std::string& t : types) {
    if (t == "string") {
      string_ok = true;
      continue;
    }
    if (auto j = as_type(value, t)) return dump(*j);
  }
  if (!string_ok) {
    // The value matches none of the declared types: keep any JSON value the model wrote, else text.
    Json j = Json::parse(trim(value), nullptr, false);
    if (!j.is_discarded()) return dump(j);
  }
  return dump(Json(value));
}

void Qwen3CoderToolParser::begin_call() {
  pos_ = 0;
  named_ = done_ = false;
  params_ = 0;
  function_.clear();
}

void Qwen3CoderToolParser::parameter(const std::string& name, std::string value, OutputDelta& out) {
  if (!value.empty() && is_ws(value.front())) value.erase(0, 1);
  if (!value.empty() && is_ws(value.back())) value.pop_back();
  const Json& params = parameters_of(function_);
  Json schema;
  if (params.is_object())
    if (auto props = params.find("properties"); props != params.end() && props->is_object())
      if (auto p = props->find(name); p != props->end()) schema = *p;
  std::string frag = params_ == 0 ? "{" : ", ";
  frag += dump(Json(name)) + ": " + convert_parameter_value(value, schema);
  ++params_;
  arguments(frag, out);
}

bool Qwen3CoderToolParser::on_inner(std::string_view inner, bool closed, bool final, OutputDelta& out) {
  if (!named_) {
    const size_t f = inner.find(kFunction);
    if (f == std::string_view::npos) return false;
    const size_t gt = inner.find('>', f + kFunction.size());
    if (gt == std::string_view::npos) return false;
    function_ = trim(inner.substr(f + kFunction.size(), gt - f - kFunction.size()));
    named_ = true;
    pos_ = gt + 1;
    start_call(function_, out);
  }
  while (!done_) {
    while (pos_ < inner.size() && is_ws(inner[pos_])) ++pos_;
    const std::string_view rest = inner.substr(pos_);
    if (rest.substr(0, kParameter.size()) == kParameter) {
      const size_t gt = rest.find('>', kParameter.size());
      if (gt == std::string_view::npos) break;
      const std::string name = trim(rest.substr(kParameter.size(), gt - kParameter.size()));
      const size_t vstart = gt + 1;
      size_t vend = rest.find(kParameterEnd, vstart), next = 0;
      if (vend != std::string_view::npos) {
        next = vend + kParameterEnd.size();
      } else if (closed) {  // a parameter left open ends at the next parameter or the function's end
        vend = std::min({rest.find(kParameter, vstart), rest.find(kFunctionEnd, vstart), rest.size()});
        next = vend;
      } else {
        break;
      }
      parameter(name, std::string(rest.substr(vstart, vend - vstart)), out);
      pos_ += next;
      continue;
    }
    if (rest.substr(0, kFunctionEnd.size()) == kFunctionEnd) {
      pos_ += kFunctionEnd.size();
      arguments(params_ == 0 ? "{}" : "}", out);
      done_ = true;
      break;
    }
    // Anything else: wait for more text if it may still become a tag, else skip to the next tag.
    if (rest.empty() || kParameter.substr(0, rest.size()) == rest || kFunctionEnd.substr(0, rest.size()) == rest) break;
    const size_t lt = rest.find('<', 1);
    if (lt == std::string_view::npos) {
      if (!closed) break;
      pos_ = inner.size();
      break;
    }
    pos_ += lt;
  }
  if (closed && !done_) {  // </tool_call> without </function>: the call ends here
    arguments(params_ == 0 ? "{}" : "}", out);
    done_ = true;
  }
  (void)final;
  return true;
}

}  // namespace moefold::server
