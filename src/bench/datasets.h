// The prompts of a serving benchmark (`moefold bench serve --dataset-name random|file`).
//
// random: like vLLM's RandomDataset. Input and output lengths are drawn uniformly from
// [floor(len * (1 - r)), ceil(len * (1 + r))] (r = --random-range-ratio, lower bounds at least 1);
// a prompt is that many token ids drawn uniformly from the tokenizer's vocabulary (special tokens
// and unused ids left out). It is sent either as those ids (a token-id list, which /v1/completions
// of moefold and vLLM accept: exact lengths) or as their decoded text, re-encoded and trimmed or
// extended with more random ids up to 10 times until it re-encodes to the drawn length, as vLLM
// does (a few prompts may stay a token or two off).
//
// prefix_repetition: shared prefixes with distinct suffixes (sample_prefix_repetition_requests).
//
// multi_turn: conversations (like vLLM's multi-turn benchmark, benchmarks/multi_turn): each has a
// system prompt (shared by all conversations, then a part of its own) and N user messages of random
// tokens; turn t's request carries the system prompt, the earlier user messages and the model's
// actual replies to them, then user message t (sample_multi_turn_conversations, multi_turn_request).
//
// file: one prompt per line of a text file, or, for a `.jsonl` file, one JSON object per line
// with the prompt in a string field (e.g. "question" for GSM8K). The prompts are shuffled with the
// seed and the first num_prompts taken, repeating the file when it has fewer.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "text/tokenizer.h"

namespace moefold::bench {

/// One request to send.
struct SampleRequest {
  std::string prompt;               ///< the prompt text (unused when prompt_ids is not empty)
  std::vector<int32_t> prompt_ids;  ///< token ids sent instead of text (/v1/completions only)
  int64_t prompt_len = 0;           ///< prompt tokens by the client's tokenizer (0: unknown)
  int64_t output_len = 0;           ///< output tokens to ask for (max_tokens)
  /// Chat messages (role, content) sent instead of `prompt` on a chat endpoint when not empty.
  std::vector<std::pair<std::string, std::string>> messages;
};

/// The inclusive length range [floor(len * (1 - ratio)), ceil(len * (1 + ratio))], its lower end
/// raised to 1. Throws moefold::Error unless len >= 1 and 0 <= ratio < 1.
std::pair<int64_t, int64_t> length_range(int64_t len, double ratio);

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;
  uint64_t seed = 0;
  bool token_ids = false;  ///< send token-id lists instead of decoded text
};

/// Random-token requests (see the file comment). Deterministic for a tokenizer and options.
/// Throws moefold::Error for invalid options or a tokenizer without ordinary tokens.
std::vector<SampleRequest> sample_random_requests(const Tokenizer& tokenizer, const RandomDatasetOptions& opt);

struct PrefixRepetitionOptions {
  int64_t num_prompts = 1000;
  int64_t prefix_len = 256;   ///< tokens of each shared prefix
  int64_t suffix_len = 256;   ///< random tokens after it, distinct per request
  int64_t num_prefixes = 10;  ///< distinct prefixes; request i uses one of them (shuffled)
  int64_t output_len = 128;
  uint64_t seed = 0;
  bool token_ids = false;  ///< send token-id lists instead of decoded text
};

/// Shared-prefix requests (like vLLM's prefix_repetition dataset): num_prefixes random prefixes of
/// prefix_len tokens, each request one of them followed by suffix_len random tokens of its own, in a
/// seeded shuffled order; the traffic of a prefix cache (system prompts, agent tool lists). As text,
/// prefix and suffix are decoded separately and joined, so every request of a prefix starts with the
/// same text (its token count may differ from prefix + suffix by a token at the join).
/// Deterministic for a tokenizer and options. Throws moefold::Error for invalid options.
std::vector<SampleRequest> sample_prefix_repetition_requests(const Tokenizer& tokenizer,
                                                             const PrefixRepetitionOptions& opt);

struct MultiTurnOptions {
  int64_t num_conversations = 100;
  int64_t num_turns = 5;            ///< user messages (requests) per conversation
  int64_t shared_prefix_len = 512;  ///< system-prompt tokens common to every conversation (0: none)
  int64_t conversation_prefix_len = 0;  ///< system-prompt tokens of its own after the shared ones
  int64_t user_len = 128;           ///< tokens of each user message, drawn with range_ratio
  int64_t output_len = 128;         ///< max_tokens of every turn
  double range_ratio = 0.0;
  uint64_t seed = 0;
};

/// One synthetic conversation: the texts a client sends, the replies come from the server.
struct Conversation {
  std::string system;                   ///< the system prompt ("" when both prefix lengths are 0)
  std::vector<std::string> user_turns;  ///< user message of each turn
  int64_t output_len = 0;               ///< max_tokens of each turn
};

/// Conversations for --dataset-name multi_turn: random ordinary tokens decoded to text, adjusted like the
/// random dataset's text prompts until each part re-encodes to its drawn length (the system
/// prompt is the shared part then the conversation's own, decoded separately and joined, so every
/// conversation's system prompt starts with the same text). Deterministic for a tokenizer and
/// options. Throws moefold::Error for num_conversations or num_turns < 1, user_len or output_len < 1,
/// negative prefix lengths, a bad range ratio, or a tokenizer without ordinary tokens.
std::vector<Conversation> sample_multi_turn_conversations(const Tokenizer& tokenizer, const MultiTurnOptions& opt);

/// The request of turn `turn` (0-based) of `conv`, given the model's replies to turns 0..turn-1
/// (replies.size() >= turn; later ones are ignored). Chat (`chat` true): messages = [system (when not
/// empty)], then (user t', assistant reply t') for t' < turn, then user `turn`. Completions: one text
/// prompt, "System: <system>\n\n" (when not empty) then "User: <u>\n\nAssistant: <reply>\n\n" per
/// earlier turn and "User: <u>\n\nAssistant:" for this one, so turn t's prompt begins with turn
/// t-1's prompt followed by its reply. prompt_len: the prompt's token count by `tokenizer` for
/// completions when given, else 0 (the server's usage counts). Throws moefold::Error when turn is
/// out of range or replies are missing.
SampleRequest multi_turn_request(const Conversation& conv, std::span<const std::string> replies, size_t turn, bool chat,
                                 const Tokenizer* tokenizer);

struct FileDatasetOptions {
  std::string path;
  std::string field = "prompt";  ///< the JSON field of a .jsonl file holding the prompt
  int64_t num_prompts = 1000;
  int64_t output_len = 128;
  uint64_t seed = 0;
};

/// Requests from a prompt file (see the file comment). With a tokenizer, prompt_len is the prompt's
/// token count; without, 0. Throws moefold::Error naming the file (and line) when it cannot be
/// read, a .jsonl line is not JSON or lacks the field as a string, or there is no prompt.
std::vector<SampleRequest> sample_file_requests(const FileDatasetOptions& opt, const Tokenizer* tokenizer);

}  // namespace moefold::bench
