// Timing of one streamed response: turns the bytes of an SSE body, each piece stamped with the
// time it arrived, into a RequestOutput (TTFT, inter-chunk gaps, token counts, failure).
//
// A content chunk is a payload whose first choice carries non-empty text (chat streams open with
// an empty role delta, which does not count). TTFT is the arrival of the first content chunk,
// the ITL list the gaps between consecutive content chunks, the latency (E2EL) the arrival of the
// last content chunk (vLLM's end of a request). Output tokens come from the last
// `usage` seen (stream_options.include_usage), else they are the number of content chunks; prompt
// tokens from the usage, else the client's count.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "bench/serve_metrics.h"
#include "bench/sse_parser.h"

namespace moefold::bench {

class StreamRecorder {
 public:
  /// `start_s`: when the request was sent (seconds, same clock as the arrival times given later).
  explicit StreamRecorder(double start_s);

  /// Bytes of the response body that arrived at `t_s` (>= start_s; non-decreasing over calls).
  void on_bytes(std::string_view bytes, double t_s);

  /// True once the stream said `data: [DONE]`.
  bool done() const { return done_; }

  /// The request's record when its response ended at `end_s` (the latency of a request without
  /// content chunks; otherwise the last content chunk ends it). It failed if the stream carried an
  /// error event or no content chunk arrived (TTFT undefined); `client_prompt_tokens` is used when
  /// the server sent no usage.
  RequestOutput finish(double end_s, int64_t client_prompt_tokens) const;

 private:
  SseParser parser_;
  double start_s_;
  double last_chunk_s_ = 0;
  bool first_ = true, done_ = false;
  RequestOutput out_;
  int64_t content_chunks_ = 0;
  std::string error_;
};

}  // namespace moefold::bench
