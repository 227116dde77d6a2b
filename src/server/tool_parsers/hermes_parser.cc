// hermes tool calls (contract: hermes_parser.h).
#include "server/tool_parsers/hermes_parser.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace moefold::server {

using Json = nlohmann::ordered_json;

namespace {

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/// Outcome of reading one token of the header.
enum class Step { kOk, kMore, kOther };

void skip_ws(std::string_view s, size_t& i) {
  while (i < s.size() && is_ws(s[i])) ++i;
}

Step expect(std::string_view s, size_t& i, char c) {
  skip_ws(s, i);
  if (i >= s.size()) return Step::kMore;
  if (s[i] != c) return Step::kOther;
  ++i;
  return Step::kOk;
}

/// A complete JSON string at s[i] (after whitespace), decoded into `out`.
Step read_string(std::string_view s, size_t& i, std::string& out) {
  skip_ws(s, i);
  if (i >= s.size()) return Step::kMore;
  if (s[i] != '"') return Step::kOther;
  bool esc = false;
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (esc) {
      esc = false;
    } else if (s[j] == '\\') {
      esc = true;
    } else if (s[j] == '"') {
      const Json v = Json::parse(s.substr(i, j + 1 - i), nullptr, false);
      if (!v.is_string()) return Step::kOther;
      out = v.get<std::string>();
      i = j + 1;
      return Step::kOk;
    }
  }
  return Step::kMore;
}

}  // namespace

void HermesToolParser::begin_call() {
  mode_ = Mode::kHeader;
  named_ = false;
  pos_ = 0;
  depth_ = 0;
  started_ = in_string_ = escape_ = false;
}

bool HermesToolParser::read_header(std::string_view s, bool closed, OutputDelta& out) {
  size_t i = 0;
  std::string key, name;
  Step st = expect(s, i, '{');
  if (st == Step::kOk) st = read_string(s, i, key);
  if (st == Step::kOk && key != "name") st = Step::kOther;
  if (st == Step::kOk) st = expect(s, i, ':');
  if (st == Step::kOk) st = read_string(s, i, name);
  if (st == Step::kOk) st = expect(s, i, ',');
  if (st == Step::kOk) st = read_string(s, i, key);
  if (st == Step::kOk && key != "arguments" && key != "parameters") st = Step::kOther;
  if (st == Step::kOk) st = expect(s, i, ':');
  if (st == Step::kOk) {
    start_call(name, out);
    named_ = true;
    mode_ = Mode::kArguments;
    pos_ = i;
    return true;
  }
  if (st == Step::kOther || closed) mode_ = Mode::kWhole;
  return false;
}

void HermesToolParser::stream_arguments(std::string_view s, OutputDelta& out) {
  std::string frag;
  size_t i = pos_;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (!started_) {
      if (is_ws(c)) continue;  // whitespace before the value is not part of it
      if (c != '{') {  // arguments that are not an object: parse the whole block at its end
        mode_ = Mode::kWhole;
        pos_ = i;
        arguments(frag, out);
        return;
      }
      started_ = true;
    }
    if (in_string_) {
      if (escape_) escape_ = false;
      else if (c == '\\') escape_ = true;
      else if (c == '"') in_string_ = false;
      else if (static_cast<unsigned char>(c) < 0x20) {
        // A raw control character inside a string is not JSON: write it escaped.
        frag += fmt::format("\\u{:04x}", int(c));
        continue;
      }
      frag += c;
      continue;
    }
    frag += c;
    if (c == '"') in_string_ = true;
    else if (c == '{' || c == '[') ++depth_;
    else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        ++i;
        mode_ = Mode::kDone;
        break;
      }
    }
  }
  arguments(frag, out);
  pos_ = i;
}

void HermesToolParser::parse_whole(std::string_view s, OutputDelta& out) {
  const Json j = Json::parse(s, nullptr, false);
  if (!j.is_object()) return;
  if (!named_) {
    auto n = j.find("name");
    if (n == j.end() || !n->is_string()) return;
    start_call(n->get<std::string>(), out);
    named_ = true;
  }
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  if (a == j.end() || a->is_null()) arguments("{}", out);
  else if (a->is_string()) arguments(a->get<std::string>(), out);
  else arguments(a->dump(-1, ' ', false, Json::error_handler_t::replace), out);
  mode_ = Mode::kDone;
}

bool HermesToolParser::on_inner(std::string_view inner, bool closed, bool final, OutputDelta& out) {
  if (mode_ == Mode::kHeader) read_header(inner, closed, out);
  if (mode_ == Mode::kArguments) stream_arguments(inner, out);
  if (mode_ == Mode::kWhole && closed) parse_whole(inner, out);
  (void)final;
  return named_;
}

}  // namespace moefold::server
