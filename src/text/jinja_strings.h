// Python `str` semantics on UTF-8 strings for the Jinja engine: code-point decoding, Python's
// notion of whitespace, and the str methods chat templates call (strip, split, title, ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moefold::jinja {

/// Decodes UTF-8 into code points; invalid bytes decode to U+FFFD.
std::u32string utf8_decode(const std::string& s);
/// Encodes code points as UTF-8.
std::string utf8_encode(const std::u32string& s);
/// Number of code points (Python len()).
size_t utf8_length(const std::string& s);

/// Python str.isspace() for one code point.
bool py_isspace(char32_t c);

/// Python str.strip/lstrip/rstrip; without `chars`, strips Python whitespace.
std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
/// Python str.split(sep, maxsplit); without `sep`, splits on runs of whitespace.
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
/// Python str.rsplit(sep, maxsplit).
std::vector<std::string> py_rsplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
/// Python str.replace(old, new, count) (count < 0: all).
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
/// Python str.upper() / lower() (ASCII and Latin-1/Greek/Cyrillic basic ranges).
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
/// Python str.title(): first letter of each letter run upper-cased, the rest lower-cased.
std::string py_title(const std::string& s);
/// Python str.capitalize().
std::string py_capitalize(const std::string& s);
/// Python str.splitlines() (without keepends).
std::vector<std::string> py_splitlines(const std::string& s);
/// Python str[start:stop:step] on code points; unset bounds are std::nullopt.
std::string py_slice(const std::string& s, std::optional<int64_t> start, std::optional<int64_t> stop,
                     std::optional<int64_t> step);

/// Resolves Python slice bounds for a sequence of length `len` into the visited indices.
std::vector<size_t> slice_indices(size_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  std::optional<int64_t> step);

}  // namespace moefold::jinja
