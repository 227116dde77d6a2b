// HTTP/1.1 request framing (contract: http_framing.h).
#include "server/http_framing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace moefold::server {

namespace {

constexpr size_t kMaxChunkLine = 1024;  // chunk size + extensions

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower((unsigned char)x) == std::tolower((unsigned char)y); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

void error(FrameScan& scan, int status, std::string message) {
  scan.status = FrameScan::Status::kError;
  scan.http_status = status;
  scan.message = std::move(message);
}

size_t count_lines(std::string_view s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

std::string too_large(const HttpLimits& l) {
  return fmt::format("The request headers exceed the limit ({} headers, {} bytes).", l.max_header_count,
                     l.max_header_bytes);
}

/// Parses the header block (request line excluded); sets the body framing or an error.
void parse_headers(std::string_view block, const HttpLimits& limits, FrameScan& scan) {
  size_t content_lengths = 0;
  bool has_te = false;
  std::string_view te, cl;
  while (!block.empty()) {
    const size_t eol = block.find("\r\n");
    std::string_view line = block.substr(0, eol);
    block.remove_prefix(eol == std::string_view::npos ? block.size() : eol + 2);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // httplib skips such lines too
    const std::string_view name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    if (iequals(name, "Content-Length")) {
      ++content_lengths;
      cl = value;
    } else if (iequals(name, "Transfer-Encoding")) {
      if (has_te) return error(scan, 400, "More than one Transfer-Encoding header.");
      has_te = true;
      te = value;
    } else if (iequals(name, "Expect") && iequals(value, "100-continue")) {
      scan.expect_continue = true;
    }
  }
  if (content_lengths > 1) return error(scan, 400, "More than one Content-Length header.");
  if (has_te && content_lengths) return error(scan, 400, "Both Content-Length and Transfer-Encoding are present.");
  if (has_te) {
    if (!iequals(te, "chunked")) return error(scan, 501, "Only the chunked Transfer-Encoding is supported.");
    scan.chunked = true;
    scan.next_chunk = scan.header_length;
    return;
  }
  if (content_lengths) {
    if (cl.empty() || cl.size() > 19 || !std::all_of(cl.begin(), cl.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return error(scan, 400, "The Content-Length header is not a decimal number.");
    scan.content_length = size_t(std::stoull(std::string(cl)));
    if (scan.content_length > limits.max_body_bytes)
      return error(scan, 413, fmt::format("The request body exceeds the limit of {} bytes.", limits.max_body_bytes));
  }
}

/// Walks chunks from scan.next_chunk as far as `data` goes.
void scan_chunks(std::string_view data, const HttpLimits& limits, FrameScan& scan) {
  for (;;) {
    const size_t at = scan.next_chunk;
    const size_t eol = data.find("\r\n", at);
    if (eol == std::string_view::npos) {
      if (data.size() - at > kMaxChunkLine) error(scan, 400, "A chunk-size line is too long.");
      return;  // incomplete
    }
    if (scan.in_trailers) {
      if (eol == at) {  // the blank line after the trailers
        scan.status = FrameScan::Status::kComplete;
        scan.length = eol + 2;
        return;
      }
      if (eol - scan.header_length > limits.max_header_bytes) return error(scan, 431, too_large(limits));
      scan.next_chunk = eol + 2;
      continue;
    }
    std::string_view line = data.substr(at, eol - at);
    line = trim(line.substr(0, line.find(';')));
    if (line.empty() || line.size() > 15 || !std::all_of(line.begin(), line.end(), [](char c) { return std::isxdigit((unsigned char)c); }))
      return error(scan, 400, "Malformed chunk size in a chunked request body.");
    const size_t size = size_t(std::stoull(std::string(line), nullptr, 16));
    if (size == 0) {
      scan.in_trailers = true;
      scan.next_chunk = eol + 2;
      continue;
    }
    if (scan.body_bytes + size > limits.max_body_bytes)
      return error(scan, 413, fmt::format("The request body exceeds the limit of {} bytes.", limits.max_body_bytes));
    const size_t end = eol + 2 + size;
    if (data.size() < end + 2) return;  // incomplete
    if (data.substr(end, 2) != "\r\n") return error(scan, 400, "A chunk of a chunked request body lacks its CRLF.");
    scan.body_bytes += size;
    scan.next_chunk = end + 2;
  }
}

}  // namespace

void scan_request(std::string_view data, const HttpLimits& limits, FrameScan& scan) {
  if (scan.status != FrameScan::Status::kIncomplete) return;
  if (scan.header_length == 0) {
    const size_t window = std::min(data.size(), limits.max_header_bytes);
    const size_t end = data.substr(0, window).find("\r\n\r\n");
    if (end == std::string_view::npos) {
      // One header line per CRLF, the request line not counted.
      const size_t lines = count_lines(data.substr(0, window));
      if (data.size() >= limits.max_header_bytes || lines > limits.max_header_count + 1)
        error(scan, 431, too_large(limits));
      return;
    }
    if (end + 4 > limits.max_header_bytes) return error(scan, 431, too_large(limits));
    const size_t first_eol = data.find("\r\n");
    const std::string_view block = data.substr(first_eol + 2, end + 2 - (first_eol + 2));
    if (first_eol != end && count_lines(block) > limits.max_header_count) return error(scan, 431, too_large(limits));
    scan.header_length = end + 4;
    if (first_eol != end) parse_headers(block, limits, scan);
    else parse_headers({}, limits, scan);  // a request line and no headers
    if (scan.status == FrameScan::Status::kError) return;
  }
  if (scan.chunked) {
    scan_chunks(data, limits, scan);
    // Chunk framing can make the encoded body far larger than the decoded one (1-byte chunks):
    // bound the bytes buffered too.
    if (scan.status == FrameScan::Status::kIncomplete &&
        data.size() - scan.header_length > 8 * limits.max_body_bytes + kMaxChunkLine)
      error(scan, 413, fmt::format("The chunked request body exceeds the limit of {} bytes.", limits.max_body_bytes));
    return;
  }
  if (data.size() >= scan.header_length + scan.content_length) {
    scan.status = FrameScan::Status::kComplete;
    scan.length = scan.header_length + scan.content_length;
  }
}

size_t relabel_form_body_as_json(std::string& buf, size_t length) {
  const size_t end = std::string_view(buf).substr(0, length).find("\r\n\r\n");
  if (end == std::string_view::npos) return length;
  constexpr std::string_view kForm = "application/x-www-form-urlencoded", kJson = "application/json";
  size_t line = buf.find("\r\n");  // past the request line
  while (line != std::string::npos && line < end) {
    const size_t start = line + 2, stop = buf.find("\r\n", start);
    const size_t colon = buf.find(':', start);
    if (colon != std::string::npos && colon < stop && iequals(trim(std::string_view(buf).substr(start, colon - start)), "Content-Type")) {
      size_t v = colon + 1;
      while (v < stop && (buf[v] == ' ' || buf[v] == '\t')) ++v;
      const std::string_view value = std::string_view(buf).substr(v, stop - v);
      if (value.size() >= kForm.size() && iequals(value.substr(0, kForm.size()), kForm)) {
        buf.replace(v, stop - v, kJson);
        return length - (stop - v) + kJson.size();
      }
      return length;
    }
    line = stop;
  }
  return length;
}

}  // namespace moefold::server
