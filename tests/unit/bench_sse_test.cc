// Tests of the serving benchmark's stream reading: the SSE parser on every split of a stream and
// on the line-ending and field rules (src/bench/sse_parser.h), OpenAI chunk reading, and the
// timing of a streamed response from synthetic arrival times (src/bench/stream_recorder.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/sse_parser.h"
#include "bench/stream_recorder.h"

namespace moefold::bench {
namespace {

std::vector<std::string> feed_all(const std::vector<std::string>& pieces) {
  SseParser p;
  std::vector<std::string> out;
  for (const std::string& s : pieces)
    for (std::string& d : p.feed(s)) out.push_back(std::move(d));
  return out;
}

TEST(SseParser, EventsSurviveEverySplitOfTheStream) {
  const std::string stream =
      "data: {\"a\":1}\n\n"
      ": a comment\n"
      "event: message\nid: 7\ndata: {\"b\":2}\r\n\r\n"
      "data:no-space\r\rdata: [DONE]\n\n";
  const std::vector<std::string> expected = {"{\"a\":1}", "{\"b\":2}", "no-space", "[DONE]"};
  EXPECT_EQ(feed_all({stream}), expected);
  for (size_t cut = 0; cut <= stream.size(); ++cut)
    EXPECT_EQ(feed_all({stream.substr(0, cut), stream.substr(cut)}), expected) << "split at " << cut;
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(feed_all(bytes), expected);
}

TEST(SseParser, MultiLineDataIncompleteEventsAndEmptyEvents) {
  EXPECT_EQ(feed_all({"data: line1\ndata: line2\n\n"}), (std::vector<std::string>{"line1\nline2"}));
  EXPECT_EQ(feed_all({"data:  two spaces\n\n"}), (std::vector<std::string>{" two spaces"}));  // only one dropped
  EXPECT_EQ(feed_all({"data\n\n"}), (std::vector<std::string>{""}));                    // a field without colon
  EXPECT_TRUE(feed_all({"event: ping\n\n", "\n\n"}).empty());                            // no data: nothing dispatched
  EXPECT_TRUE(feed_all({"data: never finished\n"}).empty());                             // no blank line yet
}

TEST(StreamChunk, CompletionsChatUsageDoneAndErrors) {
  StreamChunk c = parse_stream_chunk(R"({"object":"text_completion","choices":[{"index":0,"text":"Hi","finish_reason":null}]})");
  EXPECT_EQ(c.kind, StreamChunk::Kind::kData);
  EXPECT_TRUE(c.has_choices);
  EXPECT_EQ(c.text, "Hi");
  EXPECT_FALSE(c.completion_tokens.has_value());

  c = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})");
  EXPECT_TRUE(c.has_choices);
  EXPECT_EQ(c.text, "");  // the role chunk carries no content
  c = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"content":"x"}}]})");
  EXPECT_EQ(c.text, "x");
  c = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]})");
  EXPECT_EQ(c.text, "think");

  c = parse_stream_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}})");
  EXPECT_FALSE(c.has_choices);
  EXPECT_EQ(c.prompt_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 5);
  EXPECT_FALSE(c.cached_tokens.has_value());
  c = parse_stream_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}})");
  EXPECT_EQ(c.cached_tokens, 8);
  c = parse_stream_chunk(R"({"choices":[{"text":"a"}],"usage":null})");
  EXPECT_FALSE(c.completion_tokens.has_value());

  EXPECT_EQ(parse_stream_chunk(" [DONE] ").kind, StreamChunk::Kind::kDone);
  c = parse_stream_chunk(R"({"error":{"message":"engine failed","type":"internal_server_error"}})");
  EXPECT_EQ(c.kind, StreamChunk::Kind::kError);
  EXPECT_EQ(c.error, "engine failed");
  c = parse_stream_chunk("{not json");
  EXPECT_EQ(c.kind, StreamChunk::Kind::kError);
  EXPECT_NE(c.error.find("malformed"), std::string::npos);
}

std::string text_chunk(const std::string& t) {
  return "data: {\"choices\":[{\"index\":0,\"text\":\"" + t + "\",\"finish_reason\":null}]}\n\n";
}

TEST(StreamRecorder, TtftAndItlFromArrivalTimes) {
  StreamRecorder rec(10.0);  // sent at t = 10 s
  rec.on_bytes(text_chunk("a"), 10.25);
  rec.on_bytes(text_chunk("b").substr(0, 7), 10.30);  // half an event: no chunk yet
  rec.on_bytes(text_chunk("b").substr(7), 10.375);
  rec.on_bytes(text_chunk("c") + text_chunk("d"), 10.5);  // two chunks in one read: a zero gap
  rec.on_bytes("data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n", 10.5);
  rec.on_bytes("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4}}\n\n", 10.5);
  EXPECT_FALSE(rec.done());
  rec.on_bytes("data: [DONE]\n\n", 10.5);
  EXPECT_TRUE(rec.done());
  const RequestOutput r = rec.finish(10.75, 99);
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_DOUBLE_EQ(r.start_s, 10.0);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.25);
  ASSERT_EQ(r.itl_s.size(), 3u);  // the empty finish chunk is not a token
  EXPECT_DOUBLE_EQ(r.itl_s[0], 0.125);
  EXPECT_DOUBLE_EQ(r.itl_s[1], 0.125);
  EXPECT_DOUBLE_EQ(r.itl_s[2], 0.0);
  // vLLM's E2EL: to the last content chunk (10.5), not to the end of the response (10.75).
  EXPECT_DOUBLE_EQ(r.latency_s, 0.5);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_TRUE(r.output_tokens_from_usage);
  EXPECT_EQ(r.prompt_tokens, 7);  // the server's count wins over the client's 99
  EXPECT_TRUE(r.prompt_tokens_from_usage);
  EXPECT_DOUBLE_EQ(time_per_output_token(r), (0.5 - 0.25) / 3);
}

TEST(StreamRecorder, ChatRoleChunkIsNotTheFirstTokenAndChunkCountIsTheFallback) {
  StreamRecorder rec(0.0);
  rec.on_bytes("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", 0.01);
  rec.on_bytes("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n", 0.5);
  rec.on_bytes("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n", 0.75);
  const RequestOutput r = rec.finish(0.8, 12);
  EXPECT_TRUE(r.success);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.5);
  EXPECT_EQ(r.output_tokens, 2);  // no usage: content chunks
  EXPECT_FALSE(r.output_tokens_from_usage);
  EXPECT_EQ(r.prompt_tokens, 12);  // no usage: the client's count
  EXPECT_FALSE(r.prompt_tokens_from_usage);
}

TEST(StreamRecorder, ErrorsAndEmptyStreamsFail) {
  StreamRecorder err(0.0);
  err.on_bytes(text_chunk("a"), 0.1);
  err.on_bytes("data: {\"error\":{\"message\":\"engine failed\"}}\n\ndata: [DONE]\n\n", 0.2);
  RequestOutput r = err.finish(0.2, 0);
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("engine failed"), std::string::npos) << r.error;

  StreamRecorder empty(0.0);
  empty.on_bytes("data: [DONE]\n\n", 0.1);
  r = empty.finish(0.1, 0);
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("no content"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace moefold::bench
