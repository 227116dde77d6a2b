// Serving benchmark prompts (contract: datasets.h).
#include "bench/datasets.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "core/error.h"

namespace moefold::bench {

std::pair<int64_t, int64_t> length_range(int64_t len, double ratio) {
  MOEFOLD_CHECK(len >= 1, "length must be >= 1 (got {})", len);
  MOEFOLD_CHECK(ratio >= 0 && ratio < 1, "--random-range-ratio must be in [0, 1) (got {})", ratio);
  const int64_t lo = std::max<int64_t>(1, int64_t(std::floor(double(len) * (1 - ratio))));
  const int64_t hi = std::max<int64_t>(lo, int64_t(std::ceil(double(len) * (1 + ratio))));
  return {lo, hi};
}

namespace {

/// Ids that decode to ordinary text: neither special nor unused.
std::vector<int32_t> ordinary_ids(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  ids.reserve(tok.vocab_size());
  for (size_t i = 0; i < tok.vocab_size(); ++i) {
    const int32_t id = int32_t(i);
    if (tok.is_special(id)) continue;
    try {
      if (tok.token_bytes(id).empty()) continue;
    } catch (const Error&) {
      continue;  // a hole in the id range
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

std::vector<SampleRequest> sample_random_requests(const Tokenizer& tok, const RandomDatasetOptions& opt) {
  MOEFOLD_CHECK(opt.num_prompts >= 1, "--num-prompts must be >= 1 (got {})", opt.num_prompts);
  const auto [in_lo, in_hi] = length_range(opt.input_len, opt.range_ratio);
  const auto [out_lo, out_hi] = length_range(opt.output_len, opt.range_ratio);
  const std::vector<int32_t> vocab = ordinary_ids(tok);
  MOEFOLD_CHECK(!vocab.empty(), "the tokenizer has no ordinary (non-special) tokens to draw prompts from");
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int64_t> in_len(in_lo, in_hi), out_len(out_lo, out_hi);
  std::uniform_int_distribution<size_t> pick(0, vocab.size() - 1);
  std::vector<SampleRequest> out(size_t(opt.num_prompts));
  for (SampleRequest& r : out) {
    r.prompt_len = in_len(rng);
    r.output_len = out_len(rng);
  }
  auto draw = [&](std::vector<int32_t>& ids, size_t n) {
    for (size_t i = 0; i < n; ++i) ids.push_back(vocab[pick(rng)]);
  };
  for (SampleRequest& r : out) {
    const size_t target = size_t(r.prompt_len);
    std::vector<int32_t> ids;
    draw(ids, target);
    if (opt.token_ids) {
      r.prompt_ids = std::move(ids);
      continue;
    }
    // Decoded text need not re-encode to the same ids: adjust it like vLLM, up to 10 times.
    for (int tries = 0;; ++tries) {
      r.prompt = tok.decode(ids);
      ids = tok.encode(r.prompt, false);
      if (ids.size() == target || tries == 10) break;
      if (ids.size() < target)
        draw(ids, target - ids.size());
      else
        ids.resize(target);
    }
    r.prompt_len = int64_t(ids.size());
  }
  return out;
}

std::vector<SampleRequest> sample_prefix_repetition_requests(const Tokenizer& tok, const PrefixRepetitionOptions& opt) {
  MOEFOLD_CHECK(opt.num_prompts >= 1, "--num-prompts must be >= 1 (got {})", opt.num_prompts);
  MOEFOLD_CHECK(opt.prefix_len >= 1 && opt.suffix_len >= 0 && opt.num_prefixes >= 1 && opt.output_len >= 1,
                "prefix_repetition: prefix length {} (>= 1), suffix length {} (>= 0), {} prefixes (>= 1), output "
                "length {} (>= 1)",
                opt.prefix_len, opt.suffix_len, opt.num_prefixes, opt.output_len);
  const std::vector<int32_t> vocab = ordinary_ids(tok);
  MOEFOLD_CHECK(!vocab.empty(), "the tokenizer has no ordinary (non-special) tokens to draw prompts from");
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<size_t> pick(0, vocab.size() - 1);
  auto draw = [&](int64_t n) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(vocab[pick(rng)]);
    return ids;
  };
  std::vector<std::vector<int32_t>> prefixes;
  std::vector<std::string> prefix_text;
  for (int64_t p = 0; p < opt.num_prefixes; ++p) {
    prefixes.push_back(draw(opt.prefix_len));
    if (!opt.token_ids) prefix_text.push_back(tok.decode(prefixes.back()));
  }
  std::vector<size_t> order(size_t(opt.num_prompts));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i % size_t(opt.num_prefixes);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<SampleRequest> out(order.size());
  for (size_t i = 0; i < out.size(); ++i) {
    SampleRequest& r = out[i];
    std::vector<int32_t> suffix = draw(opt.suffix_len);
    r.output_len = opt.output_len;
    if (opt.token_ids) {
      r.prompt_ids = prefixes[order[i]];
      r.prompt_ids.insert(r.prompt_ids.end(), suffix.begin(), suffix.end());
      r.prompt_len = int64_t(r.prompt_ids.size());
    } else {
      r.prompt = prefix_text[order[i]] + tok.decode(suffix);
      r.prompt_len = int64_t(tok.encode(r.prompt, false).size());
    }
  }
  return out;
}

std::vector<Conversation> sample_multi_turn_conversations(const Tokenizer& tok, const MultiTurnOptions& opt) {
  MOEFOLD_CHECK(opt.num_conversations >= 1 && opt.num_turns >= 1,
                "multi_turn: {} conversations and {} turns each (both must be >= 1)", opt.num_conversations,
                opt.num_turns);
  MOEFOLD_CHECK(opt.shared_prefix_len >= 0 && opt.conversation_prefix_len >= 0 && opt.output_len >= 1,
                "multi_turn: prefix lengths {} and {} (>= 0), output length {} (>= 1)", opt.shared_prefix_len,
                opt.conversation_prefix_len, opt.output_len);
  const auto [lo, hi] = length_range(opt.user_len, opt.range_ratio);
  const std::vector<int32_t> vocab = ordinary_ids(tok);
  MOEFOLD_CHECK(!vocab.empty(), "the tokenizer has no ordinary (non-special) tokens to draw prompts from");
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<size_t> pick(0, vocab.size() - 1);
  std::uniform_int_distribution<int64_t> user_len(lo, hi);
  // n random ids decoded to text, re-encoded and trimmed or extended (up to 10 times, as the random
  // dataset does) until the text re-encodes to n tokens.
  auto text = [&](int64_t n) {
    if (n <= 0) return std::string();
    std::vector<int32_t> ids;
    std::string t;
    for (int tries = 0;; ++tries) {
      while (int64_t(ids.size()) < n) ids.push_back(vocab[pick(rng)]);
      ids.resize(size_t(n));
      t = tok.decode(ids);
      ids = tok.encode(t, false);
      if (int64_t(ids.size()) == n || tries == 10) return t;
    }
  };
  const std::string shared = text(opt.shared_prefix_len);
  std::vector<Conversation> out(size_t(opt.num_conversations));
  for (Conversation& c : out) {
    c.system = shared + text(opt.conversation_prefix_len);
    for (int64_t t = 0; t < opt.num_turns; ++t) c.user_turns.push_back(text(user_len(rng)));
    c.output_len = opt.output_len;
  }
  return out;
}

SampleRequest multi_turn_request(const Conversation& conv, std::span<const std::string> replies, size_t turn, bool chat,
                                 const Tokenizer* tok) {
  MOEFOLD_CHECK(turn < conv.user_turns.size(), "multi_turn: turn {} of a conversation of {} turns", turn,
                conv.user_turns.size());
  MOEFOLD_CHECK(replies.size() >= turn, "multi_turn: turn {} needs the {} earlier replies, got {}", turn, turn,
                replies.size());
  SampleRequest r;
  r.output_len = conv.output_len;
  if (chat) {
    if (!conv.system.empty()) r.messages.emplace_back("system", conv.system);
    for (size_t t = 0; t < turn; ++t) {
      r.messages.emplace_back("user", conv.user_turns[t]);
      r.messages.emplace_back("assistant", replies[t]);
    }
    r.messages.emplace_back("user", conv.user_turns[turn]);
    return r;
  }
  if (!conv.system.empty()) r.prompt = "System: " + conv.system + "\n\n";
  for (size_t t = 0; t < turn; ++t) r.prompt += "User: " + conv.user_turns[t] + "\n\nAssistant: " + replies[t] + "\n\n";
  r.prompt += "User: " + conv.user_turns[turn] + "\n\nAssistant:";
  if (tok) r.prompt_len = int64_t(tok->encode(r.prompt, false).size());
  return r;
}

std::vector<SampleRequest> sample_file_requests(const FileDatasetOptions& opt, const Tokenizer* tok) {
  MOEFOLD_CHECK(opt.num_prompts >= 1, "--num-prompts must be >= 1 (got {})", opt.num_prompts);
  MOEFOLD_CHECK(opt.output_len >= 1, "output length must be >= 1 (got {})", opt.output_len);
  MOEFOLD_CHECK(!opt.path.empty(), "--dataset-name file needs --dataset-path FILE");
  std::ifstream in(opt.path, std::ios::binary);
  MOEFOLD_CHECK(in.good(), "--dataset-path {}: cannot open the file", opt.path);
  const bool jsonl = opt.path.size() >= 6 && opt.path.compare(opt.path.size() - 6, 6, ".jsonl") == 0;
  std::vector<std::string> prompts;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (!jsonl) {
      prompts.push_back(line);
      continue;
    }
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    MOEFOLD_CHECK(!j.is_discarded(), "{}:{}: not a JSON value", opt.path, lineno);
    if (j.is_string()) {
      prompts.push_back(j.get<std::string>());
      continue;
    }
    MOEFOLD_CHECK(j.is_object() && j.contains(opt.field) && j[opt.field].is_string(),
                  "{}:{}: no string field \"{}\" (choose the field with --dataset-field)", opt.path, lineno, opt.field);
    prompts.push_back(j[opt.field].get<std::string>());
  }
  MOEFOLD_CHECK(!prompts.empty(), "--dataset-path {}: no prompts in the file", opt.path);
  std::vector<size_t> order(prompts.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::mt19937_64 rng(opt.seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<SampleRequest> out(size_t(opt.num_prompts));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].prompt = prompts[order[i % order.size()]];
    out[i].output_len = opt.output_len;
    if (tok) out[i].prompt_len = int64_t(tok->encode(out[i].prompt, false).size());
  }
  return out;
}

}  // namespace moefold::bench
