// Request framing on raw connection bytes, ahead of cpp-httplib: where one HTTP/1.1 request ends
// (headers, then a Content-Length or chunked body), and the limits a request must meet before a
// handler thread is given to it. The connection reader (http_connection.h) buffers a request
// until scan_request says it is complete, so slow clients never hold a handler thread, and a
// request pipelined behind another stays in the buffer for the next round.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moefold::server {

/// Limits of the HTTP layer. Times are in seconds.
struct HttpLimits {
  size_t max_header_count = 128;           ///< header lines per request (request line excluded)
  size_t max_header_bytes = size_t(64) << 10;  ///< request line + headers + the blank line
  size_t max_body_bytes = size_t(64) << 20;    ///< decoded body (Content-Length or chunks)
  double receive_timeout = 30;             ///< from a request's first byte to its last
  double keep_alive_timeout = 5;           ///< an idle connection between requests is closed after this
  double write_timeout = 10;               ///< one blocked write to a client (a stream reader that stalls)
  size_t max_connections = 8192;           ///< open connections; more are refused at once (503)
};

/// Progress of scan_request over one connection's buffer; reset (= {}) for each new request.
struct FrameScan {
  enum class Status { kIncomplete, kComplete, kError };
  Status status = Status::kIncomplete;
  size_t length = 0;          ///< kComplete: bytes of the whole request (headers + body)
  int http_status = 0;        ///< kError: 400, 413, 431 or 501
  std::string message;        ///< kError: why
  bool expect_continue = false;  ///< headers complete and they ask for "100 Continue"

  // Resumable state (scan_request continues where the last call stopped).
  size_t header_length = 0;      ///< 0 until the blank line is found
  bool chunked = false;
  size_t content_length = 0;
  size_t next_chunk = 0;         ///< chunked: offset of the next chunk-size line
  size_t body_bytes = 0;         ///< chunked: decoded bytes so far
  bool in_trailers = false;      ///< chunked: after the last (0) chunk
};

/// Scans `data` (everything received for the current request so far, starting at its first
/// byte) and updates `scan`. Errors: headers over max_header_bytes or max_header_count (431), more
/// than one Content-Length, a Content-Length that is not a plain decimal, Content-Length together
/// with Transfer-Encoding, malformed chunks (400), a Transfer-Encoding other than chunked (501), a
/// body over max_body_bytes, or chunk framing over 8 x max_body_bytes (413). A POST without either header has an empty body. Call again
/// with the same `scan` when more bytes arrive; `data` must keep its earlier bytes.
void scan_request(std::string_view data, const HttpLimits& limits, FrameScan& scan);

/// The API's request bodies are JSON whatever their label: in the complete request buf[0, length), a
/// Content-Type of application/x-www-form-urlencoded (what `curl -d` sends) is rewritten to
/// application/json, so that cpp-httplib does not apply its 8 KiB cap on form bodies (the body limit is
/// HttpLimits::max_body_bytes). Bytes past `length` (a pipelined request) are kept. Returns the
/// request's new length.
size_t relabel_form_body_as_json(std::string& buf, size_t length);

}  // namespace moefold::server
