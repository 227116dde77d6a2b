// Tokenizer tests: byte-identical agreement with Hugging Face `tokenizers` on a 2,200-string
// corpus for two tokenizers (SmolLM2's, and a small BPE trained with Qwen3.5's normalizer and
// pre-tokenizer), written by scripts/make_tokenizer_fixtures.py; plus unit tests of the pieces.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "text/unicode.h"
#include "fixture_util.h"

namespace moefold {
namespace {

using json = nlohmann::json;
const std::filesystem::path kFixtures =
    moefold::test::kFixtures / "tokenizer";

std::vector<json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << "missing fixture " << p << " (run scripts/make_tokenizer_fixtures.py)";
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> t;
    for (const auto& j : read_jsonl(kFixtures / "corpus.jsonl")) t.push_back(j.at("text"));
    return t;
  }();
  return texts;
}

struct Expected {
  std::vector<int32_t> ids;
  std::optional<std::string> decoded, decoded_skip;
};

std::vector<Expected> expected(const std::string& name) {
  std::vector<Expected> out;
  for (const auto& j : read_jsonl(kFixtures / name / "expected.jsonl")) {
    Expected e;
    e.ids = j.at("ids").get<std::vector<int32_t>>();
    if (j.contains("decoded")) e.decoded = j["decoded"].get<std::string>();
    if (j.contains("decoded_skip")) e.decoded_skip = j["decoded_skip"].get<std::string>();
    out.push_back(std::move(e));
  }
  return out;
}

std::string show(std::span<const int32_t> ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

// GPT-2 byte alphabet, written out independently of the implementation.
std::string byte_symbol(int b) {
  int cp = b;
  if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    int n = 0;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  unicode::append_utf8(s, static_cast<char32_t>(cp));
  return s;
}

// ------------------------------------------------------------------------------------------
// Reference agreement, per fixture tokenizer
// ------------------------------------------------------------------------------------------
class Reference : public ::testing::TestWithParam<std::string> {
 protected:
  static Tokenizer load(const std::string& name) { return Tokenizer::from_file(kFixtures / name); }
};

TEST_P(Reference, CorpusIsLargeAndAligned) {
  const auto exp = expected(GetParam());
  EXPECT_GE(corpus().size(), 2000u);
  EXPECT_EQ(exp.size(), corpus().size());
}

TEST_P(Reference, EncodeMatchesTokenizersForEveryString) {
  const Tokenizer tok = load(GetParam());
  const auto exp = expected(GetParam());
  ASSERT_EQ(exp.size(), corpus().size());
  size_t bad = 0;
  for (size_t i = 0; i < exp.size(); ++i) {
    const auto ids = tok.encode(corpus()[i]);
    if (ids != exp[i].ids && ++bad <= 10) {
      ADD_FAILURE() << "line " << i + 1 << " text " << json(corpus()[i]).dump() << "\n ours "
                    << show(ids) << "\n want " << show(exp[i].ids);
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << exp.size();
}

TEST_P(Reference, DecodeMatchesTokenizersForEveryString) {
  const Tokenizer tok = load(GetParam());
  const auto exp = expected(GetParam());
  size_t bad = 0;
  for (size_t i = 0; i < exp.size(); ++i) {
    const std::string& want = exp[i].decoded ? *exp[i].decoded : corpus()[i];
    const std::string& want_skip = exp[i].decoded_skip ? *exp[i].decoded_skip : want;
    const std::string got = tok.decode(exp[i].ids);
    const std::string got_skip = tok.decode(exp[i].ids, /*skip_special_tokens=*/true);
    if ((got != want || got_skip != want_skip) && ++bad <= 10) {
      ADD_FAILURE() << "line " << i + 1 << "\n ours " << json(got).dump() << " / "
                    << json(got_skip).dump() << "\n want " << json(want).dump() << " / "
                    << json(want_skip).dump();
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Random id sequences (mostly single bytes, so UTF-8 is often broken): U+FFFD replacement and
// special-token skipping agree with `tokenizers`.
TEST_P(Reference, DecodeOfRandomIdsMatchesTokenizers) {
  const Tokenizer tok = load(GetParam());
  const auto cases = read_jsonl(kFixtures / GetParam() / "random_ids.jsonl");
  ASSERT_GE(cases.size(), 100u);
  size_t replaced = 0;
  for (const auto& c : cases) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const std::string want = c.at("decoded"), want_skip = c.at("decoded_skip");
    ASSERT_EQ(tok.decode(ids), want) << show(ids);
    ASSERT_EQ(tok.decode(ids, true), want_skip) << show(ids);
    replaced += want.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(replaced, cases.size() / 4);
}

// decode(encode(s)) reproduces s, or NFC(s) for the NFC tokenizer, whenever every byte of s
// has a token (SmolLM2's vocabulary lacks a few control bytes and unused UTF-8 lead bytes,
// which BPE then drops, as `tokenizers` does), and no added token strips whitespace.
TEST_P(Reference, RoundTripIsIdentityUpToNormalisation) {
  const Tokenizer tok = load(GetParam());
  const bool nfc = GetParam() == "qwen35_mini";
  std::array<bool, 256> has_byte{};
  for (int b = 0; b < 256; ++b) has_byte[b] = tok.token_to_id(byte_symbol(b)).has_value();
  size_t checked = 0;
  for (const auto& s : corpus()) {
    if (s.find("<|mask|>") != std::string::npos) continue;  // lstrip/rstrip eat spaces
    const bool all_bytes = std::all_of(s.begin(), s.end(), [&](char c) {
      return has_byte[static_cast<uint8_t>(c)];
    });
    if (!all_bytes) continue;
    const std::string want = nfc ? unicode::normalize(s, unicode::NormalForm::kNFC) : s;
    ASSERT_EQ(tok.decode(tok.encode(s)), want) << json(s).dump();
    ++checked;
  }
  EXPECT_GE(checked, corpus().size() - 40);
}

TEST_P(Reference, EncodesTheCorpusWellUnderASecond) {
  const Tokenizer tok = load(GetParam());  // fresh: empty cache
  size_t n_ids = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : corpus()) n_ids += tok.encode(s).size();
  const double cold = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t1 = std::chrono::steady_clock::now();
  for (const auto& s : corpus()) n_ids += tok.encode(s).size();
  const double warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("[ perf ] %s: %zu strings, cold %.1f ms, warm %.1f ms, cache %zu words\n",
              GetParam().c_str(), corpus().size(), cold * 1e3, warm * 1e3, tok.cache_size());
  EXPECT_LT(cold, 1.0);
  EXPECT_GT(tok.cache_size(), 0u);
}

TEST_P(Reference, ConcurrentEncodeAgrees) {
  const Tokenizer tok = load(GetParam());
  const auto exp = expected(GetParam());
  std::vector<size_t> bad(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < exp.size(); i += 1) {
        if (tok.encode(corpus()[i]) != exp[i].ids) ++bad[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad[0] + bad[1], 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Reference, ::testing::Values("smollm2", "qwen35_mini"));

// Small BPEs whose pipelines use the components the two model tokenizers do not (see
// make_tokenizer_fixtures.py); encoded with add_special_tokens=true.
class Variant : public ::testing::TestWithParam<std::string> {};

TEST_P(Variant, EncodeAndDecodeMatchTokenizers) {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / "variants" / (GetParam() + ".json"));
  const auto cases = read_jsonl(kFixtures / "variants" / (GetParam() + ".expected.jsonl"));
  ASSERT_GE(cases.size(), 200u);
  size_t bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto want = cases[i].at("ids").get<std::vector<int32_t>>();
    const std::string& text = corpus().at(cases[i].at("line").get<size_t>());
    const auto ids = tok.encode(text, /*add_special_tokens=*/true);
    if (ids != want && ++bad <= 10) {
      ADD_FAILURE() << "text " << json(text).dump() << "\n ours "
                    << show(ids) << "\n want " << show(want);
    }
    const std::string dec = cases[i].value("decoded", text);
    EXPECT_EQ(tok.decode(want), dec);
    EXPECT_EQ(tok.decode(want, true), cases[i].value("decoded_skip", dec));
  }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Variant,
                         ::testing::Values("merged_lower", "removed_invert", "ignore_merges"));

// ------------------------------------------------------------------------------------------
// Specific behaviour
// ------------------------------------------------------------------------------------------
TEST(Tokenizer, LoadsFromDirectoryOrFile) {
  const Tokenizer a = Tokenizer::from_file(kFixtures / "smollm2");
  const Tokenizer b = Tokenizer::from_file(kFixtures / "smollm2" / "tokenizer.json");
  EXPECT_EQ(a.vocab_size(), 49152u);
  EXPECT_EQ(a.encode("Hello world"), b.encode("Hello world"));
  EXPECT_THROW(Tokenizer::from_file(kFixtures / "no_such_dir"), Error);
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
}

TEST(Tokenizer, SpecialTokensAndVocabularyLookups) {
  const Tokenizer q = Tokenizer::from_file(kFixtures / "qwen35_mini");
  const int32_t im_start = q.token_to_id("<|im_start|>").value();
  const int32_t im_end = q.token_to_id("<|im_end|>").value();
  const int32_t think = q.token_to_id("<think>").value();
  EXPECT_TRUE(q.is_special(im_start));
  EXPECT_TRUE(q.is_special(im_end));
  EXPECT_FALSE(q.is_special(think));  // <think> is an added, non-special token (as in Qwen)
  EXPECT_EQ(q.id_to_token(im_end), "<|im_end|>");
  EXPECT_FALSE(q.token_to_id("<|no_such_token|>").has_value());
  EXPECT_EQ(q.vocab_size(), 3005u);

  const auto ids = q.encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids.back(), im_end);
  EXPECT_EQ(q.decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(q.decode(ids, /*skip_special_tokens=*/true), "user\nhi");
  // Non-special added tokens survive skip_special_tokens.
  EXPECT_EQ(q.decode(q.encode("<think>x</think>"), true), "<think>x</think>");
  // A partial special token is ordinary text.
  EXPECT_EQ(q.decode(q.encode("<|im_sta")), "<|im_sta");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 1);

  // Byte-level spelling of ordinary tokens ("Ġ" = space).
  const Tokenizer s = Tokenizer::from_file(kFixtures / "smollm2");
  const auto hello = s.encode(" Hello");
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(s.id_to_token(hello[0]), "\xC4\xA0Hello");
  EXPECT_EQ(s.token_bytes(hello[0]), " Hello");
  EXPECT_EQ(s.encode("<|im_end|>"), std::vector<int32_t>{2});
}

TEST(Tokenizer, PostProcessorsOfTheModelsAddNothing) {
  // SmolLM2's post_processor is ByteLevel (offsets only); the Qwen-style file has none.
  for (const char* name : {"smollm2", "qwen35_mini"}) {
    const Tokenizer t = Tokenizer::from_file(kFixtures / name);
    for (const char* text : {"Hello world", "<|im_start|>user\nhi<|im_end|>", ""}) {
      EXPECT_EQ(t.encode(text, true), t.encode(text, false)) << name << " " << text;
    }
  }
}

TEST(Tokenizer, LongInputsStayFast) {
  const Tokenizer q = Tokenizer::from_file(kFixtures / "qwen35_mini");
  std::string big;
  while (big.size() < (1u << 20)) {
    for (const auto& s : corpus()) big += s;
  }
  big = big.substr(0, 1u << 20);
  // Cut at a character boundary.
  big.resize(unicode::valid_prefix_length(big));
  const std::string spaces(200000, ' '), letters(200000, 'a');
  const auto t0 = std::chrono::steady_clock::now();
  const auto a = q.encode(big);
  const auto b = q.encode(spaces + "x");
  const auto c = q.encode(letters);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ perf ] 1 MiB corpus text -> %zu ids, 200k spaces, 200k letters: %.0f ms\n", a.size(),
              secs * 1e3);
  EXPECT_LT(secs, 3.0);
  EXPECT_EQ(q.decode(b), spaces + "x");
  EXPECT_EQ(q.decode(c), letters);
}

TEST(Tokenizer, AddedTokenFlags) {
  const Tokenizer q = Tokenizer::from_file(kFixtures / "qwen35_mini");
  const int32_t mask = q.token_to_id("<|mask|>").value();    // lstrip + rstrip
  const int32_t word = q.token_to_id("[WORD]").value();      // single_word
  const int32_t cafe = q.token_to_id("caf\u00e9\u2615").value();  // normalized=true
  auto count = [](const std::vector<int32_t>& v, int32_t id) {
    return std::count(v.begin(), v.end(), id);
  };
  // lstrip/rstrip: surrounding whitespace belongs to the token.
  EXPECT_EQ(q.decode(q.encode("x <|mask|>  y")), "x<|mask|>y");
  // single_word: only matched between non-word characters.
  EXPECT_EQ(count(q.encode("a [WORD] b"), word), 1);
  EXPECT_EQ(count(q.encode("a[WORD]b"), word), 0);
  // normalized: matched after NFC, so the decomposed spelling matches too.
  EXPECT_EQ(count(q.encode("x cafe\u0301\u2615 y"), cafe), 1);
  EXPECT_EQ(count(q.encode("x caf\u00e9\u2615 y"), cafe), 1);
  EXPECT_EQ(count(q.encode("<|mask|>"), mask), 1);
}

TEST(Tokenizer, InvalidUtf8IsRejected) {
  const Tokenizer q = Tokenizer::from_file(kFixtures / "qwen35_mini");
  for (const std::string& bad : {std::string("\xFF"), std::string("abc\xC3"),
                                std::string("\xED\xA0\x80"),       // surrogate
                                std::string("\xC0\xAF"),           // overlong
                                std::string("\xF4\x90\x80\x80"),   // > U+10FFFF
                                std::string("ok\x80ok")}) {
    try {
      q.encode(bad);
      ADD_FAILURE() << "no error for a " << bad.size() << "-byte input";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("byte offset"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(q.encode(std::string("nul\0inside", 10)));
}

TEST(Tokenizer, DecodeRejectsUnknownIdsAndReplacesBrokenUtf8) {
  const Tokenizer s = Tokenizer::from_file(kFixtures / "smollm2");
  const std::vector<int32_t> bad_id{49152};
  EXPECT_THROW(s.decode(bad_id), Error);
  const std::vector<int32_t> neg{-1};
  EXPECT_THROW(s.decode(neg), Error);
  EXPECT_THROW(s.id_to_token(1 << 30), Error);
  // "ꙮ" (EA 99 AE) is three byte tokens; a broken character decodes to U+FFFD per maximal
  // subpart, as `tokenizers` does.
  const std::string r = "\xEF\xBF\xBD";
  const auto e = s.encode("\xEA\x99\xAE");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(s.decode(std::vector<int32_t>{e[0]}), r);
  EXPECT_EQ(s.decode(std::vector<int32_t>{e[0], e[1]}), r);
  EXPECT_EQ(s.decode(std::vector<int32_t>{e[1], e[0]}), r + r);
  EXPECT_EQ(s.decode(std::vector<int32_t>{e[0], 2, e[1], e[2]}), r + "<|im_end|>" + r + r);
  EXPECT_EQ(s.decode(std::vector<int32_t>{e[0], 2, e[1], e[2]}, true), "\xEA\x99\xAE");
}

// A tiny tokenizer built in the test: all 256 byte symbols plus merges, to check both merge
// spellings, the post-processor, and unsupported components.
json tiny(json merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  int next = 256;
  for (const char* t : {"ab", "abc", "\xC4\xA0" "ab", "cc"}) vocab[t] = next++;
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({json{{"id", 300}, {"content", "<s>"}, {"single_word", false},
                                         {"lstrip", false}, {"rstrip", false},
                                         {"normalized", false}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"dropout", nullptr},
        {"unk_token", nullptr}}}};
}

TEST(Tokenizer, MergeFormatsRanksPrefixSpaceAndPostProcessor) {
  const std::string sp = "\xC4\xA0";  // "Ġ", the symbol of the space byte (id 32 here)
  const Tokenizer strings = Tokenizer::from_json(
      tiny(json::array({"a b", "ab c", sp + " ab", "c c"})).dump());
  const Tokenizer pairs = Tokenizer::from_json(
      tiny(json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                        json::array({sp, "ab"}), json::array({"c", "c"})}))
          .dump());
  const Tokenizer swapped = Tokenizer::from_json(
      tiny(json::array({"a b", sp + " ab", "ab c", "c c"})).dump());
  using V = std::vector<int32_t>;
  // add_prefix_space turns "abc" into " abc" = Ġ a b c; "a b" first, then "ab c" (rank 1)
  // beats "Ġ ab" (rank 2).
  EXPECT_EQ(strings.encode("abc"), (V{32, 257}));
  EXPECT_EQ(pairs.encode("abc"), (V{32, 257}));
  // With the ranks of "ab c" and "Ġ ab" swapped, the other merge wins.
  EXPECT_EQ(swapped.encode("abc"), (V{258, 'c'}));
  // Equal ranks merge leftmost first: Ġ c c c -> Ġ cc c.
  EXPECT_EQ(strings.encode("ccc"), (V{32, 259, 'c'}));
  // TemplateProcessing adds <s> only with add_special_tokens.
  EXPECT_EQ(strings.encode("abc", /*add_special_tokens=*/true), (V{300, 32, 257}));
  EXPECT_EQ(strings.decode(strings.encode("x ccab")), " x ccab");
}

TEST(Tokenizer, UnsupportedComponentsFailClearly) {
  auto with = [](const char* key, json value) {
    json j = tiny(json::array({"a b"}));
    j[key] = std::move(value);
    return j.dump();
  };
  auto message = [](const std::string& text) {
    try {
      Tokenizer::from_json(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message(with("pre_tokenizer", {{"type", "Metaspace"}})).find("Metaspace"),
            std::string::npos);
  EXPECT_NE(message(with("decoder", {{"type", "WordPiece"}})).find("WordPiece"), std::string::npos);
  EXPECT_NE(message(with("normalizer", {{"type", "BertNormalizer"}})).find("BertNormalizer"),
            std::string::npos);
  json wp = tiny(json::array({"a b"}));
  wp["model"]["type"] = "WordPiece";
  EXPECT_NE(message(wp.dump()).find("WordPiece"), std::string::npos);
  json bad_merge = tiny(json::array({"a q"}));
  bad_merge["model"]["merges"] = json::array({"x y"});
  EXPECT_NE(message(bad_merge.dump()).find("missing from the vocabulary"), std::string::npos);
}

// ------------------------------------------------------------------------------------------
// Unicode helpers
// ------------------------------------------------------------------------------------------
TEST(Unicode, LossyDecodingReplacesMaximalSubparts) {
  // The example of the Unicode Standard, section 3.9 (U+FFFD substitution of maximal subparts).
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::decode_lossy(in), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(unicode::decode_lossy("\xE2\x82"), r);  // truncated at the end: one U+FFFD
  EXPECT_EQ(unicode::decode_lossy("\xF0\x80\x80"), r + r + r);  // F0 80: not a prefix
  EXPECT_EQ(unicode::decode_lossy("plain é"), "plain é");
}

TEST(Unicode, IncompleteTail) {
  EXPECT_EQ(unicode::incomplete_tail_length(""), 0u);
  EXPECT_EQ(unicode::incomplete_tail_length("abc"), 0u);
  EXPECT_EQ(unicode::incomplete_tail_length("a\xE2"), 1u);
  EXPECT_EQ(unicode::incomplete_tail_length("a\xE2\x82"), 2u);
  EXPECT_EQ(unicode::incomplete_tail_length("a\xE2\x82\xAC"), 0u);
  EXPECT_EQ(unicode::incomplete_tail_length("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(unicode::incomplete_tail_length("\xF0\x80"), 0u);  // can never complete
  EXPECT_EQ(unicode::incomplete_tail_length("\x80"), 0u);
  EXPECT_EQ(unicode::incomplete_tail_length("\xED\xA0"), 0u);  // surrogate: never valid
}

TEST(Unicode, NormalForms) {
  EXPECT_EQ(unicode::normalize("e\xCC\x81", unicode::NormalForm::kNFC), "\xC3\xA9");
  EXPECT_EQ(unicode::normalize("\xC3\xA9", unicode::NormalForm::kNFD), "e\xCC\x81");
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81", unicode::NormalForm::kNFKC), "fi");
  EXPECT_EQ(unicode::normalize("\xE2\x84\xAB", unicode::NormalForm::kNFC), "\xC3\x85");  // Å sign
  // U+1AC1 (Unicode 14, combining class 230) is unknown to `tokenizers`' tables: it stays an
  // inert starter there, so U+0323 is neither reordered before it nor composed with "a".
  EXPECT_EQ(unicode::normalize("a\xE1\xAB\x81\xCC\xA3", unicode::NormalForm::kNFC),
            "a\xE1\xAB\x81\xCC\xA3");
  EXPECT_EQ(unicode::normalize("a\xCC\xA3", unicode::NormalForm::kNFC), "\xE1\xBA\xA1");
}

TEST(Unicode, LowercaseIsPerCodePointFullMapping) {
  // U+0130 -> "i" U+0307; sigma is not context-sensitive; U+01C5 (title case) -> U+01C6.
  EXPECT_EQ(unicode::lowercase("\xC4\xB0\xCE\xA3\xCE\x91\xCE\xA3 \xC7\x85"),
            "i\xCC\x87\xCF\x83\xCE\xB1\xCF\x83 \xC7\x86");
}

}  // namespace
}  // namespace moefold
