// HttpPolicy: API key, CORS and the Host allow-list, decided from method, path and headers.
#include "server/http_policy.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace moefold::server {
namespace {

PolicyDecision check(const HttpPolicy& p, const std::string& method, const std::string& path,
                     std::map<std::string, std::string> headers = {}) {
  return p.check(method, path, [&](const std::string& name) {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  });
}

std::string header(const PolicyDecision& d, const std::string& name) {
  for (const auto& [k, v] : d.headers)
    if (k == name) return v;
  return "";
}

TEST(HttpPolicy, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secreT", "secret"));
  EXPECT_FALSE(constant_time_equal("secret1", "secret"));
  EXPECT_FALSE(constant_time_equal("secre", "secret"));
  EXPECT_FALSE(constant_time_equal("", "secret"));
}

TEST(HttpPolicy, ApiKeyOnEveryEndpointButHealth) {
  HttpPolicyOptions o;
  o.api_key = "k3y";
  const HttpPolicy p(o);
  for (const char* path : {"/v1/models", "/v1/completions", "/metrics", "/nope"}) {
    const PolicyDecision d = check(p, "GET", path);
    EXPECT_EQ(d.status, 401) << path;
    EXPECT_EQ(d.code, "invalid_api_key");
    EXPECT_EQ(header(d, "WWW-Authenticate"), "Bearer");
    EXPECT_EQ(check(p, "GET", path, {{"Authorization", "Bearer wrong"}}).status, 401);
    EXPECT_EQ(check(p, "GET", path, {{"Authorization", "k3y"}}).status, 401);
    EXPECT_EQ(check(p, "GET", path, {{"Authorization", "Bearer k3y"}}).status, 0);
    EXPECT_EQ(check(p, "GET", path, {{"Authorization", "bearer k3y"}}).status, 0);
  }
  EXPECT_EQ(check(p, "GET", "/health").status, 0);
  o.metrics_without_key = true;
  EXPECT_EQ(check(HttpPolicy(o), "GET", "/metrics").status, 0);
  EXPECT_EQ(check(HttpPolicy(o), "GET", "/v1/models").status, 401);
  EXPECT_EQ(check(HttpPolicy(HttpPolicyOptions{}), "GET", "/v1/models").status, 0);
}

TEST(HttpPolicy, NoCorsHeadersUnlessOriginsAreGiven) {
  const HttpPolicy none{HttpPolicyOptions{}};
  const PolicyDecision d = check(none, "POST", "/v1/completions", {{"Origin", "https://evil.example"}});
  EXPECT_EQ(d.status, 0);
  EXPECT_TRUE(d.headers.empty());
  const PolicyDecision pre = check(none, "OPTIONS", "/v1/completions",
                                   {{"Origin", "https://a.example"}, {"Access-Control-Request-Method", "POST"}});
  EXPECT_EQ(pre.status, 405);
  EXPECT_TRUE(pre.headers.empty());
}

TEST(HttpPolicy, CorsWithAllowedOrigins) {
  HttpPolicyOptions o;
  o.allowed_origins = {"https://app.example"};
  o.allowed_methods = {"GET", "POST"};
  o.allowed_headers = {"Authorization", "Content-Type"};
  o.api_key = "k";
  const HttpPolicy p(o);
  const std::map<std::string, std::string> pre = {{"Origin", "https://app.example"},
                                                  {"Access-Control-Request-Method", "POST"},
                                                  {"Access-Control-Request-Headers", "authorization, content-type"}};
  const PolicyDecision ok = check(p, "OPTIONS", "/v1/chat/completions", pre);  // no key needed for a preflight
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(header(ok, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(ok, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_NE(header(ok, "Access-Control-Allow-Headers"), "");
  auto bad = pre;
  bad["Origin"] = "https://other.example";
  EXPECT_EQ(check(p, "OPTIONS", "/v1/chat/completions", bad).status, 400);
  bad = pre;
  bad["Access-Control-Request-Method"] = "DELETE";
  EXPECT_EQ(check(p, "OPTIONS", "/v1/chat/completions", bad).status, 400);
  bad = pre;
  bad["Access-Control-Request-Headers"] = "x-custom";
  EXPECT_EQ(check(p, "OPTIONS", "/v1/chat/completions", bad).status, 400);
  // A simple request from an allowed origin carries the header (also on its 401).
  const PolicyDecision simple = check(p, "GET", "/v1/models", {{"Origin", "https://app.example"}});
  EXPECT_EQ(simple.status, 401);
  EXPECT_EQ(header(simple, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(check(p, "GET", "/v1/models", {{"Origin", "https://other.example"}}), "Access-Control-Allow-Origin"),
            "");
  o.allowed_origins = {"*"};
  EXPECT_EQ(header(check(HttpPolicy(o), "GET", "/health", {{"Origin", "https://x"}}), "Access-Control-Allow-Origin"),
            "*");
}

TEST(HttpPolicy, HostAllowList) {
  HttpPolicyOptions o;
  o.allowed_hosts = {"localhost", "api.example"};
  const HttpPolicy p(o);
  EXPECT_EQ(check(p, "GET", "/health", {{"Host", "localhost:8000"}}).status, 0);
  EXPECT_EQ(check(p, "GET", "/health", {{"Host", "API.example"}}).status, 0);
  const PolicyDecision d = check(p, "GET", "/health", {{"Host", "evil.example"}});
  EXPECT_EQ(d.status, 400);
  EXPECT_EQ(d.code, "invalid_host");
  EXPECT_EQ(check(p, "GET", "/health").status, 400);
  o.allowed_hosts = {"[::1]"};
  EXPECT_EQ(check(HttpPolicy(o), "GET", "/health", {{"Host", "[::1]:80"}}).status, 400);
  o.allowed_hosts = {"::1"};
  EXPECT_EQ(check(HttpPolicy(o), "GET", "/health", {{"Host", "[::1]:80"}}).status, 0);
}

TEST(HttpPolicy, ListOptions) {
  EXPECT_EQ(parse_list_option("", "--x"), std::vector<std::string>{});
  EXPECT_EQ(parse_list_option("a, b,,c", "--x"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(parse_list_option(R"(["*"])", "--x"), std::vector<std::string>{"*"});
  EXPECT_THROW(parse_list_option("[1]", "--x"), Error);
  EXPECT_THROW(parse_list_option("[", "--x"), Error);
}

}  // namespace
}  // namespace moefold::server
