// Reasoning parsers (`--reasoning-parser`, vLLM's names): split a thinking model's output into
// reasoning_content (between <think> and </think>) and content, one text piece at a time.
//
// Where the output starts is decided from the rendered prompt, not guessed from the output:
//  - the prompt ends with an open <think> (Qwen3.5/3.6 templates, DeepSeek-R1): the output
//    starts as reasoning and </think> switches to content;
//  - the prompt ends with a closed think block (<think>\n\n</think>\n\n: enable_thinking false):
//    everything is content;
//  - neither: `qwen3` starts as content, `deepseek_r1` as reasoning.
// In every case a <think> at the very start of the output (whitespace before it allowed) is
// dropped and starts reasoning. The tags themselves never reach either field; whitespace between
// </think> and the answer is dropped. An output that ends while reasoning (max_tokens reached)
// is all reasoning. Tags split across pieces are held back until they are complete.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_parsers/output_delta.h"

namespace moefold::server {

class ReasoningParser {
 public:
  /// `name`: "qwen3" or "deepseek_r1"; `prompt`: the rendered prompt text. Throws moefold::Error
  /// for another name.
  ReasoningParser(const std::string& name, std::string_view prompt);

  /// Appends the split of the next piece of output to out.reasoning / out.content.
  void feed(std::string_view text, OutputDelta& out);
  /// End of the output: releases held-back text.
  void finish(OutputDelta& out);
  /// True while the output is still inside the think block.
  bool in_reasoning() const { return state_ == State::kReasoning || state_ == State::kStart; }

 private:
  enum class State { kStart, kReasoning, kContentStart, kContent };
  void run(bool final, OutputDelta& out);

  State state_;
  bool start_reasoning_;  ///< kStart: with no <think> in the output, the output is reasoning
  std::string buf_;
};

/// True when the rendered prompt ends with an open think block (<think> and whitespace).
bool prompt_opens_think(std::string_view prompt);

/// Names accepted by --reasoning-parser.
const std::vector<std::string>& reasoning_parser_names();

}  // namespace moefold::server
