// Grammar-constrained decoding over xgrammar (contract: grammar_constraint.h).
#include "runtime/grammar_constraint.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "text/tokenizer.h"

namespace moefold {

// The compiled grammar plus the vocabulary facts the matcher needs.
class CompiledConstraint {
 public:
  CompiledConstraint(xgrammar::CompiledGrammar g, int64_t vocab, std::string kind,
                     std::shared_ptr<const std::vector<uint32_t>> also)
      : grammar(std::move(g)), vocab_size(vocab), kind_name(std::move(kind)), and_mask(std::move(also)) {}
  xgrammar::CompiledGrammar grammar;
  int64_t vocab_size;
  std::string kind_name;
  /// ANDed into every mask when set (JSON kinds: tokens without raw control bytes, see below).
  std::shared_ptr<const std::vector<uint32_t>> and_mask;
};

namespace {

// A DLTensor view of a 1-D int32 host buffer (xgrammar's bitmask type).
DLTensor bitmask_tensor(std::span<uint32_t> mask, int64_t& shape) {
  shape = int64_t(mask.size());
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = &shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

// An EBNF string literal matching `s` byte for byte (UTF-8 passes through; quotes, backslashes and
// control bytes are escaped).
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out += char(c);
    }
  }
  return out + "\"";
}

}  // namespace

// --- ConstraintSpec ------------------------------------------------------------------------------

ConstraintSpec ConstraintSpec::json_schema(std::string schema) {
  ConstraintSpec s;
  s.kind = Kind::kJsonSchema;
  s.text = std::move(schema);
  return s;
}
ConstraintSpec ConstraintSpec::json_object() { return ConstraintSpec{}; }
ConstraintSpec ConstraintSpec::regex(std::string pattern) {
  ConstraintSpec s;
  s.kind = Kind::kRegex;
  s.text = std::move(pattern);
  return s;
}
ConstraintSpec ConstraintSpec::choice(std::vector<std::string> options) {
  ConstraintSpec s;
  s.kind = Kind::kChoice;
  s.choices = std::move(options);
  return s;
}
ConstraintSpec ConstraintSpec::grammar(std::string ebnf) {
  ConstraintSpec s;
  s.kind = Kind::kGrammar;
  s.text = std::move(ebnf);
  return s;
}
ConstraintSpec ConstraintSpec::structural_tag(std::string tag_json) {
  ConstraintSpec s;
  s.kind = Kind::kStructuralTag;
  s.text = std::move(tag_json);
  return s;
}

const char* ConstraintSpec::kind_name() const {
  switch (kind) {
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kJsonObject: return "json_object";
    case Kind::kRegex: return "regex";
    case Kind::kChoice: return "choice";
    case Kind::kGrammar: return "grammar";
    case Kind::kStructuralTag: return "structural_tag";
  }
  return "?";
}

std::string ConstraintSpec::cache_key() const {
  std::string key = fmt::format("{}|{}|{}|", kind_name(), any_whitespace ? 1 : 0, text.size());
  key += text;
  for (const std::string& c : choices) key += fmt::format("|{}:{}", c.size(), c);
  return key;
}

// --- GrammarCompiler -----------------------------------------------------------------------------

struct GrammarCompiler::Impl {
  Impl(xgrammar::TokenizerInfo info, int64_t V, std::vector<int32_t> stops)
      : vocab(V), stop_ids(std::move(stops)), compiler(info, /*max_threads=*/2, /*cache_enabled=*/true) {}
  int64_t vocab;
  std::vector<int32_t> stop_ids;
  xgrammar::GrammarCompiler compiler;
  // xgrammar's JSON string rule admits raw control characters (U+0000..U+001F), which JSON forbids
  // inside strings (a strict parser such as Python's json rejects them). Compact JSON needs no raw
  // control byte anywhere, so JSON constraints also mask every token containing one.
  // With any_whitespace, tab / LF / CR stay allowed (they are JSON whitespace), the rest is masked.
  std::shared_ptr<const std::vector<uint32_t>> json_safe, json_ws_safe;
  // Our own cache of wrappers (xgrammar caches the compiled grammars; this keeps one shared
  // CompiledConstraint per spec). Bounded: cleared when it grows past kMaxCached entries.
  static constexpr size_t kMaxCached = 256;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::shared_ptr<const CompiledConstraint>> cache;
};

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int64_t model_vocab_size,
                                 std::vector<int32_t> stop_token_ids) {
  MOEFOLD_CHECK(model_vocab_size >= 1, "grammar vocabulary must not be empty, got {} ids", model_vocab_size);
  for (int32_t t : stop_token_ids)
    MOEFOLD_CHECK(t >= 0 && t < model_vocab_size, "stop token id {} is outside the vocabulary [0, {})", t,
                  model_vocab_size);
  // The decoded bytes of every id; "" marks an id the grammar never allows (special added tokens,
  // holes) except the stop ids, which xgrammar allows when the grammar is complete.
  const int64_t n = std::min<int64_t>(int64_t(tokenizer.vocab_size()), model_vocab_size);
  std::vector<std::string> vocab(static_cast<size_t>(n));
  for (int64_t id = 0; id < n; ++id) {
    const int32_t i = int32_t(id);
    if (!tokenizer.contains(i) || tokenizer.is_special(i)) continue;
    vocab[size_t(id)] = std::string(tokenizer.token_bytes(i));
  }
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, int(model_vocab_size), stop_token_ids, false);
    impl_ = std::make_unique<Impl>(std::move(info), model_vocab_size, stop_token_ids);
  } catch (const std::exception& e) {
    fail("cannot build the grammar vocabulary: {}", e.what());
  }
  auto safe = std::make_shared<std::vector<uint32_t>>(size_t(bitmask_words(model_vocab_size)), ~0u);
  auto ws_safe = std::make_shared<std::vector<uint32_t>>(*safe);
  for (int64_t id = 0; id < n; ++id) {
    const std::string& b = vocab[size_t(id)];
    const uint32_t bit = ~(1u << (id % 32));
    if (std::any_of(b.begin(), b.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }))
      (*safe)[size_t(id / 32)] &= bit;
    if (std::any_of(b.begin(), b.end(), [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return u < 0x20 && u != '\t' && u != '\n' && u != '\r';
        }))
      (*ws_safe)[size_t(id / 32)] &= bit;
  }
  impl_->json_safe = std::move(safe);
  impl_->json_ws_safe = std::move(ws_safe);
}

GrammarCompiler::~GrammarCompiler() = default;

int64_t GrammarCompiler::vocab_size() const { return impl_->vocab; }
const std::vector<int32_t>& GrammarCompiler::stop_token_ids() const { return impl_->stop_ids; }

std::shared_ptr<const CompiledConstraint> GrammarCompiler::compile(const ConstraintSpec& spec) const {
  const std::string key = spec.cache_key();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) return it->second;
  }
  auto& c = impl_->compiler;
  std::optional<xgrammar::CompiledGrammar> g;
  try {
    switch (spec.kind) {
      case ConstraintSpec::Kind::kJsonSchema: {
        // strict_mode: additionalProperties / unevaluated items default to false (OpenAI strict).
        g = c.CompileJSONSchema(spec.text, spec.any_whitespace, std::nullopt,
                                std::make_pair(std::string(", "), std::string(": ")), /*strict_mode=*/true);
        break;
      }
      case ConstraintSpec::Kind::kJsonObject:
        g = c.CompileJSONSchema(R"({"type": "object"})", spec.any_whitespace, std::nullopt,
                                std::make_pair(std::string(", "), std::string(": ")), /*strict_mode=*/false);
        break;
      case ConstraintSpec::Kind::kRegex: g = c.CompileRegex(spec.text); break;
      case ConstraintSpec::Kind::kChoice: {
        if (spec.choices.empty()) throw ConstraintError("invalid choice: the choice list is empty");
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < spec.choices.size(); ++i) {
          if (spec.choices[i].empty()) throw ConstraintError(fmt::format("invalid choice: choice {} is empty", i));
          ebnf += (i ? " | " : "") + ebnf_literal(spec.choices[i]);
        }
        g = c.CompileGrammar(ebnf, "root");
        break;
      }
      case ConstraintSpec::Kind::kGrammar: g = c.CompileGrammar(spec.text, "root"); break;
      case ConstraintSpec::Kind::kStructuralTag: g = c.CompileStructuralTag(spec.text); break;
    }
  } catch (const ConstraintError&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    throw ConstraintError(fmt::format("invalid {}: {}", spec.kind_name(), msg));
  }
  const bool json = spec.kind == ConstraintSpec::Kind::kJsonSchema || spec.kind == ConstraintSpec::Kind::kJsonObject;
  auto compiled = std::make_shared<const CompiledConstraint>(std::move(*g), impl_->vocab, spec.kind_name(),
                                                             !json                 ? nullptr
                                                             : spec.any_whitespace ? impl_->json_ws_safe
                                                                                   : impl_->json_safe);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->cache.size() >= Impl::kMaxCached) impl_->cache.clear();
  impl_->cache.emplace(key, compiled);
  return compiled;
}

// --- GrammarMatcher ------------------------------------------------------------------------------

struct GrammarMatcher::Impl {
  explicit Impl(const xgrammar::CompiledGrammar& g) : m(g) {}
  xgrammar::GrammarMatcher m;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledConstraint> compiled) : compiled_(std::move(compiled)) {
  MOEFOLD_CHECK(compiled_ != nullptr, "GrammarMatcher needs a compiled constraint");
  impl_ = std::make_unique<Impl>(compiled_->grammar);
}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int64_t GrammarMatcher::vocab_size() const { return compiled_->vocab_size; }
const char* GrammarMatcher::compiled_kind() const { return compiled_->kind_name.c_str(); }

bool GrammarMatcher::accept_token(int32_t token) {
  if (token < 0 || token >= compiled_->vocab_size || impl_->m.IsTerminated()) return false;
  if (!impl_->m.AcceptToken(token)) return false;
  ++accepted_;
  return true;
}

bool GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> mask) {
  MOEFOLD_CHECK(int64_t(mask.size()) == bitmask_words(compiled_->vocab_size),
                "token bitmask has {} words for a vocabulary of {} ({} expected)", mask.size(), compiled_->vocab_size,
                bitmask_words(compiled_->vocab_size));
  if (impl_->m.IsTerminated()) {
    std::fill(mask.begin(), mask.end(), 0u);
    for (int32_t t : impl_->m.GetStopTokenIds())
      if (t >= 0 && t < compiled_->vocab_size) mask[size_t(t) / 32] |= 1u << (uint32_t(t) % 32);
    return true;
  }
  int64_t shape = 0;
  DLTensor t = bitmask_tensor(mask, shape);
  const bool restricted = impl_->m.FillNextTokenBitmask(&t, 0, false);
  finish_mask(mask);
  return restricted || compiled_->and_mask != nullptr;
}

void GrammarMatcher::finish_mask(std::span<uint32_t> mask) const {
  if (const auto& also = compiled_->and_mask)
    for (size_t w = 0; w < mask.size(); ++w) mask[w] &= (*also)[w];
}

int default_mask_threads() {
  return std::clamp(int(std::thread::hardware_concurrency() / 2), 1, 8);
}

void fill_next_token_bitmasks(std::span<GrammarMatcher* const> matchers, std::span<uint32_t> masks, int threads) {
  if (matchers.empty()) return;
  const int64_t V = matchers[0]->vocab_size();
  const size_t W = size_t(bitmask_words(V));
  MOEFOLD_CHECK(masks.size() == matchers.size() * W, "fill_next_token_bitmasks: {} words for {} rows of {}",
                masks.size(), matchers.size(), W);
  for (GrammarMatcher* m : matchers)
    MOEFOLD_CHECK(m->vocab_size() == V, "fill_next_token_bitmasks: matchers over {} and {} token ids", V, m->vocab_size());
  auto row = [&](size_t i) { return masks.subspan(i * W, W); };
  // Parallel only where it pays for the thread start-up (a few rows of ~0.1-1 ms each).
  if (threads <= 1 || matchers.size() < 4) {
    for (size_t i = 0; i < matchers.size(); ++i) matchers[i]->fill_next_token_bitmask(row(i));
    return;
  }
  std::vector<xgrammar::GrammarMatcher> live;  // handles sharing the matchers' state
  std::vector<int32_t> index;
  for (size_t i = 0; i < matchers.size(); ++i) {
    if (matchers[i]->is_terminated()) {
      matchers[i]->fill_next_token_bitmask(row(i));
    } else {
      live.push_back(matchers[i]->impl_->m);
      index.push_back(int32_t(i));
    }
  }
  if (live.empty()) return;
  int64_t shape[2] = {int64_t(matchers.size()), int64_t(W)};
  DLTensor t{};
  t.data = masks.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 2;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  xgrammar::BatchGrammarMatcher batch(int32_t(std::min<size_t>(size_t(threads), live.size())));
  batch.BatchFillNextTokenBitmask(&live, &t, index, false);
  for (int32_t i : index) matchers[size_t(i)]->finish_mask(row(size_t(i)));
}

bool GrammarMatcher::is_terminated() const { return impl_->m.IsTerminated(); }
bool GrammarMatcher::is_completed() const { return impl_->m.IsCompleted(); }

void GrammarMatcher::rollback(int32_t num_tokens) {
  MOEFOLD_CHECK(num_tokens >= 0 && num_tokens <= accepted_, "cannot roll back {} tokens: {} were accepted", num_tokens,
                accepted_);
  if (num_tokens == 0) return;
  impl_->m.Rollback(num_tokens);
  accepted_ -= num_tokens;
}

void GrammarMatcher::reset() {
  impl_->m.Reset();
  accepted_ = 0;
}

}  // namespace moefold
