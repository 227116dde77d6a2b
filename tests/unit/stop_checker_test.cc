// Tests of streaming stop handling (runtime/stop_checker.h): stop strings over chunked text,
// hold-back of possible stop-string prefixes, UTF-8 integrity, stop tokens and max_tokens.
#include "runtime/stop_checker.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace moefold {
namespace {

/// Feeds `chunks` to a fresh filter; returns every released piece (final flush included if no
/// stop string matched) and checks the no-leak property after every chunk: the text released
/// so far is always a prefix of `final_text`, the expected complete output.
struct Fed {
  std::vector<std::string> pieces;
  std::string text;
  std::optional<size_t> matched;
};
Fed feed(const std::vector<std::string>& stops, const std::vector<std::string>& chunks,
         const std::string& final_text) {
  StopStringFilter f(stops);
  Fed out;
  for (const std::string& c : chunks) {
    StopStringFilter::Result r = f.push(c);
    out.pieces.push_back(r.text);
    out.text += r.text;
    EXPECT_EQ(final_text.compare(0, out.text.size(), out.text), 0)
        << "released \"" << out.text << "\" is not a prefix of \"" << final_text << "\"";
    if (r.matched) {
      out.matched = r.matched;
      EXPECT_TRUE(f.stopped());
      EXPECT_EQ(f.flush(), "");
      return out;
    }
  }
  std::string rest = f.flush();
  out.pieces.push_back(rest);
  out.text += rest;
  return out;
}

/// Reference: the output for the whole text, by definition (earliest-ending occurrence, ties
/// earliest start; text before it).
std::string reference(const std::vector<std::string>& stops, const std::string& text,
                      std::optional<size_t>* which = nullptr) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best_start = std::string::npos, best = 0;
    for (size_t k = 0; k < stops.size(); ++k) {
      const std::string& s = stops[k];
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0 &&
          end - s.size() < best_start) {
        best_start = end - s.size();
        best = k;
      }
    }
    if (best_start != std::string::npos) {
      if (which) *which = best;
      return text.substr(0, best_start);
    }
  }
  if (which) *which = std::nullopt;
  return text;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t j = 1; j < n; ++j)
      if ((static_cast<unsigned char>(s[i + j]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// ----- StopStringFilter ----------------------------------------------------------------------

TEST(StopStringFilter, NoStopStringsReleasesEverythingImmediately) {
  StopStringFilter f({});
  EXPECT_EQ(f.push("Hello").text, "Hello");
  EXPECT_EQ(f.push(", wor").text, ", wor");
  EXPECT_EQ(f.push("").text, "");
  EXPECT_EQ(f.push("ld ✓").text, "ld ✓");
  EXPECT_EQ(f.held_bytes(), 0u);
  EXPECT_EQ(f.flush(), "");
}

TEST(StopStringFilter, StopStringSpreadOverChunksNeverLeaks) {
  const std::vector<std::string> stops = {"<|end|>"};
  const Fed r = feed(stops, {"Answer: 42", "<", "|e", "nd", "|", ">", " trailing"}, "Answer: 42");
  EXPECT_EQ(r.text, "Answer: 42");
  EXPECT_EQ(r.matched, 0u);
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"Answer: 42", "", "", "", "", ""}));
}

TEST(StopStringFilter, StopStringStartingInsideAChunk) {
  const Fed r = feed({"STOP"}, {"Hello wor", "ld STOP and more", "never seen"}, "Hello world ");
  EXPECT_EQ(r.text, "Hello world ");
  EXPECT_EQ(r.pieces.size(), 2u);
  EXPECT_EQ(r.matched, 0u);
}

TEST(StopStringFilter, HeldPrefixIsReleasedWhenItDiverges) {
  StopStringFilter f({"<|end|>"});
  EXPECT_EQ(f.push("a <|e").text, "a ");
  EXPECT_EQ(f.held_bytes(), 3u);
  EXPECT_EQ(f.push("x").text, "<|ex");
  EXPECT_EQ(f.push("<").text, "");
  EXPECT_EQ(f.flush(), "<");  // end of generation: the held text is final output
}

TEST(StopStringFilter, OverlappingSelfPrefix) {
  // "aab" arriving one byte at a time after an extra 'a': only the part that can still start
  // the stop string is held.
  StopStringFilter f({"aab"});
  EXPECT_EQ(f.push("a").text, "");
  EXPECT_EQ(f.push("a").text, "");
  EXPECT_EQ(f.push("a").text, "a");  // "aaa": only the last "aa" can start "aab"
  StopStringFilter::Result r = f.push("b");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.matched, 0u);
}

TEST(StopStringFilter, OverlappingCandidatesEarliestEndWins) {
  // "bc" completes before "abcd" when reading left to right, whatever the chunking.
  const std::vector<std::string> stops = {"abcd", "bc"};
  for (const auto& chunks : std::vector<std::vector<std::string>>{
           {"xabcd"}, {"x", "a", "b", "c", "d"}, {"xa", "bcd"}, {"xab", "cd"}}) {
    const Fed r = feed(stops, chunks, "xa");
    EXPECT_EQ(r.text, "xa");
    EXPECT_EQ(r.matched, 1u);
  }
  // Same end: the one that starts first (so none of either is returned).
  const Fed r = feed({"bc", "abc"}, {"xabc"}, "x");
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.matched, 1u);
}

TEST(StopStringFilter, MultipleStopStrings) {
  const std::vector<std::string> stops = {"\n\n", "###", "User:"};
  const Fed r = feed(stops, {"Line one\n", "Line two #", "## User: hi"}, "Line one\nLine two ");
  EXPECT_EQ(r.text, "Line one\nLine two ");
  EXPECT_EQ(r.matched, 1u);
  // The held back "\n" is released once it cannot become "\n\n".
  StopStringFilter f(stops);
  EXPECT_EQ(f.push("a\n").text, "a");
  EXPECT_EQ(f.push("b").text, "\nb");
  EXPECT_EQ(f.push("Us").text, "");
  EXPECT_EQ(f.push("e").text, "");
  EXPECT_EQ(f.push("d").text, "Used");
}

TEST(StopStringFilter, MultibyteCharactersStayIntact) {
  // Stop string is a 3-byte character; text is multibyte too.
  const Fed a = feed({"。"}, {"日本", "語", "。続き"}, "日本語");
  EXPECT_EQ(a.text, "日本語");
  // Stop string sharing a lead byte with normal text: "é" (C3 A9) vs "è" (C3 A8).
  const Fed b = feed({"éa"}, {"caf", "é", "è", "!"}, "caféè!");
  EXPECT_EQ(b.text, "caféè!");
  EXPECT_FALSE(b.matched);
  // Chunks that split characters byte-wise are never released mid-character.
  const std::string text = "Grüße, 世界! 🙂 done";
  StopStringFilter f({"done"});
  std::string got;
  for (char c : text) {
    StopStringFilter::Result r = f.push(std::string(1, c));
    EXPECT_TRUE(valid_utf8(r.text)) << "split character released";
    got += r.text;
    if (r.matched) break;
  }
  EXPECT_EQ(got, "Grüße, 世界! 🙂 ");
  // Without stop strings, an incomplete character is the only thing ever held back.
  StopStringFilter g({});
  const std::string smile = "🙂";
  EXPECT_EQ(g.push(smile.substr(0, 2)).text, "");
  EXPECT_EQ(g.held_bytes(), 2u);
  EXPECT_EQ(g.push(smile.substr(2)).text, smile);
}

TEST(StopStringFilter, RandomChunkingsAgreeWithReference) {
  // Property test: small alphabet, overlapping stop strings, every chunking gives the same
  // output as the whole-text definition, and nothing outside it is ever released.
  std::mt19937 rng(7);
  const std::vector<std::vector<std::string>> stop_sets = {
      {"ab"}, {"aba", "bb"}, {"abab", "ba", "c"}, {"aaa"}, {"ca", "abc", "bcab"}};
  for (int trial = 0; trial < 3000; ++trial) {
    const auto& stops = stop_sets[size_t(trial) % stop_sets.size()];
    std::string text;
    const int len = int(rng() % 14);
    for (int i = 0; i < len; ++i) text += "abc"[rng() % 3];
    std::optional<size_t> which;
    const std::string want = reference(stops, text, &which);
    std::vector<std::string> chunks;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min<size_t>(text.size() - i, rng() % 4);  // empty chunks too
      chunks.push_back(text.substr(i, n));
      i += n;
    }
    const Fed r = feed(stops, chunks, want);
    ASSERT_EQ(r.text, want) << "text " << text;
    ASSERT_EQ(r.matched, which) << "text " << text;
  }
}

TEST(StopStringFilter, ErrorsOnMisuse) {
  EXPECT_THROW(StopStringFilter({"ok", ""}), Error);
  StopStringFilter f({"x"});
  EXPECT_TRUE(f.push("x").matched);
  EXPECT_THROW(f.push("more"), Error);
}

// ----- StopChecker -----------------------------------------------------------------------------

const std::vector<int32_t> kEos = {2, 7};

TEST(StopChecker, EosStopsAndFlushesHeldText) {
  SamplingParams p;
  p.stop = {"###"};
  StopChecker c(p, kEos);
  EXPECT_EQ(c.on_token(10, "Done #").text, "Done ");
  StopUpdate u = c.on_token(7, "</s>");  // second EOS id; its text is never returned
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(u.text, "#");
  EXPECT_FALSE(u.stop_string);
  EXPECT_FALSE(u.stop_token);
  EXPECT_EQ(c.text(), "Done #");
  EXPECT_EQ(finish_reason_name(c.finish_reason()), "stop");
  EXPECT_THROW(c.on_token(11, "x"), Error);
}

TEST(StopChecker, IgnoreEosKeepsGoingButStopTokenIdsApply) {
  SamplingParams p;
  p.ignore_eos = true;
  p.stop_token_ids = {99};
  StopChecker c(p, kEos);
  EXPECT_FALSE(c.on_token(2, "<eos>").finished());
  EXPECT_EQ(c.text(), "<eos>");
  const StopUpdate u = c.on_token(99, "<|im_end|>");
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(u.stop_token, 99);
  EXPECT_EQ(u.text, "");
  EXPECT_EQ(c.num_tokens(), 2);
}

TEST(StopChecker, MaxTokensGivesLength) {
  SamplingParams p;
  p.max_tokens = 3;
  p.stop = {"<|"};
  StopChecker c(p, kEos);
  EXPECT_FALSE(c.on_token(10, "a").finished());
  EXPECT_FALSE(c.on_token(11, "b").finished());
  const StopUpdate u = c.on_token(12, "c<");
  EXPECT_EQ(u.finish, FinishReason::kLength);
  EXPECT_EQ(u.text, "c<");  // held-back "<" is released: it can no longer become "<|"
  EXPECT_EQ(c.text(), "abc<");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength), "length");
}

TEST(StopChecker, StopStringOnLastTokenBeatsLength) {
  SamplingParams p;
  p.max_tokens = 2;
  p.stop = {"END"};
  StopChecker c(p, kEos);
  EXPECT_EQ(c.on_token(10, "ok E").text, "ok ");
  const StopUpdate u = c.on_token(11, "ND");
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(u.stop_string, "END");
  EXPECT_EQ(c.text(), "ok ");
}

TEST(StopChecker, EosAtMaxTokensIsStop) {
  SamplingParams p;
  p.max_tokens = 1;
  StopChecker c(p, kEos);
  EXPECT_EQ(c.on_token(2, "").finish, FinishReason::kStop);
}

TEST(StopChecker, ExternalFinishFlushes) {
  SamplingParams p;
  p.stop = {"\n\n"};
  StopChecker c(p, kEos);
  EXPECT_EQ(c.on_token(10, "last line\n").text, "last line");
  EXPECT_THROW(c.finish(FinishReason::kNone), Error);
  const StopUpdate u = c.finish(FinishReason::kLength);  // e.g. context window exhausted
  EXPECT_EQ(u.text, "\n");
  EXPECT_EQ(c.text(), "last line\n");
  EXPECT_THROW(c.finish(FinishReason::kStop), Error);
}

TEST(StopChecker, NoConditionsStreamsEverything) {
  StopChecker c(SamplingParams{}, {});
  std::string all;
  for (int i = 0; i < 100; ++i) {
    const StopUpdate u = c.on_token(i, "tok ");
    EXPECT_EQ(u.text, "tok ");
    EXPECT_FALSE(u.finished());
    all += u.text;
  }
  EXPECT_EQ(c.text(), all);
  EXPECT_EQ(finish_reason_name(c.finish_reason()), "");
}

TEST(StopChecker, ValidatesParams) {
  SamplingParams p;
  p.max_tokens = 0;
  EXPECT_THROW(StopChecker(p, kEos), Error);
}

}  // namespace
}  // namespace moefold
