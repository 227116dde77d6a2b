// ApiError: a failure the HTTP API reports to the client as an OpenAI-style JSON error,
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// with an HTTP status. Handlers throw it; the server turns it into the response.
#pragma once
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moefold::server {

/// Longest piece of a client's value that an error message repeats (bytes, before "...").
inline constexpr size_t kMaxEchoedChars = 100;
/// Longest error message sent back at all.
inline constexpr size_t kMaxMessageChars = 2000;

/// `s` itself when it has at most `max` bytes, else its first `max` bytes (not splitting a UTF-8
/// character) followed by "...". For echoing client-supplied values in error messages.
inline std::string clip(std::string_view s, size_t max = kMaxEchoedChars) {
  if (s.size() <= max) return std::string(s);
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n]: first byte cut off
  return std::string(s.substr(0, n)) + "...";
}

class ApiError : public std::runtime_error {
 public:
  /// `status`: HTTP status; `type`: OpenAI error type (e.g. "invalid_request_error");
  /// `param`: the offending request field or "" (JSON null); `code`: a short machine-readable
  /// code or "" (JSON null).
  ApiError(int status, std::string message, std::string type, std::string param = "", std::string code = "")
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

  /// The JSON error body.
  nlohmann::ordered_json body() const { return error_body(what(), type_, param_, code_); }

  /// Builds {"error": {message, type, param, code}}; empty param / code become null. A message
  /// longer than kMaxMessageChars is cut (a safety net: callers clip echoed values themselves).
  static nlohmann::ordered_json error_body(const std::string& message, const std::string& type,
                                          const std::string& param, const std::string& code) {
    nlohmann::ordered_json e = {
        {"message", clip(message, kMaxMessageChars)}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    return nlohmann::ordered_json{{"error", e}};
  }

 private:
  int status_;
  std::string type_, param_, code_;
};

/// 400 invalid_request_error naming `param`.
template <class... Args>
[[noreturn]] void bad_request(const std::string& param, fmt::format_string<Args...> f, Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), "invalid_request_error", param,
                 param.empty() ? "" : "invalid_value");
}

}  // namespace moefold::server
