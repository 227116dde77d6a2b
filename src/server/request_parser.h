// Parsing and validation of OpenAI-style /v1/chat/completions and /v1/completions bodies into
// prompts (token ids) and per-choice sampling parameters. Every problem is an ApiError 400 that
// names the offending field; nothing here touches the engine.
//
// Fields (both APIs unless noted): model, messages (chat) / prompt (completions: a string, a list
// of token ids, or a list of either for several prompts), max_tokens / max_completion_tokens,
// temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty,
// seed, stop (string or list), stop_token_ids, n, stream, stream_options.include_usage,
// logprobs (chat: bool; completions: int = number of alternatives) and top_logprobs (chat),
// ignore_eos, skip_special_tokens, return_tokens_as_token_ids, chat_template_kwargs, tools,
// tool_choice and parallel_tool_calls (chat: tool_request.h), add_generation_prompt (chat),
// add_special_tokens; structured output: response_format,
// structured_outputs and guided_* (server/structured_output.h), compiled with ModelInfo::grammar into
// SamplingParams::constraint (a spec the grammar engine cannot compile is a 400 naming the problem).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/grammar_constraint.h"
#include "runtime/sampling_params.h"
#include "server/engine.h"
#include "server/generation_config.h"
#include "server/tool_request.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace moefold::server {

/// What the parser needs to know about the served model.
struct ModelInfo {
  std::string name;           ///< served model name; requests naming another model get 400
  int32_t max_model_len = 0;  ///< prompt + output tokens
  int64_t vocab_size = 0;     ///< valid prompt token ids: [0, vocab_size)
  int32_t max_n = 16;         ///< largest n accepted
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  ///< null: /v1/chat/completions answers 400
  SamplingDefaults sampling_defaults;            ///< generation_config.json; request fields override
  ToolServing tool_serving;                      ///< --tool-call-parser, --enable-auto-tool-choice
  std::string reasoning_parser;                  ///< --reasoning-parser ("" = none)
  const GrammarCompiler* grammar = nullptr;      ///< null: structured-output requests answer 400
};

enum class Api { kChat, kCompletions };

struct ParsedRequest {
  Api api = Api::kCompletions;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  ///< one per prompt (chat: exactly one)
  std::vector<int32_t> max_tokens;            ///< resolved per prompt
  SamplingParams params;                      ///< shared by all choices (max_tokens, seed set per choice)
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  bool logprobs = false;       ///< report token logprobs
  int32_t top_logprobs = 0;    ///< alternatives per position
  bool tokens_as_ids = false;  ///< return_tokens_as_token_ids: tokens spelled "token_id:<id>"
  bool skip_special_tokens = true;
  int64_t created = 0;  ///< Unix seconds when the request arrived (the responses' `created`); 0: now
  // Chat only:
  ToolRequest tools;             ///< tools, tool_choice, the output's tool-call format
  std::string reasoning_parser;  ///< the server's --reasoning-parser ("" = none)
  std::string prompt_text;       ///< the rendered prompt (decides where reasoning starts)

  /// True when choices' text goes through ChatOutputParser (reasoning split or tool calls).
  bool parses_output() const { return api == Api::kChat && (!reasoning_parser.empty() || !tools.parser.empty()); }

  /// Sum of the prompt lengths (usage.prompt_tokens).
  int64_t prompt_tokens() const;
  /// The sequences to generate, prompt-major: choice index = prompt * n + j. With a seed,
  /// choice j of a prompt uses seed + j, so that the n choices differ.
  std::vector<ChoiceSpec> choices() const;
};

/// Validates the raw body (UTF-8, a JSON object nested at most kMaxRequestJsonDepth levels) and
/// parses it for `api`; sampling fields the body leaves out take info.sampling_defaults, then
/// SamplingParams' defaults. Integer fields must be integers in their range (beyond 64 bits, too,
/// is a 400, never a wrapped value). Error messages repeat at most kMaxEchoedChars bytes of a
/// client's value. Throws ApiError 400.
ParsedRequest parse_request(Api api, const std::string& body, const ModelInfo& info);

}  // namespace moefold::server
