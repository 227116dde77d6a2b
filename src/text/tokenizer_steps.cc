// Normalizer and pre-tokenizer steps of the byte-level BPE tokenizer (text/tokenizer_steps.h), moved out of
// text/tokenizer.cc; behaviour as Hugging Face `tokenizers` (see there).
#include "text/tokenizer_steps.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace moefold::tokenizer_steps {

using json = nlohmann::json;

namespace {

// ------------------------------------------------------------------------------------------
// Regex (PCRE2, UTF + UCP, JIT when available).
// ------------------------------------------------------------------------------------------

// `tokenizers` compiles patterns with Oniguruma, whose Unicode \s is exactly the White_Space
// property (HT..CR, U+0085, and the Zs/Zl/Zp separators). PCRE2's \s under UCP differs: it also
// matches U+180E MONGOLIAN VOWEL SEPARATOR (a space separator before Unicode 6.3). So \s and \S
// are rewritten to the explicit White_Space class, which both engines read the same way.
constexpr std::string_view kWhiteSpaceClass =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      if (d == 's') {
        if (in_class) {
          out += kWhiteSpaceClass;
        } else {
          out += '[';
          out += kWhiteSpaceClass;
          out += ']';
        }
      } else if (d == 'S') {
        if (in_class) fail("regex {:?}: \\S inside a character class is not supported", p);
        out += "[^";
        out += kWhiteSpaceClass;
        out += ']';
      } else {
        out += '\\';
        out += d;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class such as [:alpha:]
        const size_t e = p.find(":]", i + 2);
        if (e != std::string_view::npos) {
          out.append(p.substr(i, e + 2 - i));
          i = e + 1;
          continue;
        }
      }
      fail("regex {:?}: nested character classes are not supported", p);
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

class Regex {
 public:
  Regex(std::string_view pattern, bool literal) : source_(pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    const std::string translated = literal ? std::string(pattern) : onig_to_pcre2(pattern);
    // PCRE2_LITERAL admits only a few other options (UCP is not one of them).
    const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                      &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("cannot compile pre-tokenizer regex {:?} at offset {}: {}", source_, err_off,
           reinterpret_cast<const char*>(msg));
    }
    code_.reset(code, pcre2_code_free);
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }

  // Calls f(begin, end) for each successive non-empty, non-overlapping match in `s` (valid
  // UTF-8), scanning left to right as Oniguruma's search loop does.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), &pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t offset = 0;
    while (offset < s.size()) {
      int rc = pcre2_match(code_.get(), subject, s.size(), offset, PCRE2_NO_UTF_CHECK, md.get(),
                           nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(code_.get(), subject, s.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md.get(), nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail("regex {:?} failed on a {}-byte input: {}", source_, s.size(),
             reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step over one character
        size_t next = b;
        if (next >= s.size()) return;
        uc::next_code_point(s, next);
        offset = next;
        continue;
      }
      f(b, e);
      offset = e;
    }
  }

 private:
  std::string source_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};

// ------------------------------------------------------------------------------------------
// Normalizer
// ------------------------------------------------------------------------------------------

void parse_normalizer(const json& j, std::vector<NormStep>& out) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : j.at("normalizers")) parse_normalizer(s, out);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    NormStep s;
    s.kind = NormStep::kForm;
    s.form = type == "NFC"    ? uc::NormalForm::kNFC
             : type == "NFD"  ? uc::NormalForm::kNFD
             : type == "NFKC" ? uc::NormalForm::kNFKC
                              : uc::NormalForm::kNFKD;
    out.push_back(s);
  } else if (type == "Lowercase") {
    NormStep s;
    s.kind = NormStep::kLowercase;
    out.push_back(s);
  } else if (type == "Replace") {
    const auto& pat = j.at("pattern");
    if (!pat.contains("String")) fail("normalizer Replace with a regex pattern is not supported");
    NormStep s;
    s.kind = NormStep::kReplace;
    s.a = pat.at("String").get<std::string>();
    s.b = j.at("content").get<std::string>();
    if (s.a.empty()) fail("normalizer Replace with an empty pattern");
    out.push_back(s);
  } else if (type == "Prepend") {
    NormStep s;
    s.kind = NormStep::kPrepend;
    s.a = j.at("prepend").get<std::string>();
    out.push_back(s);
  } else if (type == "Strip") {
    NormStep s;
    s.kind = NormStep::kStrip;
    s.left = j.value("strip_left", false);
    s.right = j.value("strip_right", false);
    out.push_back(s);
  } else {
    fail("unsupported normalizer type {:?}", type);
  }
}


std::string apply_normalizer(const std::vector<NormStep>& steps, std::string s) {
  for (const auto& st : steps) {
    switch (st.kind) {
      case NormStep::kForm: s = uc::normalize(s, st.form); break;
      case NormStep::kLowercase: s = uc::lowercase(s); break;
      case NormStep::kReplace: {
        std::string r;
        size_t pos = 0;
        for (size_t hit; (hit = s.find(st.a, pos)) != std::string::npos; pos = hit + st.a.size()) {
          r.append(s, pos, hit - pos);
          r += st.b;
        }
        r.append(s, pos, std::string::npos);
        s = std::move(r);
        break;
      }
      case NormStep::kPrepend:
        if (!s.empty()) s.insert(0, st.a);
        break;
      case NormStep::kStrip: {
        size_t b = 0, e = s.size();
        if (st.left) {
          size_t i = 0;
          while (i < s.size()) {
            size_t j = i;
            if (!uc::is_white_space(uc::next_code_point(s, j))) break;
            i = j;
          }
          b = i;
        }
        if (st.right) {
          // Walk forward remembering where the trailing whitespace run starts.
          size_t i = b, run = s.size();
          bool in_run = false;
          while (i < s.size()) {
            size_t j = i;
            const bool ws = uc::is_white_space(uc::next_code_point(s, j));
            if (ws && !in_run) run = i;
            in_run = ws;
            i = j;
          }
          e = in_run ? run : s.size();
        }
        s = s.substr(b, e - b);
        break;
      }
    }
  }
  return s;
}

// ------------------------------------------------------------------------------------------
// Pre-tokenizer
// ------------------------------------------------------------------------------------------
namespace {

Behavior parse_behavior(const std::string& s) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  fail("unsupported Split behavior {:?}", s);
}

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

void parse_pre_tokenizer(const json& j, std::vector<PreStep>& out) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : j.at("pretokenizers")) parse_pre_tokenizer(s, out);
  } else if (type == "Split") {
    PreStep s;
    s.kind = PreStep::kSplit;
    const auto& pat = j.at("pattern");
    if (pat.contains("Regex")) {
      s.regex = std::make_shared<Regex>(pat.at("Regex").get<std::string>(), false);
    } else if (pat.contains("String")) {
      const auto str = pat.at("String").get<std::string>();
      if (str.empty()) fail("pre-tokenizer Split with an empty string pattern");
      s.regex = std::make_shared<Regex>(str, true);
    } else {
      fail("pre-tokenizer Split: pattern must be Regex or String");
    }
    s.behavior = parse_behavior(j.at("behavior").get<std::string>());
    s.invert = j.value("invert", false);
    out.push_back(std::move(s));
  } else if (type == "Digits") {
    PreStep s;
    s.kind = PreStep::kDigits;
    s.individual_digits = j.value("individual_digits", false);
    out.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    PreStep s;
    s.kind = PreStep::kByteLevel;
    s.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern, false);
    out.push_back(std::move(s));
  } else {
    fail("unsupported pre_tokenizer type {:?}", type);
  }
}

namespace {

struct Seg {
  size_t b, e;
  bool match;
};

// Applies a split behaviour to a covering list of (offsets, is_match) segments, returning the
// pieces to keep (as [begin, end) pairs).
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Seg>& segs, Behavior bh) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (bh) {
    case Behavior::kIsolated:
      for (const auto& s : segs) out.emplace_back(s.b, s.e);
      break;
    case Behavior::kRemoved:
      for (const auto& s : segs) {
        if (!s.match) out.emplace_back(s.b, s.e);
      }
      break;
    case Behavior::kContiguous: {
      bool prev = false;
      for (const auto& s : segs) {
        if (s.match == prev && !out.empty()) {
          out.back().second = s.e;
        } else {
          out.emplace_back(s.b, s.e);
        }
        prev = s.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool prev = false;
      for (const auto& s : segs) {
        if (s.match && !prev && !out.empty()) {
          out.back().second = s.e;
        } else {
          out.emplace_back(s.b, s.e);
        }
        prev = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !prev && !out.empty()) {
          out.back().first = it->b;
        } else {
          out.emplace_back(it->b, it->e);
        }
        prev = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

// Splits every piece in `pieces` by `segs_of(piece)`; empty results are dropped.
template <class SegsOf>
void split_pieces(std::vector<std::string>& pieces, Behavior bh, SegsOf&& segs_of) {
  std::vector<std::string> next;
  next.reserve(pieces.size() * 2);
  for (const auto& p : pieces) {
    const std::vector<Seg> segs = segs_of(p);
    for (const auto& [b, e] : apply_behavior(segs, bh)) {
      if (e > b) next.emplace_back(p, b, e - b);
    }
  }
  pieces = std::move(next);
}

std::vector<Seg> regex_segments(const Regex& re, std::string_view s, bool invert) {
  std::vector<Seg> segs;
  size_t prev = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    if (b > prev) segs.push_back({prev, b, invert});
    segs.push_back({b, e, !invert});
    prev = e;
  });
  if (prev < s.size()) segs.push_back({prev, s.size(), invert});
  return segs;
}

std::vector<Seg> numeric_segments(std::string_view s) {
  std::vector<Seg> segs;
  size_t last = 0, i = 0;
  while (i < s.size()) {
    const size_t b = i;
    if (uc::is_numeric(uc::next_code_point(s, i))) {
      if (last < b) segs.push_back({last, b, false});
      segs.push_back({b, i, true});
      last = i;
    }
  }
  if (last < s.size()) segs.push_back({last, s.size(), false});
  return segs;
}

}  // namespace

void apply_pre_tokenizer(const std::vector<PreStep>& steps, std::vector<std::string>& pieces) {
  for (const auto& st : steps) {
    switch (st.kind) {
      case PreStep::kSplit:
        split_pieces(pieces, st.behavior,
                     [&](std::string_view p) { return regex_segments(*st.regex, p, st.invert); });
        break;
      case PreStep::kDigits:
        split_pieces(pieces,
                     st.individual_digits ? Behavior::kIsolated : Behavior::kContiguous,
                     [](std::string_view p) { return numeric_segments(p); });
        break;
      case PreStep::kByteLevel:
        if (st.add_prefix_space) {
          for (auto& p : pieces) {
            if (p.empty() || p[0] != ' ') p.insert(0, 1, ' ');
          }
        }
        if (st.regex) {
          split_pieces(pieces, Behavior::kIsolated,
                       [&](std::string_view p) { return regex_segments(*st.regex, p, false); });
        }
        break;
    }
  }
}

}  // namespace moefold::tokenizer_steps
