// GrammarCompiler / GrammarMatcher (runtime/grammar_constraint.h) on the fixture Qwen-style tokenizer
// (3,005 ids, special ChatML tokens): every kind compiles; a valid document's tokens are each allowed
// by the mask and accepted, then only EOS, which terminates; invalid tokens are rejected; random walks
// over the allowed tokens always end in a document that matches (parsed with nlohmann for JSON);
// special tokens and ids past the tokenizer are never allowed; rollback restores the state;
// uncompilable specs throw ConstraintError naming the problem; apply_token_bitmask masks exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "fixture_util.h"
#include "runtime/grammar_constraint.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

using namespace moefold;

namespace {

constexpr int32_t kEos = 2;         // <|im_end|>
constexpr int64_t kModelVocab = 3100;  // wider than the tokenizer (3,005 ids): padding never allowed

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::from_file(test::kFixtures / "tokenizer" / "qwen35_mini" / "tokenizer.json");
  return t;
}

const GrammarCompiler& compiler() {
  static const GrammarCompiler c(tok(), kModelVocab, {kEos});
  return c;
}

std::vector<uint32_t> mask_of(GrammarMatcher& m) {
  std::vector<uint32_t> mask(size_t(bitmask_words(kModelVocab)));
  m.fill_next_token_bitmask(mask);
  return mask;
}

/// Feeds the tokens of `text` then EOS; expects every one allowed and accepted.
void expect_accepts(const ConstraintSpec& spec, const std::string& text) {
  GrammarMatcher m(compiler().compile(spec));
  for (int32_t t : tok().encode(text)) {
    ASSERT_TRUE(bitmask_allows(mask_of(m), t)) << "token " << t << " of " << text;
    ASSERT_TRUE(m.accept_token(t)) << text;
  }
  EXPECT_TRUE(m.is_completed()) << text;
  EXPECT_TRUE(bitmask_allows(mask_of(m), kEos));
  EXPECT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.is_terminated());
}

/// True when some token of `text` is refused (by the mask and by accept_token alike) before its end.
bool rejects(const ConstraintSpec& spec, const std::string& text) {
  GrammarMatcher m(compiler().compile(spec));
  for (int32_t t : tok().encode(text)) {
    const bool allowed = bitmask_allows(mask_of(m), t);
    const bool accepted = m.accept_token(t);
    EXPECT_EQ(allowed, accepted) << "mask and accept_token disagree on token " << t;
    if (!accepted) return true;
  }
  return !m.is_completed();
}

/// Samples uniformly among the allowed tokens (seeded) until the matcher terminates; returns the text.
/// With `closers`, half of the steps pick among the allowed tokens containing one of those bytes
/// (so that an open-ended grammar such as any JSON object ends within the step limit).
std::string random_walk(const ConstraintSpec& spec, uint64_t seed, int max_steps = 400, const std::string& closers = "") {
  GrammarMatcher m(compiler().compile(spec));
  std::vector<int32_t> out;
  for (int step = 0; step < max_steps && !m.is_terminated(); ++step) {
    const auto mask = mask_of(m);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < kModelVocab; ++t)
      if (bitmask_allows(mask, t)) allowed.push_back(t);
    EXPECT_FALSE(allowed.empty());
    if (allowed.empty()) break;
    for (int32_t t : allowed) {
      EXPECT_TRUE(t == kEos || !tok().is_special(t)) << "special token " << t << " allowed";
      EXPECT_LT(t, int32_t(tok().vocab_size()));
    }
    std::vector<int32_t> closing;
    for (int32_t t : allowed)
      if (t != kEos && tok().token_bytes(t).find_first_of(closers) != std::string_view::npos) closing.push_back(t);
    if (!closing.empty() && splitmix64_at(seed ^ 0x5555, step) % 2) allowed = closing;
    // Prefer EOS when allowed half of the time, so that open-ended grammars end.
    const int32_t t = (std::find(allowed.begin(), allowed.end(), kEos) != allowed.end() && splitmix64_at(seed, step) % 2)
                          ? kEos
                          : allowed[splitmix64_at(seed ^ 0xabcdef, step) % allowed.size()];
    EXPECT_TRUE(m.accept_token(t));
    if (t != kEos) out.push_back(t);
  }
  EXPECT_TRUE(m.is_terminated()) << "seed " << seed << ": " << tok().decode(out);
  return tok().decode(out);
}

const char* kPerson = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 8},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "role": {"enum": ["admin", "user"]},
  "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "maxItems": 3}},
  "required": ["name", "age", "role"]})";

}  // namespace

TEST(GrammarConstraint, JsonSchemaAcceptsValidDocument) {
  const auto spec = ConstraintSpec::json_schema(kPerson);
  expect_accepts(spec, R"({"name": "Bob", "age": 42, "role": "admin", "tags": ["ab", "c"]})");
  expect_accepts(spec, R"({"name": "", "age": 0, "role": "user"})");
}

TEST(GrammarConstraint, JsonSchemaRejectsInvalidDocuments) {
  const auto spec = ConstraintSpec::json_schema(kPerson);
  EXPECT_TRUE(rejects(spec, R"({"name": 3})"));
  EXPECT_TRUE(rejects(spec, R"({"name": "Bob", "age": 121, "role": "user"})"));
  EXPECT_TRUE(rejects(spec, R"({"name": "Bob", "age": 1, "role": "guest"})"));
  EXPECT_TRUE(rejects(spec, R"({"name": "Bob", "age": 1})"));  // role is required
  EXPECT_TRUE(rejects(spec, R"({"name": "Bob", "age": 1, "role": "user", "x": 1})"));  // strict: no extras
  EXPECT_TRUE(rejects(spec, R"(```json)"));
}

TEST(GrammarConstraint, RandomWalksProduceValidJson) {
  const auto spec = ConstraintSpec::json_schema(kPerson);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const std::string text = random_walk(spec, seed);
    const auto j = nlohmann::json::parse(text);  // throws on invalid JSON
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.at("name").is_string()) << text;
    const std::string name = j["name"].get<std::string>();  // maxLength counts code points
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }), 8)
        << text;
    EXPECT_TRUE(j.at("age").is_number_integer() && j["age"] >= 0 && j["age"] <= 120) << text;
    EXPECT_TRUE(j.at("role") == "admin" || j.at("role") == "user") << text;
    if (j.contains("tags")) {
      for (const auto& t : j["tags"]) {
        EXPECT_TRUE(std::regex_match(t.get<std::string>(), std::regex("[a-z]{1,4}"))) << text;
      }
    }
  }
}

TEST(GrammarConstraint, JsonObjectAllowsOnlyObjects) {
  const auto spec = ConstraintSpec::json_object();
  expect_accepts(spec, R"({"a": [1, 2.5, null, true], "b": {"c": "d"}})");
  EXPECT_TRUE(rejects(spec, "[1]"));
  EXPECT_TRUE(rejects(spec, "\"text\""));
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const std::string text = random_walk(spec, seed, 2000, "\"}]");
    EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
  }
}

TEST(GrammarConstraint, RegexChoiceAndGrammar) {
  const auto re = ConstraintSpec::regex("[0-9]{3}-[a-c]+");
  expect_accepts(re, "123-abc");
  EXPECT_TRUE(rejects(re, "12-a"));
  for (uint64_t seed = 1; seed <= 4; ++seed)
    EXPECT_TRUE(std::regex_match(random_walk(re, seed), std::regex("[0-9]{3}-[a-c]+")));

  const auto ch = ConstraintSpec::choice({"yes", "no", "say \"maybe\"\n"});
  expect_accepts(ch, "yes");
  expect_accepts(ch, "say \"maybe\"\n");
  EXPECT_TRUE(rejects(ch, "yesno"));
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const std::string t = random_walk(ch, seed);
    EXPECT_TRUE(t == "yes" || t == "no" || t == "say \"maybe\"\n") << t;
  }

  const auto g = ConstraintSpec::grammar(R"g(root ::= "(" num ("+" num)* ")"
num ::= [0-9]+)g");
  expect_accepts(g, "(1+23+4)");
  EXPECT_TRUE(rejects(g, "(1+)"));
}

TEST(GrammarConstraint, StructuralTag) {
  const auto spec = ConstraintSpec::structural_tag(R"({"type": "structural_tag", "format": {
    "type": "tag", "begin": "<tool_call>", "content": {"type": "json_schema", "json_schema":
      {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}, "end": "</tool_call>"}})");
  expect_accepts(spec, R"(<tool_call>{"city": "Paris"}</tool_call>)");
  EXPECT_TRUE(rejects(spec, R"(<tool_call>{"town": "Paris"})"));
}

// xgrammar's JSON string rule admits raw control characters; the JSON kinds mask those tokens.
TEST(GrammarConstraint, JsonNeverAllowsRawControlCharacters) {
  for (const auto& spec : {ConstraintSpec::json_object(), ConstraintSpec::json_schema(R"({"type": "string"})")}) {
    GrammarMatcher m(compiler().compile(spec));
    for (int32_t t : tok().encode(spec.kind == ConstraintSpec::Kind::kJsonObject ? "{\"a" : "\"a")) ASSERT_TRUE(m.accept_token(t));
    const auto mask = mask_of(m);  // inside a string
    size_t control = 0, allowed = 0;
    for (int32_t t = 0; t < int32_t(tok().vocab_size()); ++t) {
      if (!bitmask_allows(mask, t)) continue;
      ++allowed;
      for (unsigned char c : tok().token_bytes(t)) control += c < 0x20;
    }
    EXPECT_GT(allowed, 100u);
    EXPECT_EQ(control, 0u);
  }
}

TEST(GrammarConstraint, SpecialAndPaddingIdsNeverAllowed) {
  GrammarMatcher m(compiler().compile(ConstraintSpec::json_object()));
  const auto mask = mask_of(m);
  for (int32_t t : {0, 1, 2, 3004}) EXPECT_FALSE(bitmask_allows(mask, t)) << t;  // specials; EOS: not yet complete
  for (int32_t t = int32_t(tok().vocab_size()); t < kModelVocab; ++t) EXPECT_FALSE(bitmask_allows(mask, t)) << t;
  EXPECT_TRUE(bitmask_allows(mask, tok().encode("{")[0]));
}

TEST(GrammarConstraint, RollbackRestoresState) {
  GrammarMatcher m(compiler().compile(ConstraintSpec::regex("ab|ac")));
  const auto a = tok().encode("a"), b = tok().encode("b"), c = tok().encode("c");
  ASSERT_EQ(a.size(), 1u);
  const auto before = mask_of(m);
  ASSERT_TRUE(m.accept_token(a[0]));
  const auto after_a = mask_of(m);
  ASSERT_TRUE(m.accept_token(b[0]));
  ASSERT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token(kEos));  // terminated: nothing more
  m.rollback(2);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_EQ(m.num_accepted(), 1);
  EXPECT_EQ(mask_of(m), after_a);
  EXPECT_TRUE(m.accept_token(c[0]));
  EXPECT_THROW(m.rollback(3), Error);
  m.reset();
  EXPECT_EQ(mask_of(m), before);
}

TEST(GrammarConstraint, UncompilableSpecsNameTheProblem) {
  auto message = [](const ConstraintSpec& s) -> std::string {
    try {
      compiler().compile(s);
    } catch (const ConstraintError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(ConstraintSpec::json_schema("{not json")).find("invalid json_schema"), std::string::npos);
  EXPECT_NE(message(ConstraintSpec::json_schema(R"({"type": "frobnicate"})")).find("invalid json_schema"),
            std::string::npos);
  EXPECT_NE(message(ConstraintSpec::regex("(ab")).find("invalid regex"), std::string::npos);
  EXPECT_NE(message(ConstraintSpec::grammar("root ::= missing_rule")).find("invalid grammar"), std::string::npos);
  EXPECT_NE(message(ConstraintSpec::choice({})).find("invalid choice"), std::string::npos);
  EXPECT_NE(message(ConstraintSpec::structural_tag(R"({"type": "nope"})")).find("invalid structural_tag"),
            std::string::npos);
}

TEST(GrammarConstraint, CompileIsCachedAndVocabChecked) {
  const auto s = ConstraintSpec::regex("x+");
  EXPECT_EQ(compiler().compile(s), compiler().compile(s));
  EXPECT_EQ(compiler().vocab_size(), kModelVocab);
  EXPECT_THROW(GrammarCompiler(tok(), 100, {200}), Error);  // stop id outside the vocabulary
  EXPECT_THROW(GrammarMatcher(nullptr), Error);
}

TEST(TokenBitmask, ApplyMasksExactlyTheClearBits) {
  const int64_t V = 70;
  std::vector<float> logits(V);
  for (int64_t i = 0; i < V; ++i) logits[size_t(i)] = float(i);
  std::vector<uint32_t> mask(size_t(bitmask_words(V)), 0u);
  EXPECT_EQ(mask.size(), 3u);
  for (int t : {0, 31, 32, 69}) mask[size_t(t / 32)] |= 1u << (t % 32);
  mask[1] = ~0u;  // a full word: 32..63 all allowed
  apply_token_bitmask(logits, mask);
  for (int64_t i = 0; i < V; ++i) {
    const bool allowed = i == 0 || i == 31 || (i >= 32 && i < 64) || i == 69;
    EXPECT_EQ(std::isinf(logits[size_t(i)]), !allowed) << i;
    EXPECT_EQ(bitmask_allows(mask, int32_t(i)), allowed) << i;
  }
  EXPECT_FALSE(bitmask_allows(mask, 96));
  EXPECT_FALSE(bitmask_allows(mask, -1));
  std::vector<uint32_t> short_mask(2);
  EXPECT_THROW(apply_token_bitmask(logits, short_mask), Error);
}

TEST(GrammarConstraint, BatchFillEqualsOneByOne) {
  const int64_t W = bitmask_words(kModelVocab);
  std::vector<GrammarMatcher> ms;
  const auto schema = compiler().compile(ConstraintSpec::json_schema(kPerson));
  const auto regex = compiler().compile(ConstraintSpec::regex("[0-9]{3}-[a-c]+"));
  for (int i = 0; i < 9; ++i) ms.emplace_back(i % 2 ? schema : regex);
  // Different states: row i advanced by i tokens of a valid document; row 8 terminated.
  const auto doc = tok().encode(R"({"name": "Bob", "age": 42, "role": "admin"})"), num = tok().encode("123-abc");
  for (int i = 0; i < 8; ++i) {
    const auto& src = i % 2 ? doc : num;
    for (size_t k = 0; k < std::min(size_t(i), src.size()); ++k) ASSERT_TRUE(ms[size_t(i)].accept_token(src[k]));
  }
  for (int32_t t : num) ms[8].accept_token(t);
  ASSERT_TRUE(ms[8].accept_token(kEos));
  std::vector<GrammarMatcher*> ptrs;
  for (auto& m : ms) ptrs.push_back(&m);
  std::vector<uint32_t> batched(ms.size() * size_t(W)), single(ms.size() * size_t(W));
  fill_next_token_bitmasks(ptrs, batched, 4);
  for (size_t i = 0; i < ms.size(); ++i) ms[i].fill_next_token_bitmask({single.data() + i * size_t(W), size_t(W)});
  EXPECT_EQ(batched, single);
  std::vector<uint32_t> wrong(3);
  EXPECT_THROW(fill_next_token_bitmasks(ptrs, wrong, 4), Error);
}
