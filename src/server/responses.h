// JSON bodies of OpenAI responses: whole responses (chat.completion, text_completion), stream
// chunks (chat.completion.chunk, text_completion), usage, and logprobs in the chat format
// ({"content": [{token, logprob, bytes, top_logprobs}]}) and the completions format
// ({tokens, token_logprobs, top_logprobs, text_offset}). Chat messages and deltas carry
// reasoning_content and tool_calls (vLLM's field names) when the output is parsed.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/request_channel.h"
#include "server/request_parser.h"
#include "server/tool_parsers/output_delta.h"
#include "text/tokenizer.h"

namespace moefold::server {

/// Everything one choice produced (non-streamed responses).
struct ChoiceResult {
  std::string text;
  std::vector<GeneratedToken> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  ChatMessage message;  ///< chat with ParsedRequest::parses_output(): the parsed text
};

class ResponseBuilder {
 public:
  using Json = nlohmann::ordered_json;

  /// `req` and `tokenizer` must outlive the builder. Picks the response id; `created` is req.created (the arrival), or now when 0.
  ResponseBuilder(const ParsedRequest& req, const Tokenizer& tokenizer);

  /// The whole non-streamed response with usage.
  Json response(const std::vector<ChoiceResult>& choices) const;
  /// Chat only: the first chunk of a choice, {"delta": {"role": "assistant", "content": ""}}.
  Json role_chunk(int32_t index) const;
  /// A stream chunk for choice `index` carrying `text`, the logprobs of `tokens` (when
  /// requested) and the finish reason (null while running). `text_offset` is the choice's
  /// offset so far (completions logprobs), advanced past `tokens`.
  Json chunk(int32_t index, const std::string& text, const std::vector<GeneratedToken>& tokens, FinishReason finish,
             int64_t& text_offset) const;
  /// Chat with ParsedRequest::parses_output(): a stream chunk for choice `index` carrying the
  /// parsed delta (reasoning_content, content, tool_calls fragments), the logprobs of `tokens`
  /// and the finish reason ("tool_calls" instead of "stop" when `called_tools`).
  Json delta_chunk(int32_t index, const OutputDelta& delta, const std::vector<GeneratedToken>& tokens,
                   FinishReason finish, bool called_tools) const;
  /// The final usage chunk of a stream (stream_options.include_usage): empty choices.
  Json usage_chunk(int64_t completion_tokens) const;
  /// {"prompt_tokens", "completion_tokens", "total_tokens",
  ///  "prompt_tokens_details": {"cached_tokens"}} (cached_tokens: set_cached_tokens, else 0).
  Json usage(int64_t completion_tokens) const;
  /// Prompt tokens the request's prompts got from the prefix cache (reported in usage).
  void set_cached_tokens(int64_t n) { cached_tokens_ = n; }

  const std::string& id() const { return id_; }

 private:
  Json base(const char* object) const;
  std::string token_text(int32_t id) const;
  Json chat_logprobs(const std::vector<GeneratedToken>& tokens) const;
  Json completion_logprobs(const std::vector<GeneratedToken>& tokens, int64_t& text_offset) const;
  Json logprobs(const std::vector<GeneratedToken>& tokens, int64_t& text_offset) const;
  Json message(const ChoiceResult& c) const;

  const ParsedRequest& req_;
  const Tokenizer& tok_;
  std::string id_;
  int64_t created_;
  int64_t cached_tokens_ = 0;
};

}  // namespace moefold::server
