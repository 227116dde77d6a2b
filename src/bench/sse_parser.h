// Server-Sent Events for `moefold bench serve`: an incremental parser of the event stream (bytes in
// arbitrary pieces -> the `data` of each complete event) and the reading of one OpenAI streaming
// payload (completions or chat chunk, final usage chunk, in-stream error, `[DONE]`).
//
// The parser follows the WHATWG event-stream rules that OpenAI-compatible servers rely on: lines end
// in "\n", "\r\n" or "\r"; a blank line dispatches the event; several `data:` lines of one event are
// joined with "\n"; one space after the colon is dropped; comment lines (":") and other fields
// (event, id, retry) are ignored; an event left incomplete when the stream ends is discarded.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moefold::bench {

/// Splits an SSE byte stream into the data payloads of its events. Not thread-safe.
class SseParser {
 public:
  /// Feeds the next `bytes` of the stream (any split, also inside a line or a "\r\n" pair);
  /// returns the data of every event completed by them, in order. Events without a data line
  /// are not returned.
  std::vector<std::string> feed(std::string_view bytes);

 private:
  void line(std::string_view l, std::vector<std::string>& out);
  std::string partial_;   // bytes of the current unfinished line
  std::string data_;      // data lines of the current event, joined by "\n"
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte fed was "\r" (a following "\n" belongs to it)
};

/// What one streamed payload of an OpenAI-compatible server says.
struct StreamChunk {
  enum class Kind { kData, kDone, kError };
  Kind kind = Kind::kData;
  bool has_choices = false;  ///< `choices` is a non-empty array
  std::string text;          ///< choices[0].text (completions) or delta.content / reasoning (chat)
  std::optional<int64_t> prompt_tokens;      ///< usage.prompt_tokens, when the chunk has usage
  std::optional<int64_t> completion_tokens;  ///< usage.completion_tokens, when the chunk has usage
  std::optional<int64_t> cached_tokens;      ///< usage.prompt_tokens_details.cached_tokens, when present
  std::string error;         ///< kError: the server's message (or the payload when it has none)
};

/// Reads one event's data: "[DONE]" -> kDone; a JSON object with an `error` member, or data that is
/// not a JSON object -> kError with a message; otherwise kData with the text of the first choice
/// (`text`, or `delta.content`, `delta.reasoning_content`, `delta.reasoning` joined) and the usage
/// counts when present. Never throws.
StreamChunk parse_stream_chunk(std::string_view data);

}  // namespace moefold::bench
