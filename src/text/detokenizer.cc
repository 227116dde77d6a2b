#include "text/detokenizer.h"

#include "text/unicode.h"

namespace moefold {

Detokenizer::Detokenizer(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

std::string Detokenizer::feed(int32_t id) {
  const std::string_view bytes = tokenizer_.token_bytes(id);  // throws for unknown ids
  if (bytes.empty() || (skip_special_ && tokenizer_.is_special(id))) return {};
  std::string buf = std::move(pending_);
  buf.append(bytes);
  // Hold back a trailing proper prefix of a UTF-8 sequence: the next token may complete it.
  // Everything before it starts and ends on boundaries that no later byte can change (a lead
  // byte or ASCII byte always starts a new maximal subpart), so its lossy decoding is final.
  const size_t hold = unicode::incomplete_tail_length(buf);
  pending_.assign(buf, buf.size() - hold, hold);
  buf.resize(buf.size() - hold);
  return unicode::decode_lossy(buf);
}

std::string Detokenizer::feed(std::span<const int32_t> ids) {
  std::string out;
  for (const int32_t id : ids) out += feed(id);
  return out;
}

std::string Detokenizer::flush() {
  std::string out = unicode::decode_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace moefold
