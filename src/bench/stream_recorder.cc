// Timing of one streamed response (contract: stream_recorder.h).
#include "bench/stream_recorder.h"

namespace moefold::bench {

StreamRecorder::StreamRecorder(double start_s) : start_s_(start_s) { out_.start_s = start_s; }

void StreamRecorder::on_bytes(std::string_view bytes, double t_s) {
  for (const std::string& data : parser_.feed(bytes)) {
    const StreamChunk c = parse_stream_chunk(data);
    if (c.kind == StreamChunk::Kind::kDone) {
      done_ = true;
      continue;
    }
    if (c.kind == StreamChunk::Kind::kError) {
      if (error_.empty()) error_ = c.error;
      continue;
    }
    if (c.prompt_tokens) {
      out_.prompt_tokens = *c.prompt_tokens;
      out_.prompt_tokens_from_usage = true;
    }
    if (c.cached_tokens) {
      out_.cached_tokens = *c.cached_tokens;
      out_.cached_tokens_from_usage = true;
    }
    if (c.completion_tokens) {
      out_.output_tokens = *c.completion_tokens;
      out_.output_tokens_from_usage = true;
    }
    if (!c.has_choices || c.text.empty()) continue;
    ++content_chunks_;
    out_.generated_text += c.text;
    if (first_) {
      out_.ttft_s = t_s - start_s_;
      first_ = false;
    } else {
      out_.itl_s.push_back(t_s - last_chunk_s_);
    }
    last_chunk_s_ = t_s;
  }
}

RequestOutput StreamRecorder::finish(double end_s, int64_t client_prompt_tokens) const {
  RequestOutput r = out_;
  // Like vLLM, a completed request ends at its last content chunk: the trailing finish, usage and
  // [DONE] events and the end of the HTTP response carry no token (so E2EL - TTFT = sum of the ITLs).
  r.latency_s = (first_ ? end_s : last_chunk_s_) - start_s_;
  if (!r.prompt_tokens_from_usage) r.prompt_tokens = client_prompt_tokens;
  if (!r.output_tokens_from_usage) r.output_tokens = content_chunks_;
  if (!error_.empty()) {
    r.error = "error in the stream: " + error_;
  } else if (first_) {
    r.error = "the stream carried no content (time to first token undefined)";
  } else {
    r.success = true;
  }
  return r;
}

}  // namespace moefold::bench
