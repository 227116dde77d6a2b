// UTF-8 and Unicode helpers for the tokenizer: validation, lossy decoding, streaming
// boundaries, character classes and normalisation forms.
//
// UTF-8 well-formedness follows the Unicode Standard, chapter 3, table 3-7 ("Well-Formed
// UTF-8 Byte Sequences"); replacement of ill-formed input follows the "maximal subpart"
// practice of section 3.9 (the one WHATWG's decoder and Rust's String::from_utf8_lossy use),
// so our decode() produces byte-identical text to Hugging Face `tokenizers`.
// Normalisation and general categories come from utf8proc (Debian libutf8proc-dev).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moefold::unicode {

/// Length in bytes of the longest prefix of `s` that is well-formed UTF-8. Equal to
/// s.size() exactly when `s` is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
size_t valid_prefix_length(std::string_view s);

/// Throws moefold::Error naming `what` and the byte offset of the first ill-formed
/// sequence when `s` is not valid UTF-8.
void require_valid(std::string_view s, std::string_view what);

/// Decodes `s` as UTF-8, replacing each maximal ill-formed subpart with U+FFFD.
/// Valid input is returned unchanged. An incomplete sequence at the end becomes one U+FFFD.
std::string decode_lossy(std::string_view s);

/// Streaming support: the number of bytes at the end of `s` that form a proper (incomplete)
/// prefix of some well-formed UTF-8 sequence, i.e. bytes that must be held back because
/// later bytes may complete them. 0..3. Everything before that tail decodes (lossily) to the
/// same text no matter what bytes follow.
size_t incomplete_tail_length(std::string_view s);

/// Decodes the code point starting at s[i] and advances `i`. Precondition: `s` is valid UTF-8
/// and i < s.size().
char32_t next_code_point(std::string_view s, size_t& i);

/// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value) to `out`.
void append_utf8(std::string& out, char32_t cp);

/// Unicode White_Space property (what Rust's char::is_whitespace tests). Used for the
/// lstrip/rstrip flags of added tokens.
bool is_white_space(char32_t cp);

/// General category Nd, Nl or No (Rust's char::is_numeric; the `Digits` pre-tokenizer).
bool is_numeric(char32_t cp);

/// A "word" character for the single_word flag of added tokens: letters, marks, Nd, Nl, Pc,
/// and the joiners U+200C/U+200D (the Unicode \w of UTS #18, approximated by category).
bool is_word_char(char32_t cp);

/// The four Unicode normalisation forms (UAX #15), via utf8proc.
enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

/// Returns `s` (valid UTF-8) in normal form `form`, as Hugging Face `tokenizers` computes it:
/// utf8proc's UAX #15 algorithm, except that the few characters missing from `tokenizers`'
/// older Unicode tables (unicode_hf_tables.inc) are left alone and treated as class-0
/// starters, as it does. ASCII input is returned as is.
std::string normalize(std::string_view s, NormalForm form);

/// Per-code-point full lowercase mapping of `s` (valid UTF-8), as Rust's char::to_lowercase
/// (what the `Lowercase` normalizer applies): utf8proc's simple mapping, plus U+0130, the one
/// character whose unconditional lowercase is two code points. No context-dependent rules
/// (final sigma), like `tokenizers`.
std::string lowercase(std::string_view s);

}  // namespace moefold::unicode
