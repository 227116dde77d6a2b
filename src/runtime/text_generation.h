// One request from token ids to streamed text on a ModelRunner: prefill, then sample token by token
// (Sampler), detokenize incrementally (Detokenizer) and stop on EOS, a stop string or max_tokens
// (StopChecker). Used by `moefold generate --prompt` and `moefold chat`; the server batches many
// requests through the scheduler instead.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/sampling_params.h"
#include "runtime/stop_checker.h"
#include "text/tokenizer.h"

namespace moefold {

struct TextGenerationResult {
  std::vector<int32_t> output_ids;
  std::string text;  ///< exactly the concatenation of the streamed pieces
  FinishReason finish = FinishReason::kNone;
  double prefill_seconds = 0;  ///< wall time of the prompt's step and the first sample
  double decode_seconds = 0;   ///< wall time of every later step and sample (output_ids.size() - 1 tokens)
};

/// Generates from `prompt_ids` until EOS (config eos ids), a stop string or token, params.max_tokens,
/// or `max_total_tokens` (prompt + output; finish "length"). on_text receives each piece of text as
/// soon as no stop string can still claim it. Throws Error on invalid params or an empty prompt.
TextGenerationResult generate_text(ModelRunner& runner, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                                   const SamplingParams& params, int64_t max_total_tokens,
                                   const std::function<void(const std::string&)>& on_text = {});

}  // namespace moefold
