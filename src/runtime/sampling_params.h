// Per-request sampling and stopping parameters, as an OpenAI / vLLM client specifies them.
//
// The field meanings and accepted ranges follow vLLM's SamplingParams (which extends the OpenAI
// completions/chat parameters); where moefold deviates, the field comment says so.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace moefold {

class CompiledConstraint;  // runtime/grammar_constraint.h

/// Sampling and stop-condition settings of one request (one choice, if the server fans out n > 1).
///
/// The defaults are the "off" values, so a default-constructed SamplingParams samples from the
/// plain model distribution at temperature 1 and stops only on EOS (or the server's length cap).
struct SamplingParams {
  /// Softmax temperature, >= 0. Values below kGreedyTemperature (including 0) select greedy
  /// decoding (argmax); see sampler.h.
  float temperature = 1.0f;
  /// Keep only the top_k most likely tokens. 0 or -1 disables it; otherwise >= 1.
  int32_t top_k = 0;
  /// Nucleus sampling: keep the smallest most-likely set with cumulative probability >= top_p.
  /// Range (0, 1]; 1 disables it.
  float top_p = 1.0f;
  /// Keep tokens whose probability is >= min_p * (probability of the most likely token).
  /// Range [0, 1]; 0 disables it.
  float min_p = 0.0f;
  /// HF/vLLM repetition penalty over every token that occurs in the prompt or the output so far:
  /// a positive logit is divided by it, a non-positive one multiplied. > 0; 1 disables it.
  float repetition_penalty = 1.0f;
  /// OpenAI presence penalty: subtracted once from the logit of every token that occurs in the
  /// OUTPUT so far (the prompt does not count). Range [-2, 2]; 0 disables it.
  float presence_penalty = 0.0f;
  /// OpenAI frequency penalty: subtracted count times from the logit of a token that occurs
  /// count times in the OUTPUT so far. Range [-2, 2]; 0 disables it.
  float frequency_penalty = 0.0f;
  /// Random seed. With a seed, the sampled sequence is a pure function of (seed, logits), see
  /// sampler.h. Without one the Sampler draws a fresh seed per request. Any 64-bit value.
  std::optional<int64_t> seed;
  /// Compute and return the log-probability of each sampled token and, with top_logprobs > 0,
  /// the most likely alternatives (without it SampleResult::logprob is NaN).
  bool logprobs = false;
  /// Number of most likely (token, logprob) pairs to return per position, 0..20 (OpenAI's
  /// limit). Requires logprobs = true when > 0.
  int32_t top_logprobs = 0;
  /// Maximum number of generated tokens (stop tokens included), >= 1. nullopt = limited only by
  /// the model's context length, which the server enforces.
  std::optional<int32_t> max_tokens;
  /// Stop strings: generation ends as soon as the detokenized output contains one of them; the
  /// returned text ends right before it (the stop string itself is not returned). Non-empty.
  std::vector<std::string> stop;
  /// Token ids that end generation (finish_reason "stop"); their text is not returned. >= 0.
  std::vector<int32_t> stop_token_ids;
  /// Keep generating after the model's EOS token(s); stop_token_ids still apply.
  bool ignore_eos = false;
  /// Structured output (response_format json_schema / json_object, vLLM's structured_outputs /
  /// guided_*): the output must match this compiled constraint (runtime/grammar_constraint.h). The
  /// scheduler keeps a GrammarMatcher per request and masks every sampled row with its bitmask; the
  /// request ends (finish "stop") when the matcher terminates on a stop id. null = unconstrained.
  std::shared_ptr<const CompiledConstraint> constraint;

  /// Largest top_logprobs value accepted (OpenAI's chat API limit; vLLM's default max_logprobs).
  static constexpr int32_t kMaxTopLogprobs = 20;
  /// Temperatures below this are treated as greedy (vLLM's _SAMPLING_EPS). Avoids dividing
  /// logits by a vanishing temperature, which would overflow.
  static constexpr float kGreedyTemperature = 1e-5f;

  /// True when this request decodes greedily (temperature < kGreedyTemperature).
  bool greedy() const { return temperature < kGreedyTemperature; }

  /// Checks every field against its documented range.
  /// Throws moefold::Error with an OpenAI-style message ("top_p must be in (0, 1], got 1.5.")
  /// naming the first offending field. Non-finite floats are rejected for every float field.
  void validate() const {
    auto finite = [](const char* name, float v) {
      if (!std::isfinite(v)) fail("{} must be a finite number, got {}.", name, v);
    };
    finite("temperature", temperature);
    finite("top_p", top_p);
    finite("min_p", min_p);
    finite("repetition_penalty", repetition_penalty);
    finite("presence_penalty", presence_penalty);
    finite("frequency_penalty", frequency_penalty);
    if (temperature < 0.0f) fail("temperature must be non-negative, got {}.", temperature);
    if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top_p must be in (0, 1], got {}.", top_p);
    if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min_p must be in [0, 1], got {}.", min_p);
    if (top_k < -1) fail("top_k must be 0 or -1 (disable), or at least 1, got {}.", top_k);
    if (!(repetition_penalty > 0.0f))
      fail("repetition_penalty must be greater than zero, got {}.", repetition_penalty);
    if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
      fail("presence_penalty must be in [-2, 2], got {}.", presence_penalty);
    if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
      fail("frequency_penalty must be in [-2, 2], got {}.", frequency_penalty);
    if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs)
      fail("top_logprobs must be in [0, {}], got {}.", kMaxTopLogprobs, top_logprobs);
    if (top_logprobs > 0 && !logprobs)
      fail("logprobs must be set to true when top_logprobs is used, got top_logprobs={}.",
           top_logprobs);
    if (max_tokens && *max_tokens < 1) fail("max_tokens must be at least 1, got {}.", *max_tokens);
    for (const std::string& s : stop)
      if (s.empty()) fail("stop cannot contain an empty string.");
    for (int32_t t : stop_token_ids)
      if (t < 0) fail("stop_token_ids must be non-negative, got {}.", t);
  }
};

}  // namespace moefold
