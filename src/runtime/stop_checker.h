// Stop conditions of one generated sequence, for streaming responses.
//
// Two layers:
//   StopStringFilter  text only: finds stop strings in the detokenized stream and decides how
//                     much of the pending text is safe to stream now.
//   StopChecker       per request: stop tokens (EOS unless ignore_eos, stop_token_ids),
//                     max_tokens, and a StopStringFilter; produces the finish_reason.
//
// Semantics (OpenAI / vLLM defaults):
//   * The stop string itself is never returned, and no byte of it is ever streamed: text that
//     could still grow into a stop string is held back until it either completes one (then it
//     is dropped together with everything after it) or can no longer do so (then it is released).
//   * When several stop strings occur, the one whose occurrence ENDS first wins (ties: the one
//     that starts first). This is exactly what feeding the text one byte at a time would do, so
//     the result does not depend on how the text is split into chunks. (vLLM instead takes the
//     first entry of the `stop` list found in the window, which can depend on chunking.)
//   * Text is handled as bytes of UTF-8. A released chunk never ends inside a multibyte
//     character: an incomplete trailing UTF-8 sequence is held back until its remaining bytes
//     arrive (or until the end of generation), so every streamed delta is valid UTF-8 when the
//     input as a whole is.
//   * Precedence when one token meets several conditions: stop token > stop string >
//     max_tokens ("length"). A sequence that ends with EOS exactly at max_tokens therefore
//     reports "stop" (vLLM v1 reports "length" there).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampling_params.h"

namespace moefold {

/// Why a sequence finished; kNone while it is still running.
enum class FinishReason : uint8_t { kNone, kStop, kLength };

/// OpenAI's spelling: "stop", "length"; "" for kNone (the server writes JSON null).
std::string_view finish_reason_name(FinishReason r);

/// Streaming stop-string detector over text chunks (bytes; UTF-8 expected, not validated).
class StopStringFilter {
 public:
  /// What push() decided for the text received so far.
  struct Result {
    /// Bytes that are now safe to stream (may be empty). Concatenating every Result::text and
    /// the final flush() gives the complete output text.
    std::string text;
    /// Index into the stop-string list of the stop string that ended generation, if one did.
    std::optional<size_t> matched;
  };

  /// `stop_strings` must all be non-empty (throws moefold::Error otherwise); an empty list
  /// means every byte is released as soon as it arrives (bar an incomplete UTF-8 tail).
  explicit StopStringFilter(std::vector<std::string> stop_strings);

  /// Appends a chunk of generated text. If this completes a stop string, stopped() becomes
  /// true, Result::matched names it, Result::text is the pending text before it and everything
  /// from the stop string on is discarded. Otherwise Result::text is the longest prefix of the
  /// pending text that can no longer be part of a stop string and does not end mid-character.
  /// Throws moefold::Error if called after a stop string was found.
  /// Cost: O((held + chunk) * total stop-string length).
  Result push(std::string_view chunk);

  /// Releases everything still held back (the text ended without completing a stop string,
  /// e.g. EOS or length). Returns "" after a stop string was found. The filter stays usable.
  std::string flush();

  /// True once a stop string has been found.
  bool stopped() const { return stopped_; }
  /// Bytes currently held back.
  size_t held_bytes() const { return pending_.size(); }
  const std::vector<std::string>& stop_strings() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;   // longest stop string, bytes
  std::string pending_;  // received, not yet released; never contains a whole stop string
  bool stopped_ = false;
};

/// What StopChecker::on_token() / finish() decided.
struct StopUpdate {
  /// Text to stream now (may be empty); the concatenation over all updates is the output text.
  std::string text;
  /// kNone while the sequence continues.
  FinishReason finish = FinishReason::kNone;
  /// vLLM's stop_reason: the stop string that matched ...
  std::optional<std::string> stop_string;
  /// ... or the stop_token_ids entry that ended generation. Both empty for EOS and "length".
  std::optional<int32_t> stop_token;

  bool finished() const { return finish != FinishReason::kNone; }
};

/// Per-request stop logic: feed every generated token with its detokenized text delta.
class StopChecker {
 public:
  /// `params` supplies stop, stop_token_ids, ignore_eos and max_tokens (validated here; throws
  /// moefold::Error). `eos_token_ids`: the model's end-of-sequence ids (may be several, e.g.
  /// <|eot_id|> and <|end_of_text|>); all of them are ignored when params.ignore_eos.
  StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids);

  /// Records one generated token (counted towards max_tokens) and its text delta (may be empty,
  /// e.g. while the detokenizer waits for the rest of a UTF-8 character). In order:
  ///   1. EOS (unless ignore_eos) or a stop_token_ids entry: finish "stop"; the token's own
  ///      text is discarded; held-back text is released.
  ///   2. The delta completes a stop string: finish "stop"; text before it is released.
  ///   3. max_tokens reached: finish "length"; held-back text is released.
  ///   4. Otherwise: the safe part of the pending text is released.
  /// Throws moefold::Error if the sequence has already finished.
  StopUpdate on_token(int32_t token_id, std::string_view text_delta);

  /// Ends the sequence for a reason decided elsewhere (e.g. the context length is exhausted:
  /// kLength) and releases the held-back text. `reason` must not be kNone; throws
  /// moefold::Error if already finished.
  StopUpdate finish(FinishReason reason);

  bool finished() const { return reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return reason_; }
  /// Every byte released so far (the final output text once finished).
  const std::string& text() const { return text_; }
  /// Tokens recorded by on_token(), stop tokens included.
  int64_t num_tokens() const { return num_tokens_; }

 private:
  StopUpdate finish_with(StopUpdate u, FinishReason reason);

  StopStringFilter filter_;
  std::vector<int32_t> eos_ids_;   // empty when ignore_eos
  std::vector<int32_t> stop_ids_;  // params.stop_token_ids
  std::optional<int32_t> max_tokens_;
  FinishReason reason_ = FinishReason::kNone;
  std::string text_;
  int64_t num_tokens_ = 0;
};

}  // namespace moefold
