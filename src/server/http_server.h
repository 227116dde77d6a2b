// HttpApi: the OpenAI-compatible HTTP front end on cpp-httplib.
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
// GET /metrics. Each request is parsed and validated on its handler thread (errors: OpenAI-style
// JSON with status 400 / 503 / 500), submitted to the Engine, and answered either as one JSON body
// or as a Server-Sent-Events stream (`data: {...}\n\n` chunks, then `data: [DONE]\n\n`). A stream
// whose client goes away (a write fails) cancels its request, which frees its KV pages and state
// slot at the engine's next step.
//
// In front of the routes: the connection reader (http_connection.h: header / body limits, a
// receive deadline, pipelining) and the access policy (http_policy.h: Host allow-list, CORS, API
// key). Each finished request is logged as one line on stderr.
#pragma once
#include <memory>
#include <string>

#include "server/engine.h"
#include "server/http_framing.h"
#include "server/http_policy.h"
#include "server/metrics.h"
#include "server/request_parser.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace moefold::server {

class ConnectionServer;

struct HttpOptions {
  int http_threads = 512;  ///< handler threads (each open stream holds one while it runs)
  HttpLimits limits;
  HttpPolicyOptions policy;
  bool log_requests = true;  ///< one stderr line per finished request
};

class HttpApi {
 public:
  /// `engine`, `info` and `metrics` must outlive the server. Throws Error for bad options.
  HttpApi(Engine& engine, ModelInfo info, Metrics& metrics, HttpOptions options);
  ~HttpApi();

  /// Binds the listening socket (port 0: any free port). Returns the port. Throws Error.
  int bind(const std::string& host, int port);
  /// Serves until stop() is called, then closes every connection (handlers still running must be
  /// ending: stop the engine first). Returns false if the server failed.
  bool listen();
  /// Stops listening (thread-safe; callable from a signal-handling thread).
  void stop();

 private:
  void generate(Api api, const std::string& endpoint, const httplib::Request& req, httplib::Response& res);
  void respond_error(const std::string& endpoint, int status, const nlohmann::ordered_json& body, httplib::Response& res);

  Engine& engine_;
  ModelInfo info_;
  Metrics& metrics_;
  HttpOptions options_;
  HttpPolicy policy_;
  std::unique_ptr<ConnectionServer> svr_;
  int listen_fd_ = -1;
};

}  // namespace moefold::server
