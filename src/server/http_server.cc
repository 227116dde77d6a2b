// OpenAI-compatible HTTP routes and SSE streaming (contract: http_server.h).
#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>

#include <cstdio>

#include "core/error.h"
#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/http_connection.h"
#include "server/responses.h"

namespace moefold::server {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(200);

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// What the request log line of the request on this handler thread reports (httplib calls the
/// logger on the thread that ran the request, after its last byte went out).
struct RequestLog {
  Clock::time_point start;
  int64_t prompt_tokens = -1, completion_tokens = -1;  // -1: not a generation request
};
thread_local RequestLog t_log;

/// A client-supplied string made safe for a log line: clipped, control bytes written as \xHH
/// (a path may decode to newlines or terminal escapes).
std::string loggable(const std::string& s) {
  std::string out;
  for (unsigned char c : clip(s)) {
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  return out;
}

std::string sse(const Json& j) { return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n"; }

/// Everything a stream needs between calls of its content provider.
struct StreamState {
  std::shared_ptr<ParsedRequest> req;
  std::shared_ptr<RequestChannel> channel;
  std::unique_ptr<ResponseBuilder> builder;
  std::string endpoint;
  Clock::time_point start;
  size_t num_choices = 0;
  std::vector<std::vector<GeneratedToken>> pending;  ///< tokens whose logprobs are not yet sent
  std::vector<int64_t> text_offset;
  std::vector<bool> finished;
  std::vector<bool> seen_first;  ///< the choice's first event was seen (its cached_tokens counted)
  std::vector<std::unique_ptr<ChatOutputParser>> parsers;  ///< per choice, when the output is parsed
  size_t num_finished = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  ///< prefix-cache hits of the first choice of every prompt
  bool started = false, done = false;
  std::atomic<bool> accounted{false};
};

/// Counts a stream in the metrics exactly once: before its last bytes go out (so that a client
/// that reads /metrics right after [DONE] sees it), or when the stream is torn down early.
void account(StreamState& st, Metrics& metrics) {
  if (st.accounted.exchange(true)) return;
  t_log.prompt_tokens = st.req->prompt_tokens();
  t_log.completion_tokens = st.completion_tokens;
  metrics.count_request(st.endpoint, 200);
  metrics.add_tokens(st.req->prompt_tokens(), st.completion_tokens);
  metrics.observe_e2e(seconds_since(st.start));
}

}  // namespace

HttpApi::HttpApi(Engine& engine, ModelInfo info, Metrics& metrics, HttpOptions options)
    : engine_(engine), info_(std::move(info)), metrics_(metrics), options_(std::move(options)),
      policy_(options_.policy),
      svr_(std::make_unique<ConnectionServer>(options_.limits, size_t(std::max(4, options_.http_threads)))) {
  ConnectionServer& s = *svr_;
  s.set_keep_alive_max_count(1000);
  s.set_tcp_nodelay(true);  // each SSE chunk goes out at once (no Nagle / delayed-ACK stalls)
  // Only SO_REUSEADDR (httplib's default adds SO_REUSEPORT, which would let a second server bind
  // the same port silently). Remember the socket to raise the listen backlog after bind.
  s.set_socket_options([this](int fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = fd;
  });

  s.on_reader_error = [this](int status, const std::string& message) {
    if (options_.log_requests) std::fprintf(stderr, "moefold serve: rejected a request: %d %s\n", status, message.c_str());
  };
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_log = RequestLog{Clock::now()};
    const PolicyDecision d =
        policy_.check(req.method, req.path, [&](const std::string& name) { return req.get_header_value(name.c_str()); });
    for (const auto& [k, v] : d.headers) res.set_header(k, v);
    if (d.status == 0) return httplib::Server::HandlerResponse::Unhandled;
    res.status = d.status;
    if (d.status >= 400) {
      const char* type = d.status == 401 ? "authentication_error" : "invalid_request_error";
      res.set_content(ApiError::error_body(d.message, type, "", d.code).dump(-1, ' ', false, Json::error_handler_t::replace),
                      "application/json");
    }
    // The body (if any) was not read; the connection reader drops it with the request.
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (!options_.log_requests) return;
    if (res.status == 200 && req.method == "GET" && (req.path == "/health" || req.path == "/metrics")) return;
    const double secs = t_log.start == Clock::time_point{} ? 0.0 : seconds_since(t_log.start);
    std::string tokens;
    if (t_log.prompt_tokens >= 0)
      tokens = fmt::format(" prompt_tokens={} completion_tokens={}", t_log.prompt_tokens, t_log.completion_tokens);
    std::fprintf(stderr, "moefold serve: %s:%d \"%s %s\" %d%s time=%.3fs\n", req.remote_addr.c_str(), req.remote_port,
                 loggable(req.method).c_str(), loggable(req.path).c_str(), res.status, tokens.c_str(), secs);
    t_log = RequestLog{};
  });

  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(Api::kChat, "/v1/chat/completions", req, res);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(Api::kCompletions, "/v1/completions", req, res);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const int64_t now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    Json m = {{"id", info_.name},         {"object", "model"},     {"created", now},
              {"owned_by", "moefold"},    {"root", info_.name},    {"max_model_len", info_.max_model_len}};
    res.set_content(Json{{"object", "list"}, {"data", Json::array({m})}}.dump(), "application/json");
    metrics_.count_request("/v1/models", 200);
  });
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const char* type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    std::string msg = res.status == 404 ? "No route for " + req.method + " " + req.path + "."
                                        : "HTTP error " + std::to_string(res.status) + ".";
    res.set_content(ApiError::error_body(msg, type, "", "").dump(), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(ApiError::error_body(msg, "internal_server_error", "", "").dump(), "application/json");
  });
}

HttpApi::~HttpApi() = default;

int HttpApi::bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = svr_->bind_to_any_port(host);
    if (bound <= 0) fail("cannot bind {}: no free port", host);
  } else if (!svr_->bind_to_port(host, port)) {
    fail("cannot bind {}:{} (in use, or not a local address)", host, port);
  }
  // httplib listens with a backlog of 5; many clients connecting at once would see SYN retries.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  return bound;
}

bool HttpApi::listen() {
  const bool ok = svr_->listen_after_bind();
  svr_->shutdown_connections();
  return ok;
}

void HttpApi::stop() { svr_->stop(); }

void HttpApi::respond_error(const std::string& endpoint, int status, const nlohmann::ordered_json& body,
                            httplib::Response& res) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "1");
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
  metrics_.count_request(endpoint, status);
}

void HttpApi::generate(Api api, const std::string& endpoint, const httplib::Request& hreq, httplib::Response& res) {
  const auto start = Clock::now();
  const int64_t arrival = unix_now();
  std::shared_ptr<ParsedRequest> req;
  std::shared_ptr<RequestChannel> channel;
  try {
    req = std::make_shared<ParsedRequest>(parse_request(api, hreq.body, info_));
    req->created = arrival;
    channel = engine_.submit(req->choices());
  } catch (const ApiError& e) {
    respond_error(endpoint, e.status(), e.body(), res);
    return;
  }
  const size_t num_choices = req->prompts.size() * size_t(req->n);

  if (!req->stream) {
    std::vector<ChoiceResult> results(num_choices);
    size_t finished = 0;
    int64_t cached_tokens = 0;  // prefix-cache hits of the first choice of every prompt
    std::vector<ChoiceEvent> events;
    while (finished < num_choices) {
      events.clear();
      channel->wait_pop(events, kPoll);
      for (ChoiceEvent& e : events) {
        ChoiceResult& r = results[size_t(e.index)];
        if (r.tokens.empty() && !e.tokens.empty() && e.index % req->n == 0) cached_tokens += e.cached_tokens;
        r.text += e.text;
        for (auto& t : e.tokens) r.tokens.push_back(std::move(t));
        if (!e.error.empty()) r.error = e.error;
        if (e.finished()) {
          r.finish = e.finish;
          ++finished;
        }
      }
    }
    int64_t completion_tokens = 0;
    for (const ChoiceResult& r : results) {
      completion_tokens += int64_t(r.tokens.size());
      if (!r.error.empty()) {
        respond_error(endpoint, 500, ApiError::error_body(r.error, "internal_server_error", "", ""), res);
        metrics_.add_tokens(req->prompt_tokens(), completion_tokens);
        return;
      }
    }
    if (req->parses_output()) {
      const ChatOutputOptions po = chat_output_options(*req);
      for (ChoiceResult& r : results) r.message = ChatOutputParser(po).parse(r.text);
    }
    ResponseBuilder builder(*req, *info_.tokenizer);
    builder.set_cached_tokens(cached_tokens);
    res.set_content(builder.response(results).dump(-1, ' ', false, Json::error_handler_t::replace),
                    "application/json");
    t_log.prompt_tokens = req->prompt_tokens();
    t_log.completion_tokens = completion_tokens;
    metrics_.count_request(endpoint, 200);
    metrics_.add_tokens(req->prompt_tokens(), completion_tokens);
    metrics_.observe_e2e(seconds_since(start));
    return;
  }

  auto st = std::make_shared<StreamState>();
  st->req = req;
  st->channel = channel;
  st->builder = std::make_unique<ResponseBuilder>(*req, *info_.tokenizer);
  st->endpoint = endpoint;
  st->start = start;
  st->num_choices = num_choices;
  st->pending.resize(num_choices);
  st->text_offset.assign(num_choices, 0);
  st->finished.assign(num_choices, false);
  st->seen_first.assign(num_choices, false);
  if (req->parses_output()) {
    const ChatOutputOptions po = chat_output_options(*req);
    for (size_t i = 0; i < num_choices; ++i) st->parsers.push_back(std::make_unique<ChatOutputParser>(po));
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (st->done) {
          sink.done();
          return true;
        }
        if (!st->started) {
          st->started = true;
          if (st->req->api == Api::kChat)
            for (size_t i = 0; i < st->num_choices; ++i)
              if (!write(sse(st->builder->role_chunk(int32_t(i))))) return false;
          return true;
        }
        std::vector<ChoiceEvent> events;
        st->channel->wait_pop(events, kPoll);
        for (ChoiceEvent& e : events) {
          const size_t i = size_t(e.index);
          if (!st->seen_first[i] && !e.tokens.empty()) {
            st->seen_first[i] = true;
            if (int32_t(i) % st->req->n == 0) st->cached_tokens += e.cached_tokens;
          }
          st->completion_tokens += int64_t(e.tokens.size());
          for (auto& t : e.tokens) st->pending[i].push_back(std::move(t));
          if (!e.error.empty()) {
            if (!write(sse(ApiError::error_body(e.error, "internal_server_error", "", "")))) return false;
          } else if (!st->parsers.empty()) {
            ChatOutputParser& p = *st->parsers[i];
            OutputDelta d = p.feed(e.text);
            if (e.finished()) d.append(p.finish());
            if (!d.empty() || e.finish != FinishReason::kNone) {
              Json c = st->builder->delta_chunk(int32_t(i), d, st->pending[i], e.finish, p.num_tool_calls() > 0);
              st->pending[i].clear();
              if (!write(sse(c))) return false;
            }
          } else if (!e.text.empty() || e.finish != FinishReason::kNone) {
            Json c = st->builder->chunk(int32_t(i), e.text, st->pending[i], e.finish, st->text_offset[i]);
            st->pending[i].clear();
            if (!write(sse(c))) return false;
          }
          if (e.finished() && !st->finished[i]) {
            st->finished[i] = true;
            ++st->num_finished;
          }
        }
        if (st->num_finished == st->num_choices) {
          st->done = true;
          account(*st, metrics_);
          st->builder->set_cached_tokens(st->cached_tokens);
          if (st->req->include_usage && !write(sse(st->builder->usage_chunk(st->completion_tokens)))) return false;
          if (!write("data: [DONE]\n\n")) return false;
          sink.done();
        }
        return true;
      },
      [this, st](bool success) {
        if (!st->done) {
          // The client went away (or the write timed out): drop the request.
          st->channel->cancel();
          engine_.notify();
        }
        account(*st, metrics_);
      });
}

}  // namespace moefold::server
