// CPU reference token sampler: one row of logits + the sequence's history -> one token.
//
// This is the executable definition that the GPU sampler is checked against, so every step is
// specified exactly below, including tie-breaking and the random draw.
//
// Processing order (vLLM v1's sampler, vllm/v1/sample/sampler.py, chosen over HF's warper order):
//   0. Validate: logits must not contain NaN or +inf (-inf is allowed and means "never sample
//      this token"); at least one logit must be finite. Violations throw moefold::Error.
//   1. Logprobs (only when requested) are taken from the RAW logits: log_softmax(logits) in
//      double precision, before penalties, temperature or truncation (vLLM v1's default
//      logprobs mode "raw_logprobs").
//      The sampled token's logprob and the top-n list both come from this distribution.
//   2. Penalties, in this order, on the float32 logits (apply_penalties):
//        repetition  (tokens in prompt or output: x > 0 ? x / r : x * r)
//        frequency   (x -= frequency_penalty * count_in_output)
//        presence    (x -= presence_penalty  if count_in_output > 0)
//   3. Greedy (temperature < SamplingParams::kGreedyTemperature): the argmax of the penalized
//      logits, ties broken by the LOWER token id. Steps 4-8 are skipped, so greedy does not
//      depend on top_k / top_p / min_p / seed. (Penalties do apply to greedy, as in vLLM & HF.)
//   4. Temperature: w_i = exp((x_i - max_j x_j) / T) in double precision (the unnormalized
//      softmax at temperature T; w = 1 for the most likely token, 0 for -inf logits).
//   5. min_p: keep i iff p_i >= min_p * p_max, i.e. w_i >= min_p; evaluated in logit space as
//      (x_i - max_j x_j) / T >= ln(min_p) in double (no exp needed to truncate).
//   6. top_k: keep the k survivors with the largest penalized logit; ties broken by the lower
//      token id, so exactly k are kept. (HF/vLLM keep every token tied with the k-th value;
//      moefold keeps exactly k, which makes top_k = 1 identical to greedy.)
//   7. top_p: over the survivors, renormalized, in order of decreasing logit (ties: lower id
//      first), keep the shortest prefix whose cumulative probability is >= top_p (the token that
//      crosses top_p is kept). Equivalent to vLLM/HF's "drop tokens whose ascending cumsum is
//      <= 1 - top_p".
//   8. Draw: u = sampling_uniform(seed, step) in [0, 1). Walk the survivors in ascending token
//      id, accumulating w_i (double); return the first token whose running sum exceeds u * Z,
//      where Z is the sum of all survivors' w_i in the same order (inverse-CDF sampling).
//
// Randomness: counter-based. The draw for output position `step` (0-based number of tokens
// generated before it) depends only on (seed, step), never on a generator's hidden state, on
// other requests in the batch, or on how often the sampler was called (preemption / recompute
// reproduces the same tokens). sampling_uniform() is the step-th output of SplitMix64 seeded with
// `seed`, which is itself a counter-based hash: mix64(seed + (step + 1) * 0x9E3779B97F4A7C15).
// Requests without a seed get one from random_seed() when their Sampler is created.
//
// Cost: O(V) per token plus, with top_k / top_p, O(V) expected for the selection
// (nth_element for top_k; a mass-guided quickselect for top_p that sorts at most 64 entries),
// never a full sort of the vocabulary. Penalties cost O(V + history) (a per-call table of V
// entries).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampling_params.h"

namespace moefold {

/// One (token id, natural-log probability) pair.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  bool operator==(const TokenLogprob&) const = default;
};

/// The outcome of sampling one position.
struct SampleResult {
  /// The chosen token id, in [0, vocab).
  int32_t token = -1;
  /// log_softmax(raw logits)[token], natural log (<= 0), when params.logprobs (NaN otherwise: the
  /// full-vocabulary log-sum-exp is computed only when asked for). See step 1 in the file comment.
  float logprob = 0.0f;
  /// The min(top_logprobs, vocab) most likely tokens under the raw log_softmax, by decreasing
  /// logprob (ties: lower id first). Empty unless params.logprobs && params.top_logprobs > 0.
  std::vector<TokenLogprob> top_logprobs;
  /// Non-empty when sampling this row failed (e.g. NaN logits; the message of the moefold::Error the
  /// CPU sampler throws): token is then -1 and the other fields are meaningless. Batched samplers
  /// (Executor::forward_sample) report a row's failure here so that only that request fails.
  std::string error;
};

/// Sets logits[id] = -inf for every id in `ids` inside the row (ids outside [0, size) are ignored): those
/// tokens can then never be sampled (sampler step 0: -inf means "never"). O(ids.size()).
void mask_tokens(std::span<float> logits, std::span<const int32_t> ids);

/// Number of uint32 words of a token bitmask over `vocab_size` ids: ceil(vocab_size / 32). Token id t
/// is allowed iff bit (t % 32) of word (t / 32) is set (xgrammar's layout; runtime/grammar_constraint.h).
inline int64_t bitmask_words(int64_t vocab_size) { return (vocab_size + 31) / 32; }

/// True iff bit `token` of `mask` is set (false for a token outside [0, 32 * mask.size())).
inline bool bitmask_allows(std::span<const uint32_t> mask, int32_t token) {
  if (token < 0 || size_t(token) / 32 >= mask.size()) return false;
  return (mask[size_t(token) / 32] >> (uint32_t(token) % 32)) & 1u;
}

/// Grammar-constrained decoding's masked-logits step: logits[t] = -inf for every t whose bit in
/// `mask` is clear (applied after mask_tokens, before step 0). mask must have
/// bitmask_words(logits.size()) words, else moefold::Error. O(V / 32) for all-ones words.
void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> mask);

/// The step-th output of a SplitMix64 generator seeded with `seed`, as a double in [0, 1)
/// (its top 53 bits times 2^-53). Pure function; this is the sampler's only source of randomness.
double sampling_uniform(uint64_t seed, uint64_t step);

/// The step-th (0-based) 64-bit output of SplitMix64 seeded with `seed` (counter-based).
uint64_t splitmix64_at(uint64_t seed, uint64_t step);

/// A fresh, non-deterministic 64-bit seed (std::random_device) for requests without one.
uint64_t random_seed();

/// Applies repetition, frequency and presence penalties (step 2) to `logits` in place.
/// `prompt_tokens` count for the repetition penalty only; `output_tokens` for all three.
/// Does nothing (and reads no history) when all three penalties are off.
/// Throws moefold::Error if a history token id is outside [0, logits.size()).
void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                     std::span<const int32_t> output_tokens, const SamplingParams& params);

/// The exact distribution that sample_token() draws from (steps 0, 2-7): probabilities over the
/// whole vocabulary in double, zero for removed tokens, summing to 1 (a one-hot vector for
/// greedy). For tests and for checking other sampler implementations against this one.
/// Throws moefold::Error under the same conditions as sample_token().
std::vector<double> sampling_distribution(std::span<const float> logits,
                                          std::span<const int32_t> prompt_tokens,
                                          std::span<const int32_t> output_tokens,
                                          const SamplingParams& params);

/// The `n` most likely tokens under log_softmax(logits) (raw logits, double-precision
/// log-sum-exp), by decreasing logprob, ties lower id first; n is clamped to logits.size().
/// Throws moefold::Error for NaN / +inf / all -inf logits.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t n);

/// Samples one token (steps 0-8 of the file comment).
///   logits: float32 scores for the whole vocabulary (V = logits.size(), 1 <= V < 2^31).
///   prompt_tokens / output_tokens: the sequence so far (ids in [0, V)); used by penalties.
///   params: validated here (throws moefold::Error like SamplingParams::validate()).
///   seed, step: select the random draw, u = sampling_uniform(seed, step); unused for greedy.
/// Throws moefold::Error for empty logits, NaN or +inf logits, all-(-inf) logits, or history
/// ids out of range.
SampleResult sample_token(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                          std::span<const int32_t> output_tokens, const SamplingParams& params,
                          uint64_t seed, uint64_t step);

/// Per-request sampler: owns validated params and the request's resolved seed.
/// Stateless between calls (sample() is const and thread-safe).
class Sampler {
 public:
  /// Validates `params` (throws moefold::Error) and fixes the seed: params.seed reinterpreted
  /// as uint64 if present, otherwise random_seed().
  explicit Sampler(SamplingParams params);

  /// Samples the next token of the sequence; the draw index is output_tokens.size(), so the
  /// result depends only on (seed, logits, history). See sample_token() for the contract.
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens) const {
    return sample_token(logits, prompt_tokens, output_tokens, params_, seed_,
                        output_tokens.size());
  }

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

 private:
  SamplingParams params_;
  uint64_t seed_;
};

}  // namespace moefold
