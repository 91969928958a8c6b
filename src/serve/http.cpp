#include "serve/http.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace qwenrt::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

std::string_view status_reason(int status) {
  const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return {reason.data(), reason.size()};
}

std::string sse_event(std::string_view data, std::string_view event) {
  std::string out;
  out.reserve(data.size() + event.size() + 16);
  if (!event.empty()) out.append("event: ").append(event).append("\n");
  out.append("data: ").append(data).append("\n\n");
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is read whatever the contents; the length difference is
  // folded in, so a prefix of the key does not match.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  // volatile: keep the compiler from turning the loop into an early-exit comparison.
  volatile unsigned result = diff;
  return result == 0;
}

namespace {

class Connection;

// Counters the server reads for /metrics and the shutdown drain, and the connections alive (so
// stop() can break the connection <-> exchange cycle of answers still open).
struct Counters {
  std::atomic<size_t> connections{0};
  std::atomic<size_t> in_flight{0};
  std::mutex mutex;
  std::list<std::weak_ptr<Connection>> alive;
};

// The answer to one request on a connection (the Responder handed to the handler). It keeps the
// connection alive until the answer is complete or the client has gone.
class Exchange : public Responder, public std::enable_shared_from_this<Exchange> {
 public:
  explicit Exchange(std::shared_ptr<Connection> connection) : connection_(std::move(connection)) {}
  void respond(HttpResponse response) override;
  void begin_stream(int status, std::string content_type, Headers headers) override;
  void write(std::string chunk) override;
  void end() override;
  void post(std::function<void()> fn) override;
  void on_disconnect(std::function<void()> fn) override;
  bool disconnected() const override { return gone_.load(); }

  // On the strand:
  enum class State { kWaiting, kStreaming, kComplete };
  State state = State::kWaiting;
  std::function<void()> disconnect_fn;
  void mark_gone() {
    if (gone_.exchange(true)) return;
    if (state != State::kComplete && disconnect_fn) {
      auto fn = std::move(disconnect_fn);
      disconnect_fn = nullptr;
      fn();
    }
  }

 private:
  std::shared_ptr<Connection> connection_;
  std::atomic<bool> gone_{false};
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const HttpOptions& options, const Handler& handler,
             Counters& counters)
      : stream_(std::move(socket)), options_(options), handler_(handler), counters_(counters) {
    counters_.connections++;
    beast::error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }
  ~Connection() {
    if (exchange_) counters_.in_flight--;
    counters_.connections--;
  }

  void start() {
    {
      std::lock_guard lock(counters_.mutex);
      counters_.alive.remove_if([](const std::weak_ptr<Connection>& c) { return c.expired(); });
      counters_.alive.push_back(weak_from_this());
    }
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // After the I/O threads have stopped: an answer left open holds this connection through its
  // exchange; drop that link so both can be freed.
  void abandon() {
    if (!exchange_) return;
    auto ex = std::move(exchange_);
    counters_.in_flight--;
    ex->state = Exchange::State::kComplete;
  }

  // The connection's strand (the socket was accepted onto one).
  beast::tcp_stream::executor_type strand() { return stream_.get_executor(); }

  // --- called on the strand by Exchange ---
  bool current(const Exchange* ex) const { return exchange_.get() == ex && !closed_; }

  void send_head(int status, const std::string& content_type, const Headers& headers,
                 std::optional<size_t> content_length) {
    std::string head =
        "HTTP/1.1 " + std::to_string(status) + " " + std::string(status_reason(status)) + "\r\n";
    head += "Server: qwenrt\r\n";
    if (!content_type.empty()) head += "Content-Type: " + content_type + "\r\n";
    if (content_length)
      head += "Content-Length: " + std::to_string(*content_length) + "\r\n";
    else
      head += "Transfer-Encoding: chunked\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    bool cors = false;
    for (const auto& [k, v] : headers) {
      head += k + ": " + v + "\r\n";
      if (k == "Access-Control-Allow-Origin") cors = true;
    }
    if (!cors) head += "Access-Control-Allow-Origin: *\r\n";
    head += "\r\n";
    queue(std::move(head));
  }

  void queue(std::string bytes) {
    if (bytes.empty() || closed_) return;
    out_.push_back(std::move(bytes));
    if (!writing_) write_next();
  }

  void complete_exchange() {
    complete_ = true;
    if (!writing_) finish_exchange();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    // The exchange and the connection hold each other: break the cycle here; whoever still holds
    // the exchange (a request waiting for its sequence to end) keeps a closed connection.
    if (exchange_) {
      auto ex = std::move(exchange_);
      counters_.in_flight--;
      ex->mark_gone();
    }
  }

 private:
  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(options_.max_body);
    parser_->header_limit(static_cast<uint32_t>(options_.max_header));
    stream_.expires_after(options_.idle_timeout);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    const auto& req = parser_->get();
    // A client that asked to be told before sending its body (curl does for large ones).
    const auto expect = req[bhttp::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      out_.push_back("HTTP/1.1 100 Continue\r\n\r\n");
      if (!writing_) write_next();
    }
    stream_.expires_after(options_.idle_timeout);
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
        ec == beast::error::timeout || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted) {
      return close();
    }
    keep_alive_ = false;
    if (ec == bhttp::error::body_limit) {
      answer_error(413, "the request body is larger than the limit of " +
                            std::to_string(options_.max_body) + " bytes");
      drain_ = true;
    } else if (ec == bhttp::error::header_limit) {
      answer_error(431, "the request headers are larger than the limit of " +
                            std::to_string(options_.max_header) + " bytes");
      drain_ = true;
    } else {
      answer_error(400, "malformed HTTP request: " + ec.message());
    }
  }

  // An error the HTTP layer answers itself, then closes the connection.
  void answer_error(int status, const std::string& message) {
    // The route, when the request line was read (Beast has set the target; a body over the
    // limit is found at its Content-Length header), so the error comes in that route's dialect.
    std::string path;
    if (parser_) {
      const auto& target = parser_->get().target();
      const std::string_view t(target.data(), target.size());
      path = std::string(t.substr(0, t.find('?')));
    }
    HttpResponse r =
        options_.error_response
            ? options_.error_response(status, message, path)
            : HttpResponse{.status = status, .content_type = "text/plain", .body = message + "\n"};
    send_head(r.status, r.content_type, r.headers, r.body.size());
    queue(std::move(r.body));
    complete_ = true;
  }

  void on_body(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    const std::string_view target(msg.target().data(), msg.target().size());
    const size_t q = target.find('?');
    req.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
    for (const auto& field : msg) {
      std::string name(field.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    req.body = std::move(msg.body());
    req.remote = remote_;

    exchange_ = std::make_shared<Exchange>(shared_from_this());
    counters_.in_flight++;
    complete_ = false;
    watch_disconnect();
    auto ex = exchange_;
    try {
      handler_(std::move(req), ex);
    } catch (const std::exception& e) {
      // The handler reports its own errors; this is the last line of defence.
      log(LogLevel::kError, "serve: handler failed: {}", e.what());
      ex->respond({.status = 500,
                   .content_type = "text/plain",
                   .body = std::string("internal error: ") + e.what() + "\n"});
    }
  }

  // While an answer is in progress the client sends nothing (HTTP/1.1 without pipelining): the
  // socket turning readable with nothing to read means it closed.
  void watch_disconnect() {
    if (closed_ || watching_) return;
    watching_ = true;
    const uint64_t generation = ++watch_generation_;
    // The socket's executor is this connection's strand: the handler runs there.
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
          if (generation != self->watch_generation_) return;  // a watch given up
          self->watching_ = false;
          if (!self->exchange_ || self->closed_) return;
          if (ec) {
            if (ec != asio::error::operation_aborted) {
              log(LogLevel::kDebug, "serve: watch: {}", ec.message());
              self->close();
            }
            return;
          }
          // Peek with the system call itself: no change to Asio's view of the socket's mode.
          char byte;
          const ssize_t n =
              ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return self->watch_disconnect();
          if (n <= 0) {
            log(LogLevel::kDebug, "serve: {} left ({})", self->remote_,
                n == 0 ? "closed" : std::strerror(errno));
            return self->close();
          }
          // A pipelined request: it stays in the socket for the next read; stop watching.
        });
  }

  void write_next() {
    if (out_.empty() || closed_) return;
    writing_ = true;
    // Batch what is queued into one write.
    std::string bytes = std::move(out_.front());
    out_.pop_front();
    while (!out_.empty() && bytes.size() < (256u << 10)) {
      bytes += out_.front();
      out_.pop_front();
    }
    auto buffer = std::make_shared<std::string>(std::move(bytes));
    stream_.expires_after(options_.write_timeout);
    asio::async_write(stream_, asio::buffer(*buffer),
                      [self = shared_from_this(), buffer](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        if (ec) {
                          log(LogLevel::kDebug, "serve: write: {}", ec.message());
                          return self->close();
                        }
                        if (!self->out_.empty()) return self->write_next();
                        self->stream_.expires_never();
                        if (self->complete_) self->finish_exchange();
                      });
  }

  void finish_exchange() {
    if (exchange_) {
      exchange_->state = Exchange::State::kComplete;
      exchange_.reset();
      counters_.in_flight--;
    }
    complete_ = false;
    if (closed_) return;
    if (drain_) return drain();
    if (!keep_alive_) {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      return close();
    }
    // Stop the disconnect watch before reading the next request.
    if (watching_) {
      ++watch_generation_;
      watching_ = false;
      beast::error_code ec;
      stream_.socket().cancel(ec);
    }
    read_request();
  }

  // After an early error answer (413, 431), the client may still be sending its body: reading and
  // discarding it for a while lets the client see the answer instead of a reset connection.
  void drain() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    drain_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    drain_some();
  }
  void drain_some() {
    if (closed_ || std::chrono::steady_clock::now() > drain_deadline_) return close();
    stream_.expires_after(std::chrono::seconds(5));
    stream_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain_some();
                            });
  }

  beast::tcp_stream stream_;
  const HttpOptions& options_;
  const Handler& handler_;
  Counters& counters_;
  std::string remote_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<Exchange> exchange_;
  std::deque<std::string> out_;
  bool writing_ = false;
  bool complete_ = false;  // the current exchange has queued its last byte
  bool keep_alive_ = true;
  bool closed_ = false;
  bool drain_ = false;
  bool watching_ = false;
  uint64_t watch_generation_ = 0;
  std::chrono::steady_clock::time_point drain_deadline_;
  std::array<char, 64 * 1024> drain_buffer_;

  friend class Exchange;
};

void Exchange::post(std::function<void()> fn) {
  asio::post(connection_->strand(), std::move(fn));
}

void Exchange::respond(HttpResponse response) {
  post([self = shared_from_this(), r = std::move(response)]() mutable {
    auto& c = *self->connection_;
    if (self->state != State::kWaiting || !c.current(self.get())) return;
    self->state = State::kComplete;
    c.send_head(r.status, r.content_type, r.headers, r.body.size());
    c.queue(std::move(r.body));
    c.complete_exchange();
  });
}

void Exchange::begin_stream(int status, std::string content_type, Headers headers) {
  post([self = shared_from_this(), status, ct = std::move(content_type),
        h = std::move(headers)]() mutable {
    auto& c = *self->connection_;
    if (self->state != State::kWaiting || !c.current(self.get())) return;
    self->state = State::kStreaming;
    h.emplace_back("Cache-Control", "no-cache");
    c.send_head(status, ct, h, std::nullopt);
  });
}

void Exchange::write(std::string chunk) {
  if (chunk.empty()) return;
  post([self = shared_from_this(), data = std::move(chunk)]() mutable {
    auto& c = *self->connection_;
    if (self->state != State::kStreaming || !c.current(self.get())) return;
    char size[32];
    const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string framed;
    framed.reserve(data.size() + n + 2);
    framed.append(size, n).append(data).append("\r\n");
    c.queue(std::move(framed));
  });
}

void Exchange::end() {
  post([self = shared_from_this()] {
    auto& c = *self->connection_;
    if (self->state != State::kStreaming || !c.current(self.get())) return;
    self->state = State::kComplete;
    c.queue("0\r\n\r\n");
    c.complete_exchange();
  });
}

void Exchange::on_disconnect(std::function<void()> fn) {
  post([self = shared_from_this(), fn = std::move(fn)]() mutable {
    if (self->gone_.load()) {
      if (self->state != State::kComplete) fn();
      return;
    }
    self->disconnect_fn = std::move(fn);
  });
}

}  // namespace

struct HttpServer::Impl {
  HttpOptions options;
  Handler handler;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  Counters counters;
  int port = 0;
  std::atomic<bool> accepting{false};

  void accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!accepting.load()) return;
      if (!ec) {
        std::make_shared<Connection>(std::move(socket), options, handler, counters)->start();
      } else if (ec == asio::error::no_descriptors) {
        // Out of file descriptors: wait a little instead of spinning on the error.
        log(LogLevel::kWarn, "serve: accept: {}", ec.message());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      accept();
    });
  }
};

HttpServer::HttpServer(HttpOptions options, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  auto& s = *impl_;
  // A thousand connections need a thousand descriptors: take the hard limit.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  beast::error_code ec;
  const auto address = asio::ip::make_address(s.options.host, ec);
  if (ec) fail("--host {}: not an IP address ({})", s.options.host, ec.message());
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(s.options.port));
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on {}:{}: {}", s.options.host, s.options.port, ec.message());
  s.port = s.acceptor.local_endpoint().port();
  s.accepting = true;
  s.work.emplace(s.ioc.get_executor());
  s.accept();
  for (int i = 0; i < std::max(1, s.options.io_threads); ++i)
    s.threads.emplace_back([&s] { s.ioc.run(); });
}

int HttpServer::port() const {
  return impl_->port;
}

void HttpServer::stop_accepting() {
  if (!impl_->accepting.exchange(false)) return;
  asio::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
}

void HttpServer::stop() {
  stop_accepting();
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  std::lock_guard lock(impl_->counters.mutex);
  for (auto& weak : impl_->counters.alive)
    if (auto c = weak.lock()) c->abandon();
  impl_->counters.alive.clear();
}

size_t HttpServer::open_connections() const {
  return impl_->counters.connections.load();
}
size_t HttpServer::answers_in_flight() const {
  return impl_->counters.in_flight.load();
}

}  // namespace qwenrt::serve
