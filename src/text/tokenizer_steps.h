// The normalizer and pre-tokenizer steps of a tokenizer.json (Hugging Face `tokenizers` semantics:
// normalizers NFC / NFD / NFKC / NFKD, Lowercase, Replace, Prepend, Strip, Sequence; pre-tokenizers Split,
// Digits, ByteLevel, Sequence), parsed once by text/tokenizer.cc and applied to every text it encodes.
// Internal to the tokenizer; tests: tests/unit/tokenizer_test.cc, tokenizer_json_test.cc.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/unicode.h"

namespace moefold::tokenizer_steps {

namespace uc = unicode;

/// A compiled pre-tokenizer pattern (PCRE2, UTF + UCP, JIT when available; tokenizer_steps.cc).
class Regex;

struct NormStep {
  enum Kind { kForm, kLowercase, kReplace, kPrepend, kStrip } kind = kForm;
  uc::NormalForm form = uc::NormalForm::kNFC;
  std::string a, b;  // Replace: pattern, content; Prepend: a = prefix
  bool left = false, right = false;
};

/// Appends the steps of a tokenizer.json "normalizer" object (null: none; Sequence flattened) to out.
/// Throws moefold::Error on an unsupported type.
void parse_normalizer(const nlohmann::json& j, std::vector<NormStep>& out);

/// The normalized text: the steps applied in order to s (valid UTF-8).
std::string apply_normalizer(const std::vector<NormStep>& steps, std::string s);

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreStep {
  enum Kind { kSplit, kDigits, kByteLevel } kind = kSplit;
  std::shared_ptr<Regex> regex;  // kSplit, and kByteLevel with use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool individual_digits = false;
  bool add_prefix_space = false;
};

/// Appends the steps of a tokenizer.json "pre_tokenizer" object (null: none; Sequence flattened) to out.
/// Throws moefold::Error on an unsupported type or a pattern PCRE2 cannot compile.
void parse_pre_tokenizer(const nlohmann::json& j, std::vector<PreStep>& out);

/// Splits every piece of `pieces` in place by each step in order (ByteLevel: the prefix space and the
/// GPT-2 split; the byte-to-symbol mapping is the tokenizer's). Throws moefold::Error when a match fails.
void apply_pre_tokenizer(const std::vector<PreStep>& steps, std::vector<std::string>& pieces);

}  // namespace moefold::tokenizer_steps
