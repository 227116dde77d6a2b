// Streaming requests to OpenAI-compatible servers (contract: openai_client.h).
#include "bench/openai_client.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>

#include "bench/stream_recorder.h"
#include "core/error.h"

namespace moefold::bench {

BaseUrl split_base_url(const std::string& url) {
  std::string scheme = "http", rest = url;
  if (const size_t p = url.find("://"); p != std::string::npos) {
    scheme = url.substr(0, p);
    std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](unsigned char c) { return std::tolower(c); });
    rest = url.substr(p + 3);
  }
  MOEFOLD_CHECK(scheme == "http" || scheme == "https", "base URL {}: the scheme must be http or https", url);
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  std::string host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    MOEFOLD_CHECK(close != std::string::npos, "base URL {}: unclosed '[' in the host", url);
    host = authority.substr(0, close + 1);
    if (close + 1 < authority.size()) {
      MOEFOLD_CHECK(authority[close + 1] == ':', "base URL {}: expected ':' after the IPv6 address", url);
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  MOEFOLD_CHECK(!host.empty() && host != "[]", "base URL {}: no host", url);
  if (!port.empty() || authority.find(':') != std::string::npos) {
    const bool digits = !port.empty() && port.size() <= 5 &&
                        std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
    MOEFOLD_CHECK(digits && std::stoi(port) >= 1 && std::stoi(port) <= 65535,
                  "base URL {}: the port must be a number in 1..65535", url);
  }
  return {scheme + "://" + authority, path};
}

bool is_chat_endpoint(const std::string& endpoint) {
  const std::string suffix = "chat/completions";
  std::string e = endpoint;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e.size() >= suffix.size() && e.compare(e.size() - suffix.size(), suffix.size(), suffix) == 0;
}

nlohmann::json request_body(const Target& target, const SampleRequest& req, const RequestOptions& opt) {
  using Json = nlohmann::json;
  Json body = Json::object();
  body["model"] = target.model;
  if (is_chat_endpoint(target.endpoint)) {
    MOEFOLD_CHECK(req.prompt_ids.empty(), "token-id prompts need a completions endpoint, not {}", target.endpoint);
    if (req.messages.empty()) {
      body["messages"] = Json::array({Json{{"role", "user"}, {"content", req.prompt}}});
    } else {
      body["messages"] = Json::array();
      for (const auto& [role, content] : req.messages) body["messages"].push_back(Json{{"role", role}, {"content", content}});
    }
    body["max_completion_tokens"] = req.output_len;
  } else {
    if (req.prompt_ids.empty())
      body["prompt"] = req.prompt;
    else
      body["prompt"] = req.prompt_ids;
    body["max_tokens"] = req.output_len;
  }
  body["temperature"] = opt.temperature;
  body["stream"] = true;
  body["stream_options"] = Json{{"include_usage", true}};
  if (opt.ignore_eos) body["ignore_eos"] = true;
  for (const auto& [k, v] : opt.extra_body.items()) body[k] = v;
  return body;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t, Clock::time_point zero) { return std::chrono::duration<double>(t - zero).count(); }

std::unique_ptr<httplib::Client> make_client(const Target& target, const BaseUrl& url) {
  auto cli = std::make_unique<httplib::Client>(url.scheme_host_port);
  cli->set_connection_timeout(10, 0);
  const auto t = std::chrono::duration<double>(target.timeout_s);
  cli->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
  cli->set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
  return cli;
}

httplib::Headers headers(const Target& target) {
  httplib::Headers h;
  if (!target.api_key.empty()) h.emplace("Authorization", "Bearer " + target.api_key);
  return h;
}

/// What a cpp-httplib failure means for the user.
std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (nothing listening, or the host is unreachable)";
    case httplib::Error::ConnectionTimeout: return "the connection timed out";
    case httplib::Error::Read: return "reading the response failed (connection closed, or --request-timeout passed)";
    case httplib::Error::Write: return "sending the request failed (connection closed)";
    case httplib::Error::SSLConnection: return "the TLS connection failed";
    case httplib::Error::SSLServerVerification: return "the server's TLS certificate was not accepted";
    default: return httplib::to_string(e);
  }
}

/// The `error.message` of an OpenAI error body, else the body itself (shortened).
std::string error_message(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 300);
}

}  // namespace

ModelList fetch_models(const Target& target) {
  ModelList out;
  std::string url = target.base_url;
  try {
    const BaseUrl base = split_base_url(target.base_url);
    url = base.scheme_host_port + base.path_prefix + "/v1/models";
    auto cli = make_client(target, base);
    cli->set_read_timeout(30, 0);
    auto res = cli->Get(base.path_prefix + "/v1/models", headers(target));
    if (!res) {
      out.error = "cannot reach " + url + ": " + describe(res.error());
      return out;
    }
    out.reachable = true;
    if (res->status != 200) {
      out.error = "GET " + url + ": HTTP " + std::to_string(res->status) + ": " + error_message(res->body);
      return out;
    }
    const auto j = nlohmann::json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array()) {
      out.error = "GET " + url + ": the answer is not a model list";
      return out;
    }
    for (const auto& m : j["data"])
      if (m.is_object() && m.contains("id") && m["id"].is_string()) out.ids.push_back(m["id"].get<std::string>());
    if (out.ids.empty()) out.error = "GET " + url + ": the server lists no model";
  } catch (const std::exception& e) {
    out.error = url + ": " + e.what();
  }
  return out;
}

RequestOutput send_request(const Target& target, const SampleRequest& req, const RequestOptions& opt,
                           Clock::time_point run_start) {
  const auto start = Clock::now();
  RequestOutput failed;
  failed.start_s = seconds(start, run_start);
  failed.prompt_tokens = req.prompt_len;
  auto fail_with = [&](std::string msg) {
    failed.error = std::move(msg);
    failed.latency_s = seconds(Clock::now(), start);
    return failed;
  };
  try {
    const BaseUrl base = split_base_url(target.base_url);
    auto cli = make_client(target, base);
    httplib::Request hreq;
    hreq.method = "POST";
    hreq.path = base.path_prefix + target.endpoint;
    hreq.headers = headers(target);
    hreq.headers.emplace("Content-Type", "application/json");
    hreq.headers.emplace("Accept", "text/event-stream");
    hreq.body = request_body(target, req, opt).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    StreamRecorder rec(failed.start_s);
    int status = 0;
    bool event_stream = false;
    std::string other_body;  // an error body, or a body that is not an event stream
    hreq.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      event_stream = r.get_header_value("Content-Type").rfind("text/event-stream", 0) == 0;
      return true;
    };
    hreq.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status == 200 && event_stream)
        rec.on_bytes(std::string_view(data, n), seconds(Clock::now(), run_start));
      else if (other_body.size() < 4096)
        other_body.append(data, std::min(n, 4096 - other_body.size()));
      return true;
    };
    httplib::Response hres;
    httplib::Error err = httplib::Error::Success;
    const bool ok = cli->send(hreq, hres, err);
    if (status != 0 && status != 200) return fail_with("HTTP " + std::to_string(status) + ": " + error_message(other_body));
    if (!ok) {
      std::string msg = "request to " + base.scheme_host_port + hreq.path + " failed: " + describe(err);
      if (status == 200) msg += " (mid-stream)";
      return fail_with(msg);
    }
    if (!event_stream) return fail_with("the server answered with Content-Type '" + hres.get_header_value("Content-Type") +
                                        "' instead of an event stream");
    return rec.finish(seconds(Clock::now(), run_start), req.prompt_len);
  } catch (const std::exception& e) {
    return fail_with(e.what());
  }
}

}  // namespace moefold::bench
