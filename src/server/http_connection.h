// ConnectionServer: cpp-httplib's Server with its own connection handling in front.
//
// cpp-httplib (0.11) gives every accepted connection a handler thread that then waits for the
// request's bytes, so a few hundred clients trickling headers hold every thread; it has no limit
// on the number or total size of headers; and it drops a request pipelined behind another (its
// per-request read buffer is discarded). Here instead:
//  - one reader thread (epoll) receives every connection's bytes and buffers a request until it
//    is complete (http_framing.h), enforcing HttpLimits: header count and bytes (431), body size
//    (413), malformed framing such as two Content-Length headers (400), and a deadline from a
//    request's first byte to its last (408, then the connection is closed);
//  - only complete requests reach the handler threads, which run httplib's own request
//    processing (routing, handlers, streaming responses) on the buffered bytes;
//  - bytes after a request stay in the connection's buffer: a pipelined request is answered next;
//  - idle keep-alive connections wait in the reader, not on a thread, and close after
//    keep_alive_timeout.
// Errors found by the reader are answered with an OpenAI-style JSON body and close the
// connection.
#pragma once
#include <httplib.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http_framing.h"

namespace moefold::server {

class ConnectionServer : public httplib::Server {
 public:
  /// `handler_threads`: threads that run handlers (each open stream holds one while it runs).
  ConnectionServer(HttpLimits limits, size_t handler_threads);
  ~ConnectionServer() override;

  /// After listen_after_bind() has returned (stop() was called): closes every connection and
  /// joins the reader and the handler threads (handlers still running must be ending, e.g. the
  /// engine was stopped). Idempotent.
  void shutdown_connections();

  /// A line per request the reader itself rejected: (status, message). Set before listening.
  std::function<void(int, const std::string&)> on_reader_error;

  struct Connection;

 private:
  // Called by httplib's accept loop (through an inline task queue) for each new socket: hands
  // it to the reader and returns at once.
  bool process_and_close_socket(socket_t sock) override;

  void reader_loop();
  void adopt(std::shared_ptr<Connection> c);  // reader thread
  void on_readable(const std::shared_ptr<Connection>& c);
  void dispatch(std::shared_ptr<Connection> c);  // reader: complete request -> handler thread
  void serve(const std::shared_ptr<Connection>& c);  // handler thread
  void park(std::shared_ptr<Connection> c);     // handler thread -> reader
  void reject(const std::shared_ptr<Connection>& c, int status, const std::string& message);
  void close_now(const std::shared_ptr<Connection>& c);
  void sweep();
  void wake();

  HttpLimits limits_;
  size_t handler_threads_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> open_{0};
  std::mutex mu_;
  std::vector<std::shared_ptr<Connection>> incoming_;  // guarded by mu_
  std::unordered_map<int, std::shared_ptr<Connection>> conns_;  // reader thread only
  std::unique_ptr<httplib::ThreadPool> pool_;
  std::thread reader_;
  bool shut_ = false;
};

}  // namespace moefold::server
