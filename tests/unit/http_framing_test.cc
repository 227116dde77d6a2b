// scan_request: where a request ends, and the HTTP limits (header count / size, framing errors).
#include "server/http_framing.h"

#include <gtest/gtest.h>

namespace moefold::server {
namespace {

using Status = FrameScan::Status;

FrameScan scan(const std::string& data, const HttpLimits& limits = {}) {
  FrameScan s;
  scan_request(data, limits, s);
  return s;
}

TEST(HttpFraming, ContentLengthBodyEndsTheRequest) {
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
  EXPECT_EQ(scan(req.substr(0, 20)).status, Status::kIncomplete);
  EXPECT_EQ(scan(req.substr(0, req.size() - 1)).status, Status::kIncomplete);
  const FrameScan s = scan(req + "GET /health HTTP/1.1\r\n\r\n");  // a pipelined request follows
  ASSERT_EQ(s.status, Status::kComplete);
  EXPECT_EQ(s.length, req.size());
  EXPECT_EQ(scan("GET /health HTTP/1.1\r\n\r\n").length, 24u);
}

TEST(HttpFraming, FormLabelledBodiesAreRelabelledJson) {
  const std::string body = "{\"prompt\": \"hi\"}";
  const std::string next = "GET /health HTTP/1.1\r\n\r\n";
  std::string buf = "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type:  Application/X-WWW-Form-Urlencoded; charset=utf-8\r\n"
                    "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  const size_t length = buf.size();
  buf += next;
  const size_t n = relabel_form_body_as_json(buf, length);
  EXPECT_EQ(buf.substr(0, n), "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type:  application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(buf.substr(n), next);
  // Other labels, and a body that merely contains the words, are left alone.
  std::string json = "POST / HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 33\r\n\r\napplication/x-www-form-urlencoded";
  const std::string copy = json;
  EXPECT_EQ(relabel_form_body_as_json(json, json.size()), copy.size());
  EXPECT_EQ(json, copy);
}

TEST(HttpFraming, ResumesAcrossCalls) {
  const std::string req = "POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc";
  FrameScan s;
  for (size_t n = 1; n < req.size(); ++n) {
    scan_request(std::string_view(req).substr(0, n), {}, s);
    ASSERT_EQ(s.status, Status::kIncomplete) << n;
  }
  scan_request(req, {}, s);
  EXPECT_EQ(s.status, Status::kComplete);
  EXPECT_EQ(s.length, req.size());
}

TEST(HttpFraming, ChunkedBodies) {
  const std::string req =
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n";
  FrameScan s;
  for (size_t n = 1; n < req.size(); ++n) {
    scan_request(std::string_view(req).substr(0, n), {}, s);
    ASSERT_EQ(s.status, Status::kIncomplete) << n;
  }
  scan_request(req, {}, s);
  ASSERT_EQ(s.status, Status::kComplete);
  EXPECT_EQ(s.length, req.size());
  EXPECT_EQ(s.body_bytes, 8u);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").http_status, 400);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n").http_status, 400);
}

TEST(HttpFraming, TwoContentLengthsAre400) {
  const FrameScan s = scan("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(s.status, Status::kError);
  EXPECT_EQ(s.http_status, 400);
  EXPECT_NE(s.message.find("Content-Length"), std::string::npos);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello").http_status, 400);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello").http_status, 400);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").http_status, 400);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n").http_status, 400);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").http_status, 501);
}

TEST(HttpFraming, HeaderCountAndSizeLimitsAre431) {
  HttpLimits l;
  l.max_header_count = 10;
  l.max_header_bytes = 1000;
  std::string head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 10; ++i) head += "X-A: 1\r\n";
  EXPECT_EQ(scan(head + "\r\n", l).status, Status::kComplete);
  EXPECT_EQ(scan(head + "X-A: 1\r\n\r\n", l).http_status, 431);
  // Known before the headers end: too many lines, or too many bytes, so far.
  EXPECT_EQ(scan(head + "X-A: 1\r\nX-A: 1\r\n", l).http_status, 431);
  EXPECT_EQ(scan("GET / HTTP/1.1\r\nX-Big: " + std::string(1000, 'b'), l).http_status, 431);
  EXPECT_EQ(scan("GET / HTTP/1.1\r\nX-Big: " + std::string(900, 'b') + "\r\n\r\n", l).status, Status::kComplete);
}

TEST(HttpFraming, BodyOverTheLimitIs413) {
  HttpLimits l;
  l.max_body_bytes = 10;
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", l).http_status, 413);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", l).http_status, 400);
  EXPECT_EQ(scan("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\n", l).http_status, 413);
  // 1-byte chunks: the decoded body stays small while the framing grows without end.
  std::string many = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  l.max_body_bytes = 1000;
  for (int i = 0; i < 500; ++i) many += "1;" + std::string(20, 'e') + "\r\nx\r\n";
  EXPECT_EQ(scan(many, l).http_status, 413);
}

TEST(HttpFraming, ExpectContinueIsReported) {
  const FrameScan s = scan("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(s.status, Status::kIncomplete);
  EXPECT_TRUE(s.expect_continue);
}

}  // namespace
}  // namespace moefold::server
