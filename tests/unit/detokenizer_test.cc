// Streaming detokenizer: for every corpus string of both fixture tokenizers, feeding the ids one
// at a time yields chunks that are each valid UTF-8 and concatenate (with flush) to exactly
// Tokenizer::decode of all ids; plus hand-made streams with split and broken characters.
#include "text/detokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "text/unicode.h"
#include "fixture_util.h"

namespace moefold {
namespace {

using json = nlohmann::json;
const std::filesystem::path kFixtures =
    moefold::test::kFixtures / "tokenizer";

std::vector<std::vector<int32_t>> expected_ids(const std::string& name) {
  std::ifstream in(kFixtures / name / "expected.jsonl", std::ios::binary);
  EXPECT_TRUE(in) << "missing fixture (run scripts/make_tokenizer_fixtures.py)";
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line).at("ids").get<std::vector<int32_t>>());
  }
  return out;
}

bool valid_utf8(std::string_view s) { return unicode::valid_prefix_length(s) == s.size(); }

// Streams `ids` one at a time and checks the invariants; returns false on the first violation.
::testing::AssertionResult stream_matches(const Tokenizer& tok, std::span<const int32_t> ids,
                                          bool skip_special) {
  Detokenizer d(tok, skip_special);
  std::string all;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = d.feed(ids[i]);
    if (!valid_utf8(chunk)) {
      return ::testing::AssertionFailure() << "chunk " << i << " is not valid UTF-8";
    }
    if (d.pending_bytes() > 3) return ::testing::AssertionFailure() << "holds > 3 bytes";
    all += chunk;
  }
  const std::string tail = d.flush();
  if (!valid_utf8(tail)) return ::testing::AssertionFailure() << "flush is not valid UTF-8";
  all += tail;
  const std::string want = tok.decode(ids, skip_special);
  if (all != want) {
    return ::testing::AssertionFailure()
           << "stream " << json(all).dump() << " != decode " << json(want).dump();
  }
  return ::testing::AssertionSuccess();
}

class Streaming : public ::testing::TestWithParam<std::string> {};

TEST_P(Streaming, OneTokenAtATimeEqualsDecodeForEveryCorpusString) {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / GetParam());
  const auto all = expected_ids(GetParam());
  ASSERT_GE(all.size(), 2000u);
  size_t split_chars = 0;
  for (const auto& ids : all) {
    ASSERT_TRUE(stream_matches(tok, ids, false));
    ASSERT_TRUE(stream_matches(tok, ids, true));
    for (int32_t id : ids) split_chars += !valid_utf8(tok.token_bytes(id));
  }
  // The corpus must actually exercise characters split across tokens.
  EXPECT_GT(split_chars, 100u);
}

// Random id sequences: arbitrary byte soup, including ill-formed UTF-8 and special tokens.
TEST_P(Streaming, RandomIdSequencesEqualDecode) {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / GetParam());
  std::mt19937 rng(7);
  // Mostly single-byte tokens (ids of the 256 byte symbols are spread over the vocabulary),
  // so that broken and partial characters are common.
  std::vector<int32_t> byte_ids, any_ids;
  for (size_t id = 0; id < tok.vocab_size(); ++id) {
    const auto b = tok.token_bytes(static_cast<int32_t>(id));
    any_ids.push_back(static_cast<int32_t>(id));
    if (b.size() == 1) byte_ids.push_back(static_cast<int32_t>(id));
  }
  ASSERT_GT(byte_ids.size(), 200u);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ids(rng() % 12);
    for (auto& id : ids) {
      id = (rng() % 4 == 0) ? any_ids[rng() % any_ids.size()] : byte_ids[rng() % byte_ids.size()];
    }
    ASSERT_TRUE(stream_matches(tok, ids, trial % 2 == 0)) << "trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Streaming, ::testing::Values("smollm2", "qwen35_mini"));

TEST(Detokenizer, HoldsBackASplitCharacter) {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / "smollm2");
  const auto ids = tok.encode("\xF0\x9F\x98\x80!");  // U+1F600 then "!"
  ASSERT_GE(ids.size(), 2u);
  Detokenizer d(tok);
  std::string out;
  size_t empty_chunks = 0;
  for (int32_t id : ids) {
    const std::string c = d.feed(id);
    empty_chunks += c.empty();
    out += c;
  }
  EXPECT_GT(empty_chunks, 0u);  // the emoji's bytes arrive in pieces: nothing emitted early
  EXPECT_EQ(out, "\xF0\x9F\x98\x80!");
  EXPECT_EQ(d.flush(), "");
}

TEST(Detokenizer, FlushReplacesAnUnfinishedCharacterAndResets) {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / "smollm2");
  const auto ids = tok.encode("\xEA\x99\xAE");  // "ꙮ": three single-byte tokens
  ASSERT_EQ(ids.size(), 3u);
  Detokenizer d(tok);
  EXPECT_EQ(d.feed(ids[0]), "");
  EXPECT_GT(d.pending_bytes(), 0u);
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(d.feed(tok.encode("ok")), "ok");  // a fresh stream after flush
  // An unknown id throws and leaves the state untouched.
  EXPECT_EQ(d.feed(ids[0]), "");
  const size_t held = d.pending_bytes();
  EXPECT_THROW(d.feed(1 << 30), Error);
  EXPECT_EQ(d.pending_bytes(), held);
  d.reset();
  EXPECT_EQ(d.pending_bytes(), 0u);
}

TEST(Detokenizer, SkipsSpecialTokensOnlyWhenAsked) {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / "qwen35_mini");
  const auto ids = tok.encode("<|im_start|>assistant\n<think>\nok\n</think>\n\nHi!<|im_end|>");
  Detokenizer keep(tok), skip(tok, /*skip_special_tokens=*/true);
  std::string a, b;
  for (int32_t id : ids) {
    a += keep.feed(id);
    b += skip.feed(id);
  }
  a += keep.flush();
  b += skip.flush();
  EXPECT_EQ(a, "<|im_start|>assistant\n<think>\nok\n</think>\n\nHi!<|im_end|>");
  EXPECT_EQ(b, "assistant\n<think>\nok\n</think>\n\nHi!");
}

}  // namespace
}  // namespace moefold
