// Grammar-constrained decoding: a request's output is restricted to a JSON schema, any JSON object,
// a regex, a choice list, an EBNF grammar or an xgrammar structural tag, enforced per step by a
// token bitmask that the sampler applies (disallowed ids get -inf logits before sampling).
//
// The grammar engine is xgrammar's C++ core (built from its PyPI source distribution by
// scripts/setup.sh). This header hides it: nothing here includes an xgrammar header.
//
//   GrammarCompiler   one per served model: the tokenizer vocabulary in decoded byte form
//                     (Tokenizer::token_bytes), the model's logits width and its EOS ids.
//                     compile(spec) -> shared CompiledConstraint (cached by spec; thread-safe).
//   CompiledConstraint immutable, shared by every request with the same spec.
//   GrammarMatcher    per request (not thread-safe): accept_token after each sampled token,
//                     fill_next_token_bitmask before each sampling step, rollback, is_terminated.
//
// Bitmask layout (the one xgrammar and the samplers use): bitmask_words(V) = ceil(V / 32) uint32
// words; token id t is allowed iff bit (t % 32) of word (t / 32) is set. Ids >= the tokenizer's
// size (a model's vocabulary padding) and special added tokens are never allowed, except the stop
// (EOS) ids, which are allowed exactly when the grammar is complete.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

namespace moefold {

class Tokenizer;

/// Thrown by GrammarCompiler::compile for a spec the engine cannot compile (invalid JSON schema,
/// unsupported schema keyword, bad regex / EBNF / structural tag). what() names the problem; the
/// server turns it into a 400.
struct ConstraintError : Error {
  using Error::Error;
};

/// What a request's output must match. Build it with the named constructors.
struct ConstraintSpec {
  enum class Kind {
    kJsonSchema,     ///< text: a JSON schema (OpenAI response_format json_schema, vLLM `json`)
    kJsonObject,     ///< any JSON object (response_format json_object); text unused
    kRegex,          ///< text: a regex (vLLM guided_regex / structured_outputs.regex)
    kChoice,         ///< choices: exactly one of these strings (vLLM guided_choice)
    kGrammar,        ///< text: an EBNF grammar in xgrammar/GBNF syntax, root rule `root`
    kStructuralTag,  ///< text: an xgrammar structural-tag JSON ({"type": "structural_tag", ...})
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  /// JSON kinds only: allow any whitespace between tokens (xgrammar's any_whitespace). Off by
  /// default: compact JSON (", " and ": " separators), which also keeps a weak model from emitting
  /// whitespace forever.
  bool any_whitespace = false;

  static ConstraintSpec json_schema(std::string schema);
  static ConstraintSpec json_object();
  static ConstraintSpec regex(std::string pattern);
  static ConstraintSpec choice(std::vector<std::string> options);
  static ConstraintSpec grammar(std::string ebnf);
  static ConstraintSpec structural_tag(std::string tag_json);

  /// "json_schema", "json_object", "regex", "choice", "grammar" or "structural_tag".
  const char* kind_name() const;
  /// A key identifying the spec (kind + content) for caching.
  std::string cache_key() const;
};

// bitmask_words(), bitmask_allows() and apply_token_bitmask() (the sampler's masked-logits step)
// are in runtime/sampler.h.

/// A compiled constraint over one GrammarCompiler's vocabulary. Immutable; share it freely.
class CompiledConstraint;

/// Compiles ConstraintSpecs against one model's vocabulary. Thread-safe.
class GrammarCompiler {
 public:
  /// tokenizer: its decoded bytes per id form the grammar engine's vocabulary (special added tokens
  /// and holes are never allowed). model_vocab_size: the logits width (>= tokenizer.vocab_size()
  /// is not required: ids the tokenizer lacks are simply never allowed; ids the tokenizer has beyond
  /// it are dropped). stop_token_ids: the ids that end a completed output (the model's EOS), each in
  /// [0, model_vocab_size). Throws Error for an empty vocabulary or out-of-range stop ids.
  GrammarCompiler(const Tokenizer& tokenizer, int64_t model_vocab_size, std::vector<int32_t> stop_token_ids);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  /// Compiles (or returns the cached result for an identical spec). Throws ConstraintError naming
  /// the problem, e.g. "invalid json_schema: ...".
  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec) const;

  /// The logits width the bitmasks cover.
  int64_t vocab_size() const;
  const std::vector<int32_t>& stop_token_ids() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class GrammarMatcher;

/// Fills the next-token bitmasks of several matchers (one step of a batch): row i of `masks`
/// (bitmask_words(V) words each, V = the matchers' common vocab_size(), else Error) for matchers[i],
/// exactly as matchers[i]->fill_next_token_bitmask would. With threads > 1 and enough rows the rows
/// are filled in parallel (xgrammar's batch matcher); threads <= 1 fills them one by one.
void fill_next_token_bitmasks(std::span<GrammarMatcher* const> matchers, std::span<uint32_t> masks, int threads);

/// Threads fill_next_token_bitmasks uses by default: half the hardware threads, 1..8.
int default_mask_threads();

/// The per-request matching state of one CompiledConstraint. Not thread-safe; movable.
class GrammarMatcher {
 public:
  /// A matcher at the start of the output. `compiled` must not be null (else Error).
  explicit GrammarMatcher(std::shared_ptr<const CompiledConstraint> compiled);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  /// Advances by one sampled token. Returns false (state unchanged) when the grammar does not
  /// allow it here, or the matcher is already terminated. Accepting a stop id when the grammar is
  /// complete terminates the matcher.
  bool accept_token(int32_t token);

  /// Writes the allowed next tokens into `mask` (bitmask_words(vocab_size()) words, else Error).
  /// Returns false when every token is allowed (the mask need not be applied). When terminated,
  /// allows nothing but the stop ids.
  bool fill_next_token_bitmask(std::span<uint32_t> mask);

  /// True after a stop id was accepted with the grammar complete.
  bool is_terminated() const;
  /// True when the output so far is a complete match (a stop id would be accepted now).
  bool is_completed() const;
  /// Undoes the last `num_tokens` accepted tokens (0 <= num_tokens <= tokens accepted, else Error);
  /// undoes termination too.
  void rollback(int32_t num_tokens);
  /// Back to the start (nothing accepted).
  void reset();
  /// Tokens accepted and not rolled back.
  int32_t num_accepted() const { return accepted_; }
  /// The logits width of the compiled constraint's vocabulary.
  int64_t vocab_size() const;
  /// The constraint's ConstraintSpec::kind_name() ("json_schema", ...), for messages.
  const char* compiled_kind() const;

 private:
  friend void fill_next_token_bitmasks(std::span<GrammarMatcher* const>, std::span<uint32_t>, int);
  /// ANDs the constraint's extra mask (if any) into one filled row.
  void finish_mask(std::span<uint32_t> mask) const;
  struct Impl;
  std::shared_ptr<const CompiledConstraint> compiled_;
  std::unique_ptr<Impl> impl_;
  int32_t accepted_ = 0;
};

}  // namespace moefold
