#include "runtime/text_generation.h"

#include <chrono>

#include "core/error.h"
#include "runtime/sampler.h"
#include "text/detokenizer.h"

namespace moefold {

TextGenerationResult generate_text(ModelRunner& runner, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                                   const SamplingParams& params, int64_t max_total_tokens,
                                   const std::function<void(const std::string&)>& on_text) {
  params.validate();
  MOEFOLD_CHECK(!prompt_ids.empty(), "the prompt is empty");
  MOEFOLD_CHECK(int64_t(prompt_ids.size()) < max_total_tokens,
                "the prompt has {} tokens; the context holds at most {} (prompt + output)", prompt_ids.size(),
                max_total_tokens);
  const auto& eos = runner.config().eos_token_ids;
  Sampler sampler(params);
  StopChecker stop(params, eos);
  Detokenizer detok(tokenizer, /*skip_special_tokens=*/true);
  TextGenerationResult r;
  auto emit = [&](const StopUpdate& u) {
    if (!u.text.empty() && on_text) on_text(u.text);
    r.text += u.text;
  };
  // Ids the tokenizer cannot decode (vocabulary padding) are never sampled.
  const std::vector<int32_t> unknown = tokenizer.unknown_ids(runner.config().vocab_size);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto first_token = t0;
  auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const int32_t seq = runner.add_sequence(prompt_ids);
  try {
    // Sampled inside the executor (on the GPU with --device cuda): only the token comes back.
    std::vector<SampleResult> sampled;
    auto step = [&](int32_t num_tokens) {
      const RowSampling row{&sampler, prompt_ids, r.output_ids};
      runner.step_sample({{seq, num_tokens, false}}, {&row, 1}, unknown, sampled);
      if (!sampled[0].error.empty()) fail("{}", sampled[0].error);  // the sampler's own message
      return sampled[0].token;
    };
    int32_t token = step(int32_t(prompt_ids.size()));
    while (true) {
      r.output_ids.push_back(token);
      if (r.output_ids.size() == 1) first_token = clock::now();
      std::string delta = detok.feed(token);
      StopUpdate u = stop.on_token(token, delta);
      if (!u.finished() && int64_t(prompt_ids.size() + r.output_ids.size()) >= max_total_tokens)
        u = [&] {
          StopUpdate f = stop.finish(FinishReason::kLength);
          f.text = u.text + f.text;
          return f;
        }();
      emit(u);
      if (u.finished()) {
        r.finish = u.finish;
        break;
      }
      runner.append_token(seq, token);
      token = step(1);
    }
  } catch (...) {
    runner.release(seq);
    throw;
  }
  runner.release(seq);
  r.prefill_seconds = seconds(first_token - t0);
  r.decode_seconds = seconds(clock::now() - first_token);
  return r;
}

}  // namespace moefold
