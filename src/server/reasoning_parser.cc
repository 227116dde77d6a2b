// <think> splitting (contract: reasoning_parser.h).
#include "server/reasoning_parser.h"

#include "core/error.h"

namespace moefold::server {

namespace {

constexpr std::string_view kThink = "<think>";
constexpr std::string_view kEndThink = "</think>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view rstrip(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

bool ends_with(std::string_view s, std::string_view t) { return s.size() >= t.size() && s.substr(s.size() - t.size()) == t; }

size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

}  // namespace

bool prompt_opens_think(std::string_view prompt) { return ends_with(rstrip(prompt), kThink); }

const std::vector<std::string>& reasoning_parser_names() {
  static const std::vector<std::string> names = {"qwen3", "deepseek_r1"};
  return names;
}

ReasoningParser::ReasoningParser(const std::string& name, std::string_view prompt) {
  if (name != "qwen3" && name != "deepseek_r1")
    fail("unknown reasoning parser '{}' (expected qwen3 or deepseek_r1)", name);
  const std::string_view tail = rstrip(prompt);
  if (ends_with(tail, kThink)) start_reasoning_ = true;        // the template opened the block
  else if (ends_with(tail, kEndThink)) start_reasoning_ = false;  // ... or closed an empty one
  else start_reasoning_ = name == "deepseek_r1";
  state_ = State::kStart;
}

void ReasoningParser::run(bool final, OutputDelta& out) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // A leading <think> (after whitespace) opens the block; decide once it can be told apart.
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.substr(0, kThink.size()) == kThink) {
          buf_.erase(0, i + kThink.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThink.substr(0, rest.size()) == rest) return;  // may still become <think>
        state_ = start_reasoning_ ? State::kReasoning : State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t e = buf_.find(kEndThink);
        if (e != std::string::npos) {
          out.reasoning.append(buf_, 0, e);
          buf_.erase(0, e + kEndThink.size());
          state_ = State::kContentStart;
          continue;
        }
        const size_t keep = final ? 0 : partial_suffix(buf_, kEndThink);
        out.reasoning.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kContentStart: {
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

void ReasoningParser::feed(std::string_view text, OutputDelta& out) {
  buf_.append(text);
  run(false, out);
}

void ReasoningParser::finish(OutputDelta& out) { run(true, out); }

}  // namespace moefold::server
