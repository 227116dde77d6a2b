// Stop strings, stop tokens and length limits for streamed generation (contract: stop_checker.h).
#include "runtime/stop_checker.h"

#include <algorithm>

namespace moefold {
namespace {

/// Largest r' <= r such that s[0, r') does not end with an incomplete UTF-8 sequence.
/// Only a well-formed but unfinished lead+continuation run is held back; malformed bytes are
/// released as they are (holding them could never complete).
size_t utf8_safe_end(std::string_view s, size_t r) {
  size_t i = r;
  int cont = 0;
  while (i > 0 && cont < 3 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++cont;
  }
  if (i == 0) return r;
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t need;
  if ((lead & 0xE0) == 0xC0) need = 2;
  else if ((lead & 0xF0) == 0xE0) need = 3;
  else if ((lead & 0xF8) == 0xF0) need = 4;
  else return r;  // ASCII, or a stray continuation / invalid lead byte
  const size_t have = r - (i - 1);
  return have < need ? i - 1 : r;
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kNone: break;
  }
  return "";
}

StopStringFilter::StopStringFilter(std::vector<std::string> stop_strings)
    : stops_(std::move(stop_strings)) {
  for (const std::string& s : stops_) {
    if (s.empty()) fail("stop cannot contain an empty string.");
    max_len_ = std::max(max_len_, s.size());
  }
}

StopStringFilter::Result StopStringFilter::push(std::string_view chunk) {
  if (stopped_) fail("StopStringFilter::push called after a stop string was found.");
  pending_.append(chunk);
  Result out;

  // Earliest-ending occurrence over all stop strings (ties: earliest start). pending_ held no
  // whole stop string before this chunk, and no occurrence can start in released text (that
  // text was released only because no stop string can start there), so searching pending_ is
  // complete. For one string, its first occurrence is also its earliest-ending one.
  size_t best_end = std::string::npos, best_start = 0, best = 0;
  for (size_t k = 0; k < stops_.size(); ++k) {
    const size_t pos = pending_.find(stops_[k]);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stops_[k].size();
    if (end < best_end || (end == best_end && pos < best_start)) {
      best_end = end;
      best_start = pos;
      best = k;
    }
  }
  if (best_end != std::string::npos) {
    out.text = pending_.substr(0, best_start);
    out.matched = best;
    pending_.clear();
    stopped_ = true;
    return out;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  const size_t n = pending_.size();
  size_t release = n;
  const std::string_view view(pending_);
  for (size_t j = max_len_ > n + 1 ? 0 : n + 1 - max_len_; j < n; ++j) {
    const std::string_view tail = view.substr(j);
    const bool could_start = std::any_of(stops_.begin(), stops_.end(), [&](const std::string& s) {
      return tail.size() < s.size() && std::string_view(s).starts_with(tail);
    });
    if (could_start) {
      release = j;
      break;
    }
  }
  release = utf8_safe_end(view, release);
  out.text = pending_.substr(0, release);
  pending_.erase(0, release);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

StopChecker::StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids)
    : filter_((params.validate(), params.stop)),
      stop_ids_(params.stop_token_ids),
      max_tokens_(params.max_tokens) {
  if (!params.ignore_eos) eos_ids_.assign(eos_token_ids.begin(), eos_token_ids.end());
}

StopUpdate StopChecker::finish_with(StopUpdate u, FinishReason reason) {
  u.text += filter_.flush();
  u.finish = reason;
  reason_ = reason;
  text_ += u.text;
  return u;
}

StopUpdate StopChecker::on_token(int32_t token_id, std::string_view text_delta) {
  if (finished())
    fail("StopChecker::on_token called after the sequence finished ({}).",
         finish_reason_name(reason_));
  ++num_tokens_;
  StopUpdate u;

  // 1. Stop tokens: EOS first (vLLM reports no stop_reason for it), then stop_token_ids.
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token_id) != eos_ids_.end())
    return finish_with(std::move(u), FinishReason::kStop);
  if (std::find(stop_ids_.begin(), stop_ids_.end(), token_id) != stop_ids_.end()) {
    u.stop_token = token_id;
    return finish_with(std::move(u), FinishReason::kStop);
  }

  // 2. Stop strings.
  StopStringFilter::Result r = filter_.push(text_delta);
  u.text = std::move(r.text);
  if (r.matched) {
    u.stop_string = filter_.stop_strings()[*r.matched];
    return finish_with(std::move(u), FinishReason::kStop);
  }

  // 3. Length.
  if (max_tokens_ && num_tokens_ >= *max_tokens_)
    return finish_with(std::move(u), FinishReason::kLength);

  text_ += u.text;
  return u;
}

StopUpdate StopChecker::finish(FinishReason reason) {
  if (reason == FinishReason::kNone) fail("StopChecker::finish needs a finish reason.");
  if (finished())
    fail("StopChecker::finish called after the sequence finished ({}).",
         finish_reason_name(reason_));
  return finish_with(StopUpdate{}, reason);
}

}  // namespace moefold
