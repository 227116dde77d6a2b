// The <tool_call> block scanner shared by the tool-call formats (contract: tool_parser.h).
#include "server/tool_parsers/tool_parser.h"

#include <random>
#include <utility>

#include "core/error.h"
#include "server/tool_parsers/hermes_parser.h"
#include "server/tool_parsers/qwen3_coder_parser.h"

namespace moefold::server {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/// Length of the longest proper prefix of `tag` that `s` ends with.
size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

}  // namespace

std::string random_tool_call_id() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

ToolParser::ToolParser(std::vector<ToolSpec> tools, ToolCallIdFn make_id)
    : tools_(std::move(tools)), make_id_(make_id ? std::move(make_id) : ToolCallIdFn(random_tool_call_id)) {}

void ToolParser::emit_content(std::string text, OutputDelta& out) {
  if (text.empty()) return;
  if (after_call_) {
    size_t i = 0;
    while (i < text.size() && is_ws(text[i])) ++i;
    if (i == text.size()) return;
    text.erase(0, i);
    after_call_ = false;
  }
  std::string s = std::move(pending_ws_);
  s += text;
  size_t end = s.size();
  while (end > 0 && is_ws(s[end - 1])) --end;
  pending_ws_ = s.substr(end);
  out.content.append(s, 0, end);
}

void ToolParser::close_block(bool final, OutputDelta& out) {
  const size_t close = buf_.find(kClose);
  const bool closed = close != std::string::npos;
  const std::string_view inner = closed ? std::string_view(buf_).substr(0, close) : std::string_view(buf_);
  const bool named = on_inner(inner, closed, final && !closed, out);
  if (!closed && !final) return;
  if (!named) {
    emit_content(std::string(kOpen) + std::string(inner) + (closed ? std::string(kClose) : ""), out);
  } else {
    pending_ws_.clear();
    after_call_ = true;
  }
  buf_.erase(0, closed ? close + kClose.size() : buf_.size());
  in_block_ = false;
}

void ToolParser::feed(std::string_view text, OutputDelta& out) {
  buf_.append(text);
  for (;;) {
    if (in_block_) {
      const bool closed = buf_.find(kClose) != std::string::npos;
      close_block(false, out);
      if (!closed) return;
      continue;
    }
    const size_t open = buf_.find(kOpen);
    if (open == std::string::npos) {
      const size_t keep = partial_suffix(buf_, kOpen);
      emit_content(buf_.substr(0, buf_.size() - keep), out);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    emit_content(buf_.substr(0, open), out);  // whitespace before the block is dropped if it names a call
    buf_.erase(0, open + kOpen.size());
    in_block_ = true;
    begin_call();
  }
}

void ToolParser::finish(OutputDelta& out) {
  feed("", out);
  if (in_block_) close_block(true, out);
  else emit_content(std::exchange(buf_, std::string()), out);
  if (calls_ == 0) out.content += pending_ws_;
  pending_ws_.clear();
}

int32_t ToolParser::start_call(const std::string& name, OutputDelta& out) {
  const int32_t index = calls_++;
  out.tool_calls.push_back(ToolCallDelta{index, make_id_(), name, ""});
  return index;
}

void ToolParser::arguments(const std::string& text, OutputDelta& out) {
  if (text.empty() || calls_ == 0) return;
  if (!out.tool_calls.empty() && out.tool_calls.back().index == calls_ - 1) out.tool_calls.back().arguments += text;
  else out.tool_calls.push_back(ToolCallDelta{calls_ - 1, "", "", text});
}

const nlohmann::ordered_json& ToolParser::parameters_of(const std::string& name) const {
  static const nlohmann::ordered_json kNull;
  for (const ToolSpec& t : tools_)
    if (t.name == name) return t.parameters;
  return kNull;
}

const std::vector<std::string>& tool_parser_names() {
  static const std::vector<std::string> names = {"qwen3_coder", "hermes"};
  return names;
}

std::unique_ptr<ToolParser> make_tool_parser(const std::string& name, std::vector<ToolSpec> tools,
                                             ToolCallIdFn make_id) {
  if (name == "qwen3_coder") return std::make_unique<Qwen3CoderToolParser>(std::move(tools), std::move(make_id));
  if (name == "hermes") return std::make_unique<HermesToolParser>(std::move(tools), std::move(make_id));
  fail("unknown tool-call parser '{}' (expected qwen3_coder or hermes)", name);
}

std::string tool_parser_for_template(const std::string& source) {
  if (source.find("<function=") != std::string::npos && source.find("<parameter=") != std::string::npos)
    return "qwen3_coder";
  if (source.find("<tool_call>") != std::string::npos) return "hermes";
  return "";
}

}  // namespace moefold::server
