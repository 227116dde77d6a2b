// Connection reader and request dispatch in front of cpp-httplib (contract: http_connection.h).
#include "server/http_connection.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "server/api_error.h"

namespace moefold::server {

using Clock = std::chrono::steady_clock;

struct ConnectionServer::Connection {
  int fd = -1;
  std::string buf;  ///< received bytes of the current request (and any pipelined after it)
  FrameScan scan;
  Clock::time_point idle_since, first_byte;
  bool continue_sent = false;
  bool eof = false;      ///< the client half-closed after its request: answer, then close
  bool closing = false;  ///< an error was sent; draining input until close_by
  Clock::time_point close_by;
  size_t served = 0;
};

namespace {

constexpr int kTickMs = 50;                // reader wake-up period (deadline resolution)
constexpr size_t kReadChunk = 64 << 10;    // bytes per recv
constexpr size_t kReadPerEvent = 1 << 20;  // fairness: at most this much per connection per wake-up
constexpr auto kLinger = std::chrono::seconds(1);  // after an error, how long input is drained

/// Runs each task at once on the caller's thread: httplib's accept loop then only hands sockets
/// over (process_and_close_socket returns immediately).
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

const char* reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

const char* code_of(int status) {
  switch (status) {
    case 408: return "request_timeout";
    case 413: return "body_too_large";
    case 431: return "headers_too_large";
    case 501: return "unsupported_transfer_encoding";
    case 503: return "too_many_connections";
    default: return "bad_http_request";
  }
}

std::string error_response(int status, const std::string& message) {
  const char* type = status == 503 ? "service_unavailable" : "invalid_request_error";
  const std::string body = ApiError::error_body(message, type, "", code_of(status)).dump();
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                     status, reason(status), body.size(), body);
}

void send_best_effort(int fd, const std::string& data) {
  (void)!::send(fd, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void close_socket(int fd) {
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

void ip_and_port(int fd, bool remote, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int rc = remote ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                        : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

/// The httplib::Stream of one request: reads come from the connection's buffer, up to the end of
/// the request (then EOF), writes go to the socket with a timeout.
class BufferedStream : public httplib::Stream {
 public:
  BufferedStream(const std::string& buf, size_t limit, int fd, double write_timeout)
      : buf_(buf), limit_(limit), fd_(fd), write_timeout_ms_(int(write_timeout * 1000)) {}

  bool is_readable() const override { return pos_ < limit_; }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    int rc;
    do rc = ::poll(&p, 1, write_timeout_ms_);
    while (rc < 0 && errno == EINTR);
    return rc > 0 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, limit_ - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { ip_and_port(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { ip_and_port(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  const std::string& buf_;
  size_t limit_, pos_ = 0;
  int fd_;
  int write_timeout_ms_;
};

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

ConnectionServer::ConnectionServer(HttpLimits limits, size_t handler_threads)
    : limits_(limits), handler_threads_(std::max<size_t>(1, handler_threads)) {
  new_task_queue = [] { return new InlineQueue; };
  set_payload_max_length(limits_.max_body_bytes);
  set_write_timeout(std::chrono::milliseconds(int64_t(limits_.write_timeout * 1000)));
  set_keep_alive_timeout(time_t(std::max(1.0, limits_.keep_alive_timeout)));
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  MOEFOLD_CHECK(epoll_fd_ >= 0 && wake_fd_ >= 0, "cannot create the HTTP reader's epoll / eventfd: {}",
                std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  pool_ = std::make_unique<httplib::ThreadPool>(handler_threads_);
  reader_ = std::thread([this] { reader_loop(); });
}

ConnectionServer::~ConnectionServer() {
  shutdown_connections();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void ConnectionServer::shutdown_connections() {
  if (shut_) return;
  shut_ = true;
  stopping_ = true;
  wake();
  if (reader_.joinable()) reader_.join();
  for (auto& [fd, c] : conns_) close_socket(c->fd);
  conns_.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& c : incoming_) close_socket(c->fd);
    incoming_.clear();
  }
  pool_->shutdown();
}

void ConnectionServer::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  if (stopping_ || open_.load() >= limits_.max_connections) {
    send_best_effort(sock, error_response(503, "The server has too many open connections; retry later."));
    close_socket(sock);
    return false;
  }
  auto c = std::make_shared<Connection>();
  c->fd = sock;
  c->idle_since = Clock::now();
  ++open_;
  {
    std::lock_guard<std::mutex> lk(mu_);
    incoming_.push_back(std::move(c));
  }
  wake();
  return true;
}

void ConnectionServer::reader_loop() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!stopping_) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), int(events.size()), kTickMs);
    std::vector<std::shared_ptr<Connection>> fresh;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fresh.swap(incoming_);
    }
    for (auto& c : fresh) adopt(std::move(c));
    for (int i = 0; i < n; ++i) {
      const int fd = events[size_t(i)].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof(v));
        continue;
      }
      auto it = conns_.find(fd);
      if (it != conns_.end()) on_readable(std::shared_ptr<Connection>(it->second));
    }
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(kTickMs)) {
      sweep();
      last_sweep = now;
    }
  }
}

void ConnectionServer::adopt(std::shared_ptr<Connection> c) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = c->fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
    close_socket(c->fd);
    --open_;
    return;
  }
  conns_[c->fd] = std::move(c);
}

void ConnectionServer::close_now(const std::shared_ptr<Connection>& c) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  conns_.erase(c->fd);
  close_socket(c->fd);
  --open_;
}

void ConnectionServer::on_readable(const std::shared_ptr<Connection>& c) {
  char tmp[kReadChunk];
  size_t got = 0;
  while (got < kReadPerEvent) {
    const ssize_t r = ::recv(c->fd, tmp, sizeof(tmp), MSG_DONTWAIT);
    if (r > 0) {
      got += size_t(r);
      if (c->closing) continue;  // draining after an error
      if (c->buf.empty()) c->first_byte = Clock::now();
      c->buf.append(tmp, size_t(r));
      // Never buffer much beyond what the limits allow; the scan below rejects the request.
      if (c->buf.size() > limits_.max_header_bytes + limits_.max_body_bytes + kReadChunk) break;
      continue;
    }
    if (r == 0) {
      c->eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    close_now(c);  // reset by the peer
    return;
  }
  if (c->closing) {
    if (c->eof) close_now(c);
    return;
  }
  if (!c->buf.empty()) scan_request(c->buf, limits_, c->scan);
  switch (c->scan.status) {
    case FrameScan::Status::kComplete: dispatch(c); return;
    case FrameScan::Status::kError: reject(c, c->scan.http_status, c->scan.message); return;
    case FrameScan::Status::kIncomplete: break;
  }
  if (c->eof) {  // the client went away before its request was complete
    close_now(c);
    return;
  }
  if (c->scan.expect_continue && !c->continue_sent) {
    send_best_effort(c->fd, "HTTP/1.1 100 Continue\r\n\r\n");
    c->continue_sent = true;
  }
}

void ConnectionServer::dispatch(std::shared_ptr<Connection> c) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  conns_.erase(c->fd);
  pool_->enqueue([this, c] { serve(c); });
}

void ConnectionServer::reject(const std::shared_ptr<Connection>& c, int status, const std::string& message) {
  send_best_effort(c->fd, error_response(status, message));
  if (on_reader_error) on_reader_error(status, message);
  // Close the sending side and drain what the client still sends for a moment, so that the
  // error is read rather than lost to a connection reset.
  ::shutdown(c->fd, SHUT_WR);
  c->closing = true;
  c->close_by = Clock::now() + kLinger;
  std::string().swap(c->buf);
}

void ConnectionServer::sweep() {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Connection>> expired, late;
  for (auto& [fd, c] : conns_) {
    if (c->closing) {
      if (now >= c->close_by) expired.push_back(c);
    } else if (c->buf.empty()) {
      if (seconds_between(c->idle_since, now) > limits_.keep_alive_timeout) expired.push_back(c);
    } else if (seconds_between(c->first_byte, now) > limits_.receive_timeout) {
      late.push_back(c);
    }
  }
  for (auto& c : expired) close_now(c);
  for (auto& c : late)
    reject(c, 408, fmt::format("The request was not received completely within {} s.", limits_.receive_timeout));
}

void ConnectionServer::serve(const std::shared_ptr<Connection>& c) {
  for (;;) {
    const size_t length = relabel_form_body_as_json(c->buf, c->scan.length);
    ++c->served;
    const bool close = c->eof || c->served >= keep_alive_max_count_ || stopping_;
    bool closed = false;
    bool ok;
    {
      BufferedStream strm(c->buf, length, c->fd, limits_.write_timeout);
      ok = process_request(strm, close, closed, nullptr);
    }
    c->buf.erase(0, length);
    c->scan = FrameScan{};
    c->continue_sent = false;
    if (!ok || closed || close || stopping_) break;
    const auto now = Clock::now();
    c->idle_since = now;
    if (c->buf.empty()) {
      park(c);
      return;
    }
    // A request pipelined behind the one just answered.
    c->first_byte = now;
    scan_request(c->buf, limits_, c->scan);
    if (c->scan.status == FrameScan::Status::kComplete) continue;
    if (c->scan.status == FrameScan::Status::kError) {
      send_best_effort(c->fd, error_response(c->scan.http_status, c->scan.message));
      if (on_reader_error) on_reader_error(c->scan.http_status, c->scan.message);
      break;
    }
    park(c);  // the rest of it is still on its way
    return;
  }
  close_socket(c->fd);
  --open_;
}

void ConnectionServer::park(std::shared_ptr<Connection> c) {
  if (stopping_) {  // the reader may be gone already
    close_socket(c->fd);
    --open_;
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    incoming_.push_back(std::move(c));
  }
  wake();
}

}  // namespace moefold::server
