// Host allow-list, CORS and API-key checks (contract: http_policy.h).
#include "server/http_policy.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/api_error.h"

namespace moefold::server {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool contains_star(const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "*") != v.end(); }

bool contains_ci(const std::vector<std::string>& v, const std::string& x) {
  const std::string lx = lower(x);
  return std::any_of(v.begin(), v.end(), [&](const std::string& e) { return lower(e) == lx; });
}

/// "example.com:8000" -> "example.com", "[::1]:80" -> "::1".
std::string host_name(const std::string& host) {
  if (!host.empty() && host[0] == '[') {
    const size_t end = host.find(']');
    return end == std::string::npos ? host : host.substr(1, end - 1);
  }
  const size_t colon = host.find(':');
  return colon != std::string::npos && host.find(':', colon + 1) == std::string::npos ? host.substr(0, colon) : host;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

bool constant_time_equal(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

std::vector<std::string> parse_list_option(const std::string& value, const std::string& flag) {
  std::vector<std::string> out;
  const std::string t = trim(value);
  if (!t.empty() && t[0] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(t);
    } catch (const std::exception& e) {
      fail("{}: not a JSON list of strings: {}", flag, e.what());
    }
    if (!j.is_array()) fail("{}: not a JSON list of strings", flag);
    for (const auto& x : j) {
      if (!x.is_string()) fail("{}: not a JSON list of strings", flag);
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  size_t start = 0;
  while (start <= t.size()) {
    const size_t comma = t.find(',', start);
    const std::string item = trim(t.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

HttpPolicy::HttpPolicy(HttpPolicyOptions options) : o_(std::move(options)) {}

bool HttpPolicy::origin_allowed(const std::string& origin) const {
  return contains_star(o_.allowed_origins) || std::find(o_.allowed_origins.begin(), o_.allowed_origins.end(), origin) !=
                                                    o_.allowed_origins.end();
}

PolicyDecision HttpPolicy::check(const std::string& method, const std::string& path, const HeaderLookup& header) const {
  PolicyDecision d;
  if (!o_.allowed_hosts.empty() && !contains_star(o_.allowed_hosts)) {
    const std::string host = header("Host");
    if (!contains_ci(o_.allowed_hosts, host_name(host))) {
      d.status = 400;
      d.message = "Invalid Host header '" + clip(host) + "'.";
      d.code = "invalid_host";
      return d;
    }
  }

  const std::string origin = header("Origin");
  const bool cors = cors_enabled() && !origin.empty();
  if (cors && origin_allowed(origin)) {
    d.headers.emplace_back("Access-Control-Allow-Origin", contains_star(o_.allowed_origins) ? "*" : origin);
    if (!contains_star(o_.allowed_origins)) d.headers.emplace_back("Vary", "Origin");
  }
  if (method == "OPTIONS") {
    const std::string wanted_method = header("Access-Control-Request-Method");
    if (!cors_enabled() || origin.empty() || wanted_method.empty()) {
      d.status = 405;
      d.message = "Method OPTIONS is not allowed for " + clip(path) + ".";
      d.code = "method_not_allowed";
      d.headers.clear();
      return d;
    }
    std::string problem;
    if (!origin_allowed(origin)) problem = "origin";
    else if (!contains_star(o_.allowed_methods) && !contains_ci(o_.allowed_methods, wanted_method)) problem = "method";
    const std::string wanted_headers = header("Access-Control-Request-Headers");
    if (problem.empty() && !contains_star(o_.allowed_headers))
      for (const std::string& h : parse_list_option(wanted_headers, "Access-Control-Request-Headers"))
        if (!contains_ci(o_.allowed_headers, h)) problem = "header";
    if (!problem.empty()) {
      d.status = 400;
      d.message = "Disallowed CORS " + problem + ".";
      d.code = "cors_disallowed";
      return d;
    }
    d.status = 200;
    d.headers.emplace_back("Access-Control-Allow-Methods", contains_star(o_.allowed_methods)
                                                                ? "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
                                                                : join(o_.allowed_methods));
    if (!wanted_headers.empty())
      d.headers.emplace_back("Access-Control-Allow-Headers",
                             contains_star(o_.allowed_headers) ? wanted_headers : join(o_.allowed_headers));
    d.headers.emplace_back("Access-Control-Max-Age", "600");
    return d;
  }

  if (!o_.api_key.empty() && path != "/health" && !(o_.metrics_without_key && path == "/metrics")) {
    const std::string auth = header("Authorization");
    const std::string prefix = "Bearer ";
    const bool bearer = auth.size() >= prefix.size() && lower(auth.substr(0, prefix.size())) == "bearer ";
    if (!bearer || !constant_time_equal(trim(auth.substr(prefix.size())), o_.api_key)) {
      d.status = 401;
      d.message = bearer ? "Incorrect API key provided." : "Missing API key: send 'Authorization: Bearer <key>'.";
      d.code = "invalid_api_key";
      d.headers.emplace_back("WWW-Authenticate", "Bearer");
      return d;
    }
  }
  return d;
}

}  // namespace moefold::server
