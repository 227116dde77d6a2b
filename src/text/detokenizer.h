// Incremental (streaming) detokenizer.
//
// Byte-level BPE tokens are byte strings, so one UTF-8 character can be split across several
// tokens. The detokenizer buffers the bytes of an unfinished character and emits text only up
// to the last character boundary, so every chunk it returns is valid UTF-8 and
//
//   feed(ids[0]) + feed(ids[1]) + ... + flush() == tokenizer.decode(ids, skip_special_tokens)
//
// holds for every id sequence, including ones whose bytes are not valid UTF-8 (ill-formed
// bytes become U+FFFD exactly as decode() replaces them; an unfinished character left at the
// end becomes one U+FFFD in flush()).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "text/tokenizer.h"

namespace moefold {

class Detokenizer {
 public:
  /// `tokenizer` is copied (cheap: the vocabulary is shared). With `skip_special_tokens`,
  /// special added tokens produce no text, as in Tokenizer::decode.
  explicit Detokenizer(Tokenizer tokenizer, bool skip_special_tokens = false);

  /// Appends one token and returns the text it completes (possibly empty: the token may end
  /// inside a multi-byte character). Throws moefold::Error for an unknown id; the state is
  /// unchanged in that case.
  std::string feed(int32_t id);

  /// feed() for several ids; returns the concatenated newly completed text.
  std::string feed(std::span<const int32_t> ids);

  /// Ends the stream: returns the held-back bytes of an unfinished character as U+FFFD (or ""
  /// when nothing is held) and resets the state for a new stream.
  std::string flush();

  /// Drops any held-back bytes and starts a new stream.
  void reset() { pending_.clear(); }

  /// Bytes of an unfinished UTF-8 character currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // always a proper prefix of a well-formed UTF-8 sequence, or empty
};

}  // namespace moefold
