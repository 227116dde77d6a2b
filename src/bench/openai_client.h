// The HTTP side of `moefold bench serve`: requests to any OpenAI-compatible server (moefold, vLLM,
// SGLang, ...) over cpp-httplib, streamed (`stream: true`, `stream_options.include_usage`) and
// timed by a StreamRecorder as the bytes arrive.
#pragma once
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/datasets.h"
#include "bench/serve_metrics.h"

namespace moefold::bench {

/// One server to benchmark.
struct Target {
  std::string base_url;                    ///< scheme://host[:port][/prefix], e.g. http://127.0.0.1:8000
  std::string endpoint = "/v1/completions";  ///< appended to base_url; chat when it ends in chat/completions
  std::string model;                       ///< the `model` field of every request
  std::string api_key;                     ///< sent as `Authorization: Bearer` when not empty
  double timeout_s = 3600;                 ///< longest wait for the next bytes of a response
};

/// base_url split into what cpp-httplib connects to and the path prefix put before every route.
struct BaseUrl {
  std::string scheme_host_port;  ///< e.g. "http://127.0.0.1:8000"
  std::string path_prefix;       ///< e.g. "" or "/proxy" (no trailing slash)
};

/// Splits `url` ("http://host:port/prefix/", "https://host", or "host:port" meaning http). Throws
/// moefold::Error for another scheme, an empty host or a port outside 1..65535.
BaseUrl split_base_url(const std::string& url);

/// True if `endpoint` is a chat endpoint (ends in "chat/completions").
bool is_chat_endpoint(const std::string& endpoint);

/// Fields every request carries besides the prompt.
struct RequestOptions {
  bool ignore_eos = false;   ///< vLLM's extra field `ignore_eos` (moefold and vLLM honour it)
  double temperature = 0;    ///< 0: greedy
  nlohmann::json extra_body = nlohmann::json::object();  ///< merged into the body last (may override)
};

/// The JSON body for `req` on `target`: completions {model, prompt (text or token ids), max_tokens}
/// or chat {model, messages: req.messages, or one user message with the prompt, max_completion_tokens}, plus temperature,
/// stream: true, stream_options.include_usage, ignore_eos when set, and extra_body. Throws
/// moefold::Error for token ids on a chat endpoint.
nlohmann::json request_body(const Target& target, const SampleRequest& req, const RequestOptions& opt);

/// The answer of GET {base_url}/v1/models.
struct ModelList {
  bool reachable = false;        ///< a connection was made and an HTTP answer came back
  std::vector<std::string> ids;  ///< data[].id in order (empty on any failure)
  std::string error;             ///< what went wrong, naming the URL (empty on success)
};

/// Lists the served models. Never throws: failures are described in `error`.
ModelList fetch_models(const Target& target);

/// Sends `req` to `target` and times it; `run_start` is the zero of `start_s` and the other times.
/// Never throws: a refused connection, an HTTP error status (with the server's message), a broken
/// or empty stream all give success = false and a message in `error`.
RequestOutput send_request(const Target& target, const SampleRequest& req, const RequestOptions& opt,
                           std::chrono::steady_clock::time_point run_start);

}  // namespace moefold::bench
