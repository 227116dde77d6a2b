// Tests of the serving benchmark's request generation (src/bench/datasets.h): length ranges with
// --random-range-ratio, random-token prompts (ids and text) against the real fixture tokenizers,
// prompt files (text and JSONL); the arrival schedule (src/bench/arrival_schedule.h); and the
// request bodies and URL handling of the client (src/bench/openai_client.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "bench/arrival_schedule.h"
#include "bench/datasets.h"
#include "bench/openai_client.h"
#include "core/error.h"
#include "text/tokenizer.h"
#include "fixture_util.h"

namespace moefold::bench {
namespace {

Tokenizer fixture_tokenizer(const std::string& name) {
  return Tokenizer::from_file(moefold::test::kFixtures / "tokenizer" / name / "tokenizer.json");
}

TEST(LengthRange, FloorCeilAndAtLeastOne) {
  EXPECT_EQ(length_range(100, 0.0), std::make_pair(int64_t(100), int64_t(100)));
  EXPECT_EQ(length_range(100, 0.25), std::make_pair(int64_t(75), int64_t(125)));
  EXPECT_EQ(length_range(10, 0.33), std::make_pair(int64_t(6), int64_t(14)));  // floor 6.7, ceil 13.3
  EXPECT_EQ(length_range(1, 0.9), std::make_pair(int64_t(1), int64_t(2)));
  EXPECT_THROW(length_range(10, 1.0), Error);
  EXPECT_THROW(length_range(10, -0.1), Error);
  EXPECT_THROW(length_range(0, 0.0), Error);
}

TEST(RandomRequests, TokenIdsHaveTheDrawnLengthsWithinTheRange) {
  const Tokenizer tok = fixture_tokenizer("qwen35_mini");
  RandomDatasetOptions o;
  o.num_prompts = 200;
  o.input_len = 40;
  o.output_len = 20;
  o.range_ratio = 0.5;
  o.seed = 3;
  o.token_ids = true;
  const auto reqs = sample_random_requests(tok, o);
  ASSERT_EQ(reqs.size(), 200u);
  std::set<int64_t> in_lens, out_lens;
  for (const SampleRequest& r : reqs) {
    EXPECT_EQ(int64_t(r.prompt_ids.size()), r.prompt_len);
    EXPECT_TRUE(r.prompt.empty());
    EXPECT_GE(r.prompt_len, 20);
    EXPECT_LE(r.prompt_len, 60);
    EXPECT_GE(r.output_len, 10);
    EXPECT_LE(r.output_len, 30);
    for (int32_t id : r.prompt_ids) {
      EXPECT_FALSE(tok.is_special(id));
      EXPECT_LT(size_t(id), tok.vocab_size());
    }
    in_lens.insert(r.prompt_len);
    out_lens.insert(r.output_len);
  }
  // 200 uniform draws over 41 / 21 values reach both ends of each range.
  EXPECT_EQ(*in_lens.begin(), 20);
  EXPECT_EQ(*in_lens.rbegin(), 60);
  EXPECT_EQ(*out_lens.begin(), 10);
  EXPECT_EQ(*out_lens.rbegin(), 30);
  EXPECT_GT(in_lens.size(), 30u);
  // Deterministic for a seed; another seed gives other prompts.
  const auto again = sample_random_requests(tok, o);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(again[i].prompt_ids, reqs[i].prompt_ids);
  o.seed = 4;
  EXPECT_NE(sample_random_requests(tok, o)[0].prompt_ids, reqs[0].prompt_ids);
}

TEST(RandomRequests, TextPromptsReEncodeToTheirLength) {
  for (const char* name : {"qwen35_mini", "smollm2"}) {
    const Tokenizer tok = fixture_tokenizer(name);
    RandomDatasetOptions o;
    o.num_prompts = 20;
    o.input_len = 64;
    o.output_len = 8;
    o.seed = 1;
    const auto reqs = sample_random_requests(tok, o);
    int exact = 0;
    for (const SampleRequest& r : reqs) {
      EXPECT_TRUE(r.prompt_ids.empty());
      EXPECT_FALSE(r.prompt.empty());
      EXPECT_EQ(r.output_len, 8);
      // prompt_len is what the prompt really encodes to, and close to the target.
      EXPECT_EQ(int64_t(tok.encode(r.prompt, false).size()), r.prompt_len) << name;
      EXPECT_NEAR(double(r.prompt_len), 64.0, 3.0) << name;
      exact += r.prompt_len == 64;
    }
    EXPECT_GE(exact, 15) << name << ": most prompts should hit the length exactly";
  }
}

class PromptFile : public ::testing::Test {
 protected:
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("moefold_bench_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                               "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = dir / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};

TEST_F(PromptFile, JsonlFieldShuffledAndRepeated) {
  const std::string path = write("gsm.jsonl",
                                 "{\"question\": \"one?\", \"answer\": \"1\"}\n"
                                 "\n"
                                 "{\"question\": \"two?\", \"answer\": \"2\"}\r\n"
                                 "{\"question\": \"three?\", \"answer\": \"3\"}\n");
  const Tokenizer tok = fixture_tokenizer("smollm2");
  FileDatasetOptions o{path, "question", 7, 16, 5};
  const auto reqs = sample_file_requests(o, &tok);
  ASSERT_EQ(reqs.size(), 7u);
  std::multiset<std::string> seen;
  for (const SampleRequest& r : reqs) {
    seen.insert(r.prompt);
    EXPECT_EQ(r.output_len, 16);
    EXPECT_EQ(r.prompt_len, int64_t(tok.encode(r.prompt, false).size()));
  }
  // Every prompt of the file is used before any repeats: 7 = 3 + 3 + 1.
  for (const char* q : {"one?", "two?", "three?"}) EXPECT_GE(seen.count(q), 2u) << q;
  EXPECT_EQ(reqs[0].prompt, reqs[3].prompt);
  // Without a tokenizer the length is unknown (the server's usage will tell).
  EXPECT_EQ(sample_file_requests(o, nullptr)[0].prompt_len, 0);
}

TEST_F(PromptFile, TextLinesAndClearErrors) {
  const auto reqs = sample_file_requests({write("p.txt", "first prompt\n\nsecond prompt\n"), "prompt", 2, 4, 0}, nullptr);
  std::multiset<std::string> got = {reqs[0].prompt, reqs[1].prompt};
  EXPECT_EQ(got, (std::multiset<std::string>{"first prompt", "second prompt"}));

  auto message = [&](const FileDatasetOptions& o) {
    try {
      sample_file_requests(o, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({write("bad.jsonl", "{\"q\": \"x\"}\nnot json\n"), "q", 1, 4, 0}).find("bad.jsonl:2: not a JSON"),
            std::string::npos);
  EXPECT_NE(message({write("f.jsonl", "{\"q\": \"x\"}\n"), "question", 1, 4, 0}).find("no string field \"question\""),
            std::string::npos);
  EXPECT_NE(message({(dir / "missing.txt").string(), "prompt", 1, 4, 0}).find("cannot open"), std::string::npos);
  EXPECT_NE(message({write("empty.txt", "\n \n"), "prompt", 1, 4, 0}).find("no prompts"), std::string::npos);
}

TEST(ArrivalTimes, PoissonMeanGapAndBurstiness) {
  const int64_t n = 200000;
  for (double burstiness : {1.0, 0.25, 4.0}) {
    const auto t = arrival_times(n, 8.0, burstiness, 11);
    ASSERT_EQ(t.size(), size_t(n));
    EXPECT_EQ(t[0], 0.0);
    double sum = 0, sq = 0;
    for (size_t i = 1; i < t.size(); ++i) {
      const double g = t[i] - t[i - 1];
      ASSERT_GE(g, 0.0);
      sum += g;
      sq += g * g;
    }
    const double mean = sum / double(n - 1), var = sq / double(n - 1) - mean * mean;
    // Mean gap 1 / rate; coefficient of variation 1 / sqrt(burstiness) (gamma with shape k).
    EXPECT_NEAR(mean, 0.125, 0.125 * 0.01) << "burstiness " << burstiness;
    EXPECT_NEAR(std::sqrt(var) / mean, 1 / std::sqrt(burstiness), 0.03) << "burstiness " << burstiness;
  }
  EXPECT_EQ(arrival_times(5, INFINITY, 1.0, 0), std::vector<double>(5, 0.0));
  EXPECT_EQ(arrival_times(50, 3.0, 1.0, 9), arrival_times(50, 3.0, 1.0, 9));
  EXPECT_THROW(arrival_times(5, 0.0, 1.0, 0), Error);
  EXPECT_THROW(arrival_times(5, 1.0, 0.0, 0), Error);
}

TEST(OpenAiClient, BaseUrlSplitting) {
  BaseUrl u = split_base_url("http://127.0.0.1:8000");
  EXPECT_EQ(u.scheme_host_port, "http://127.0.0.1:8000");
  EXPECT_EQ(u.path_prefix, "");
  u = split_base_url("HTTPS://example.com/proxy/v/");
  EXPECT_EQ(u.scheme_host_port, "https://example.com");
  EXPECT_EQ(u.path_prefix, "/proxy/v");
  u = split_base_url("localhost:30000");
  EXPECT_EQ(u.scheme_host_port, "http://localhost:30000");
  u = split_base_url("http://[::1]:8000/");
  EXPECT_EQ(u.scheme_host_port, "http://[::1]:8000");
  EXPECT_THROW(split_base_url("ftp://host:1"), Error);
  EXPECT_THROW(split_base_url("http://:8000"), Error);
  EXPECT_THROW(split_base_url("http://host:0"), Error);
  EXPECT_THROW(split_base_url("http://host:99999"), Error);
  EXPECT_THROW(split_base_url("http://host:abc"), Error);
  EXPECT_TRUE(is_chat_endpoint("/v1/chat/completions"));
  EXPECT_TRUE(is_chat_endpoint("/v1/chat/completions/"));
  EXPECT_FALSE(is_chat_endpoint("/v1/completions"));
}

TEST(OpenAiClient, RequestBodies) {
  Target t;
  t.model = "m";
  SampleRequest ids{"", {5, 6, 7}, 3, 9};
  RequestOptions o;
  o.ignore_eos = true;
  auto b = request_body(t, ids, o);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["prompt"], nlohmann::json::array({5, 6, 7}));
  EXPECT_EQ(b["max_tokens"], 9);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["temperature"], 0.0);

  SampleRequest text{"hello", {}, 1, 4};
  o.ignore_eos = false;
  o.extra_body = {{"top_k", 5}, {"temperature", 0.7}};
  b = request_body(t, text, o);
  EXPECT_EQ(b["prompt"], "hello");
  EXPECT_FALSE(b.contains("ignore_eos"));
  EXPECT_EQ(b["top_k"], 5);
  EXPECT_EQ(b["temperature"], 0.7);  // extra_body overrides

  t.endpoint = "/v1/chat/completions";
  b = request_body(t, text, {});
  EXPECT_EQ(b["messages"], nlohmann::json::parse(R"([{"role":"user","content":"hello"}])"));
  EXPECT_EQ(b["max_completion_tokens"], 4);
  EXPECT_FALSE(b.contains("prompt"));
  EXPECT_THROW(request_body(t, ids, {}), Error);
}

TEST(OpenAiClient, UnreachableServerIsAnErrorNotACrash) {
  Target t;
  t.base_url = "http://127.0.0.1:1";  // nothing listens on port 1
  const ModelList m = fetch_models(t);
  EXPECT_FALSE(m.reachable);
  EXPECT_NE(m.error.find("cannot reach http://127.0.0.1:1/v1/models"), std::string::npos) << m.error;
  const RequestOutput r = send_request(t, {"hi", {}, 1, 2}, {}, std::chrono::steady_clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("failed"), std::string::npos) << r.error;
}

TEST(PrefixRepetitionRequests, SharedPrefixesAndDistinctSuffixes) {
  const Tokenizer tok = fixture_tokenizer("qwen35_mini");
  const std::vector<SampleRequest> r =
      sample_prefix_repetition_requests(tok, {12, 40, 10, 3, 7, 5, true});
  ASSERT_EQ(r.size(), 12u);
  std::map<std::vector<int32_t>, int> prefixes;
  std::set<std::vector<int32_t>> prompts;
  for (const SampleRequest& q : r) {
    ASSERT_EQ(q.prompt_ids.size(), 50u);
    EXPECT_EQ(q.prompt_len, 50);
    EXPECT_EQ(q.output_len, 7);
    ++prefixes[std::vector<int32_t>(q.prompt_ids.begin(), q.prompt_ids.begin() + 40)];
    prompts.insert(q.prompt_ids);
  }
  EXPECT_EQ(prefixes.size(), 3u);
  for (const auto& [p, n] : prefixes) EXPECT_EQ(n, 4);  // 12 requests over 3 prefixes
  EXPECT_EQ(prompts.size(), 12u);                      // distinct suffixes
  // Text prompts of one prefix all start with the same text; the options are deterministic.
  const std::vector<SampleRequest> t = sample_prefix_repetition_requests(tok, {6, 30, 5, 1, 4, 9, false});
  for (const SampleRequest& q : t) EXPECT_EQ(q.prompt.substr(0, 20), t[0].prompt.substr(0, 20));
  EXPECT_EQ(sample_prefix_repetition_requests(tok, {6, 30, 5, 1, 4, 9, false})[3].prompt, t[3].prompt);
  EXPECT_THROW(sample_prefix_repetition_requests(tok, {6, 0, 5, 1, 4, 9, false}), Error);
}

TEST(MultiTurnConversations, SharedSystemPromptUserTurnLengthsAndDeterminism) {
  const Tokenizer tok = fixture_tokenizer("qwen35_mini");
  MultiTurnOptions o;
  o.num_conversations = 5;
  o.num_turns = 4;
  o.shared_prefix_len = 30;
  o.conversation_prefix_len = 6;
  o.user_len = 20;
  o.range_ratio = 0.5;
  o.output_len = 7;
  o.seed = 3;
  const std::vector<Conversation> c = sample_multi_turn_conversations(tok, o);
  ASSERT_EQ(c.size(), 5u);
  std::set<std::string> systems, users;
  for (const Conversation& v : c) {
    ASSERT_EQ(v.user_turns.size(), 4u);
    EXPECT_EQ(v.output_len, 7);
    EXPECT_EQ(v.system.substr(0, 40), c[0].system.substr(0, 40));  // the shared part comes first
    systems.insert(v.system);
    for (const std::string& u : v.user_turns) {
      const size_t n = tok.encode(u, false).size();
      EXPECT_GE(n, 9u) << u;  // drawn from [10, 30] tokens (adjusted text: a token or two off at most)
      EXPECT_LE(n, 32u) << u;
      users.insert(u);
    }
  }
  EXPECT_EQ(systems.size(), 5u);  // each conversation's own part differs
  EXPECT_EQ(users.size(), 20u);
  const std::vector<Conversation> again = sample_multi_turn_conversations(tok, o);
  EXPECT_EQ(again[4].user_turns[3], c[4].user_turns[3]);
  EXPECT_EQ(again[2].system, c[2].system);
  o.shared_prefix_len = o.conversation_prefix_len = 0;
  EXPECT_EQ(sample_multi_turn_conversations(tok, o)[0].system, "");
  o.num_turns = 0;
  EXPECT_THROW(sample_multi_turn_conversations(tok, o), Error);
  o.num_turns = 2;
  o.conversation_prefix_len = -1;
  EXPECT_THROW(sample_multi_turn_conversations(tok, o), Error);
}

// Turn t's request carries the earlier turns with the model's replies: on the completions endpoint
// its prompt begins with turn t-1's prompt followed by that turn's reply (what a prefix cache reuses).
TEST(MultiTurnConversations, EachTurnExtendsThePreviousWithTheReply) {
  const Tokenizer tok = fixture_tokenizer("qwen35_mini");
  Conversation c{"be brief", {"first question", "second", "third"}, 9};
  const std::vector<std::string> replies = {"answer one", "answer two"};
  const SampleRequest t0 = multi_turn_request(c, replies, 0, false, &tok);
  EXPECT_EQ(t0.prompt, "System: be brief\n\nUser: first question\n\nAssistant:");
  EXPECT_EQ(t0.prompt_len, int64_t(tok.encode(t0.prompt, false).size()));
  EXPECT_EQ(t0.output_len, 9);
  const SampleRequest t1 = multi_turn_request(c, replies, 1, false, &tok);
  EXPECT_EQ(t1.prompt.rfind(t0.prompt + " answer one\n\n", 0), 0u) << t1.prompt;
  const SampleRequest t2 = multi_turn_request(c, replies, 2, false, nullptr);
  EXPECT_EQ(t2.prompt.rfind(t1.prompt + " answer two\n\nUser: third", 0), 0u) << t2.prompt;
  EXPECT_EQ(t2.prompt_len, 0);
  // Chat: the messages, the replies as assistant turns.
  const SampleRequest m = multi_turn_request(c, replies, 2, true, &tok);
  using M = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(m.messages, (M{{"system", "be brief"}, {"user", "first question"}, {"assistant", "answer one"},
                           {"user", "second"}, {"assistant", "answer two"}, {"user", "third"}}));
  const nlohmann::json body = request_body(Target{"http://h:1", "/v1/chat/completions", "m"}, m, {});
  ASSERT_EQ(body["messages"].size(), 6u);
  EXPECT_EQ(body["messages"][4], (nlohmann::json{{"role", "assistant"}, {"content", "answer two"}}));
  EXPECT_EQ(body["max_completion_tokens"], 9);
  c.system.clear();
  EXPECT_EQ(multi_turn_request(c, replies, 0, true, nullptr).messages, (M{{"user", "first question"}}));
  EXPECT_THROW(multi_turn_request(c, replies, 3, true, nullptr), Error);       // no such turn
  const std::vector<std::string> one_reply = {replies[0]};
  EXPECT_THROW(multi_turn_request(c, one_reply, 2, false, nullptr), Error);  // a reply missing
}

}  // namespace
}  // namespace moefold::bench

