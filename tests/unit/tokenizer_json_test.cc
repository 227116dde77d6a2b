// tokenizer.json loading of untrusted files: malformed ids are errors naming the part of the file,
// never silently truncated or converted with undefined behaviour (found by fuzz_tokenizer,
// fuzz/corpus/tokenizer/regress_float_token_id.json; docs/fuzzing.md).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixture_util.h"
#include "core/error.h"
#include "text/tokenizer.h"

using namespace moefold;
using json = nlohmann::json;

namespace {

json variant() {
  std::ifstream f(moefold::test::kSourceDir.string() + "/tests/fixtures/tokenizer/variants/ignore_merges.json");
  return json::parse(f);
}

std::string error_of(const json& j) {
  try {
    Tokenizer::from_json(j.dump());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerJson, TheFixtureLoads) { EXPECT_EQ(error_of(variant()), ""); }

TEST(TokenizerJson, NonIntegerOrHugeVocabIdsAreErrors) {
  const std::string first = variant()["model"]["vocab"].begin().key();
  for (json bad : {json(1.5), json(1.2e43), json(int64_t(1) << 40), json("7")}) {
    json j = variant();
    j["model"]["vocab"][first] = bad;
    std::string msg = error_of(j);
    EXPECT_NE(msg.find("model.vocab: token id"), std::string::npos) << bad.dump() << ": " << msg;
  }
}

TEST(TokenizerJson, NonIntegerAddedTokenIdsAreErrors) {
  json j = variant();
  j["added_tokens"] = json::array({{{"id", 3.25}, {"content", "<x>"}}});
  EXPECT_NE(error_of(j).find("added_tokens: token id must be an integer, not 3.25"), std::string::npos) << error_of(j);
  j["added_tokens"] = json::array({{{"id", uint64_t(1) << 63}, {"content", "<x>"}}});
  EXPECT_NE(error_of(j).find("added_tokens: token id 9223372036854775808 is too large"), std::string::npos)
      << error_of(j);
}

}  // namespace
