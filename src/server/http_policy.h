// Access rules of the HTTP API, checked before a request is routed: the Host allow-list, CORS
// (only when allowed origins are configured, as vLLM) and the API key. Pure functions of the
// request's method, path and headers, so that they are unit-testable without a socket.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moefold::server {

struct HttpPolicyOptions {
  /// Bearer token every endpoint except /health requires ("" = no authentication). The key is
  /// compared in constant time.
  std::string api_key;
  /// With an API key: leave GET /metrics open (a Prometheus scraper on a private network).
  bool metrics_without_key = false;
  /// CORS: origins allowed ("*" = any). Empty: no CORS headers at all, and OPTIONS is 405.
  std::vector<std::string> allowed_origins;
  /// CORS methods / request headers allowed in a preflight ("*" = any).
  std::vector<std::string> allowed_methods{"*"};
  std::vector<std::string> allowed_headers{"*"};
  /// Host header values accepted (names without port, case-insensitive; "*" or empty = any).
  std::vector<std::string> allowed_hosts;
};

/// What to do with a request before routing it.
struct PolicyDecision {
  int status = 0;  ///< 0: go on and route the request; else answer at once with this status
  std::string message;  ///< the error message (status >= 400)
  std::string code;     ///< OpenAI-style error code (status >= 400)
  /// Headers to add to the response, whatever it is (CORS; WWW-Authenticate on a 401).
  std::vector<std::pair<std::string, std::string>> headers;
};

/// Constant-time equality (time depends on the length of `expected` only).
bool constant_time_equal(std::string_view given, std::string_view expected);

/// Splits a list option: a JSON array of strings ('["a","b"]') or comma-separated values.
/// Throws moefold::Error for a malformed JSON array.
std::vector<std::string> parse_list_option(const std::string& value, const std::string& flag);

class HttpPolicy {
 public:
  explicit HttpPolicy(HttpPolicyOptions options);

  /// Looks a request header up by name (case-insensitively); "" when absent.
  using HeaderLookup = std::function<std::string(const std::string&)>;

  /// In order: Host allow-list (400), CORS (a preflight OPTIONS is answered here: 200 or 400;
  /// OPTIONS without CORS is 405), API key (401).
  PolicyDecision check(const std::string& method, const std::string& path, const HeaderLookup& header) const;

  bool cors_enabled() const { return !o_.allowed_origins.empty(); }

 private:
  bool origin_allowed(const std::string& origin) const;
  HttpPolicyOptions o_;
};

}  // namespace moefold::server
