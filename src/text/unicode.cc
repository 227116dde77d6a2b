#include "text/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <span>

#include "core/error.h"

namespace moefold::unicode {
namespace {

#include "text/unicode_hf_tables.inc"

// For a lead byte: how many continuation bytes follow, and the allowed range of the FIRST
// continuation byte (Unicode table 3-7). need == -1 marks a byte that cannot start a sequence.
struct LeadInfo {
  int need;
  uint8_t lo, hi;
};

constexpr LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};  // excludes surrogates
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};  // excludes overlongs
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};  // <= U+10FFFF
  return {-1, 0, 0};
}

// Result of examining the sequence starting at s[i]: `len` bytes consumed; `ok` if they form a
// complete well-formed character; if !ok, `len` is the maximal subpart (>= 1) and `truncated`
// says the subpart ran into the end of the input (it is a proper prefix of a valid sequence).
struct Step {
  size_t len;
  bool ok;
  bool truncated;
};

Step step(std::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  const LeadInfo li = lead_info(b);
  if (li.need == 0) return {1, true, false};
  if (li.need < 0) return {1, false, false};
  size_t j = i + 1;
  for (int k = 0; k < li.need; ++k, ++j) {
    if (j >= s.size()) return {j - i, false, true};
    const auto c = static_cast<uint8_t>(s[j]);
    const uint8_t lo = k == 0 ? li.lo : 0x80, hi = k == 0 ? li.hi : 0xBF;
    if (c < lo || c > hi) return {j - i, false, false};
  }
  return {j - i, true, false};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t valid_prefix_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const Step st = step(s, i);
    if (!st.ok) return i;
    i += st.len;
  }
  return s.size();
}

void require_valid(std::string_view s, std::string_view what) {
  const size_t n = valid_prefix_length(s);
  if (n != s.size()) {
    fail("{} is not valid UTF-8: ill-formed byte 0x{:02X} at byte offset {} (of {})", what,
         static_cast<uint8_t>(s[n]), n, s.size());
  }
}

std::string decode_lossy(std::string_view s) {
  const size_t valid = valid_prefix_length(s);
  if (valid == s.size()) return std::string(s);
  std::string out(s.substr(0, valid));
  out.reserve(s.size() + 16);
  size_t i = valid;
  while (i < s.size()) {
    const Step st = step(s, i);
    if (st.ok) {
      out.append(s.substr(i, st.len));
    } else {
      out.append(kReplacement);
    }
    i += st.len;
  }
  return out;
}

size_t incomplete_tail_length(std::string_view s) {
  // A held-back tail starts with a lead byte at most 3 bytes before the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b = static_cast<uint8_t>(s[i]);
    if (b >= 0x80 && b < 0xC0) continue;  // continuation byte: keep looking for the lead
    const Step st = step(s, i);
    return (!st.ok && st.truncated && i + st.len == n) ? back : 0;
  }
  return 0;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int need;
  char32_t cp;
  if (b < 0xE0) {
    need = 1;
    cp = b & 0x1F;
  } else if (b < 0xF0) {
    need = 2;
    cp = b & 0x0F;
  } else {
    need = 3;
    cp = b & 0x07;
  }
  ++i;
  for (int k = 0; k < need; ++k, ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[i]) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_white_space(char32_t c) {
  // PropList.txt, White_Space (stable since Unicode 6.3).
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

namespace {
bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}
}  // namespace

namespace {
std::string utf8proc_normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(dst, &std::free);
  if (n < 0) fail("Unicode normalisation failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}
}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  if (is_ascii(s)) return std::string(s);  // every normal form is the identity on ASCII
  // `tokenizers` (our reference) normalises with older Unicode tables: characters it does not
  // know have no decomposition and combining class 0, i.e. they act as inert starters. Such a
  // character blocks reordering and composition across it, so normalising the text between
  // them separately and copying them unchanged reproduces its output exactly.
  const bool compat = form == NormalForm::kNFKC || form == NormalForm::kNFKD;
  const std::span<const char32_t> unknown =
      compat ? std::span<const char32_t>(kHfUnknownCompat) : std::span<const char32_t>(kHfUnknownCanonical);
  std::string out;
  size_t seg = 0, i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t cp = next_code_point(s, i);
    if (cp >= unknown.front() && std::binary_search(unknown.begin(), unknown.end(), cp)) {
      if (at > seg) out += utf8proc_normalize(s.substr(seg, at - seg), form);
      out.append(s.substr(at, i - at));
      seg = i;
    }
  }
  if (seg == 0) return utf8proc_normalize(s, form);
  if (seg < s.size()) out += utf8proc_normalize(s.substr(seg), form);
  return out;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = next_code_point(s, i);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else if (cp == 0x130) {
      // The one character whose unconditional full lowercase (SpecialCasing.txt) is not a
      // single code point: U+0130 -> U+0069 U+0307.
      out += "i\xCC\x87";
    } else {
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    }
  }
  return out;
}

}  // namespace moefold::unicode
