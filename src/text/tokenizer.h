// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`.
//
// Reproduces the encode/decode behaviour of the Hugging Face `tokenizers` library (the
// reference our tests compare against, see scripts/make_tokenizer_fixtures.py) for the
// pipeline that GPT-2-style byte-level BPE models use (Qwen2/3/3.5, Llama 3, SmolLM2):
//
//   text ──► added tokens matched in the raw text (tokens with normalized=false)
//        ──► normalizer on each remaining piece (NFC/NFD/NFKC/NFKD, Lowercase, Replace,
//            Prepend, Sequence; or none)
//        ──► added tokens matched in the normalised pieces (tokens with normalized=true)
//        ──► pre_tokenizer (Split with a regex or string, Digits, ByteLevel, Sequence)
//        ──► BPE model on each pre-token's bytes (merge ranks; vocab ids)
//        ──► post_processor when add_special_tokens (TemplateProcessing, Roberta/Bert,
//            ByteLevel = adds nothing, Sequence)
//
// decode() maps every id to its bytes (ByteLevel decoder: the 256-symbol byte alphabet back to
// bytes; a token containing a symbol outside that alphabet, e.g. "<|im_end|>" with a space,
// contributes its UTF-8 text as is), concatenates them, and replaces ill-formed UTF-8 by
// U+FFFD per maximal subpart, which is what `tokenizers` returns.
//
// Regexes are compiled with PCRE2 (UTF + UCP). `tokenizers` uses Oniguruma, whose \s is the
// White_Space property while PCRE2's also matches U+180E; we rewrite \s / \S to an explicit
// White_Space class so both engines agree. Character properties follow each
// library's Unicode tables (PCRE2 10.42: Unicode 14; utf8proc 2.8: Unicode 15), so characters
// assigned after Unicode 14 may pre-tokenize differently from `tokenizers`.
//
// Not supported (from_file throws moefold::Error naming the component): non-byte-level models
// (WordPiece, Unigram, BPE without a ByteLevel pre-tokenizer), BPE dropout, continuing-subword
// prefixes / end-of-word suffixes, regex Replace normalizers, Metaspace and other
// pre-tokenizers, decoders other than ByteLevel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moefold {

/// One entry of tokenizer.json's "added_tokens": a string matched verbatim in the input
/// before pre-tokenization and mapped to a fixed id.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  ///< match only when not adjacent to word characters
  bool lstrip = false;       ///< the match swallows whitespace on its left
  bool rstrip = false;       ///< the match swallows whitespace on its right
  bool normalized = true;    ///< matched in normalised text (else in the raw input)
  bool special = false;      ///< dropped by decode(..., skip_special_tokens=true)
};

class Tokenizer {
 public:
  /// Loads a tokenizer. `path` is either a tokenizer.json file or a model directory that
  /// contains one. Throws moefold::Error if the file is missing, is not valid JSON, or uses
  /// a component this implementation does not support (the message names it).
  static Tokenizer from_file(const std::filesystem::path& path);

  /// Same as from_file, from the JSON text of a tokenizer.json.
  static Tokenizer from_json(std::string_view json_text);

  /// Encodes UTF-8 `text` to token ids. With `add_special_tokens`, the post_processor's
  /// tokens (e.g. a BOS) are added; for Qwen and SmolLM2 it adds none.
  /// Throws moefold::Error if `text` is not valid UTF-8 (message gives the byte offset).
  /// Thread-safe; BPE results are cached per pre-token.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  /// Decodes ids to text (see the file comment). With `skip_special_tokens`, added tokens
  /// marked special are left out. Throws moefold::Error for an id outside [0, vocab_size())
  /// or one that no token has.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  /// The raw bytes id `id` contributes to decoded text (may be part of a UTF-8 character).
  /// Throws moefold::Error for an unknown id.
  std::string_view token_bytes(int32_t id) const;

  /// The id of a token given in its vocabulary spelling (byte-level symbols, e.g. "Ġthe",
  /// or an added token's content), or nullopt.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// The vocabulary spelling of `id`. Throws moefold::Error for an unknown id.
  std::string id_to_token(int32_t id) const;

  /// One past the largest id of any token (model vocabulary or added token). Ids in
  /// [0, vocab_size()) that no token uses are holes: decode rejects them.
  size_t vocab_size() const;

  /// True if some token (vocabulary or added) has id `id`: decode accepts it.
  bool contains(int32_t id) const;

  /// The ids in [0, model_vocab_size) that no token uses (a model's vocabulary padding, holes), in
  /// ascending order: ids a generator must never sample, since decode rejects them.
  std::vector<int32_t> unknown_ids(int64_t model_vocab_size) const;

  /// True if `id` is an added token marked special.
  bool is_special(int32_t id) const;

  /// The added tokens, in file order.
  const std::vector<AddedToken>& added_tokens() const;

  /// Number of entries in the per-pre-token BPE cache (for tests and diagnostics).
  size_t cache_size() const;

  Tokenizer(const Tokenizer&) = default;
  Tokenizer(Tokenizer&&) noexcept = default;
  Tokenizer& operator=(const Tokenizer&) = default;
  Tokenizer& operator=(Tokenizer&&) noexcept = default;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;  // immutable after load (except the internal cache)
};

}  // namespace moefold
