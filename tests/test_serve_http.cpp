// The HTTP layer against raw sockets, with handlers made here (no model): whole answers on a
// keep-alive connection, a chunked stream written from another thread, 413 for a large body,
// malformed requests, a client leaving mid-stream noticed, and many connections held at once.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/http.h"

namespace qwenrt::serve {
namespace {

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Reads until `until` appears (or the peer closes / times out).
std::string read_until(int fd, const std::string& until) {
  std::string out;
  char buf[4096];
  while (out.find(until) == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// One response with a Content-Length body.
std::string read_response(int fd) {
  std::string out = read_until(fd, "\r\n\r\n");
  const size_t head_end = out.find("\r\n\r\n");
  if (head_end == std::string::npos) return out;
  const size_t cl = out.find("Content-Length: ");
  if (cl == std::string::npos || cl > head_end) return out;
  const size_t length = std::stoul(out.substr(cl + 16));
  char buf[4096];
  while (out.size() < head_end + 4 + length) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Fixture {
  std::unique_ptr<HttpServer> server;
  std::atomic<int> disconnects{0};
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::thread> threads;

  explicit Fixture(HttpOptions options = {}) {
    options.port = 0;
    options.io_threads = 2;
    server = std::make_unique<HttpServer>(
        options, [this](HttpRequest&& req, std::shared_ptr<Responder> out) {
          if (req.path == "/echo") {
            out->respond({.status = 200,
                          .content_type = "text/plain",
                          .body = req.method + " " + req.path + " " + req.query + " " + req.body});
          } else if (req.path == "/stream") {
            // Written from another thread, as the scheduler's sinks do.
            out->begin_stream(200, "text/event-stream");
            threads.emplace_back([out] {
              for (int i = 0; i < 3; ++i) out->write(sse_event("chunk" + std::to_string(i)));
              out->write(sse_event("[DONE]"));
              out->end();
            });
          } else if (req.path == "/forever") {
            out->begin_stream(200, "text/event-stream");
            out->write(sse_event("first"));
            out->on_disconnect([this] {
              disconnects++;
              cv.notify_all();
            });
          } else if (req.path == "/wait") {
            // No answer until the client leaves.
            out->on_disconnect([this] {
              disconnects++;
              cv.notify_all();
            });
          } else {
            out->respond({.status = 404, .body = "{}"});
          }
        });
    server->start();
  }
  ~Fixture() {
    for (auto& t : threads) t.join();
    server->stop();
  }
  bool wait_disconnects(int n) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(5), [&] { return disconnects.load() >= n; });
  }
};

TEST(ServeHttp, KeepAliveAnswers) {
  Fixture f;
  const int fd = connect_to(f.server->port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    const std::string body = "hello" + std::to_string(i);
    send_all(fd, "POST /echo?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
    const std::string r = read_response(fd);
    EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
    EXPECT_NE(r.find("Connection: keep-alive"), std::string::npos);
    EXPECT_NE(r.find("Access-Control-Allow-Origin: *"), std::string::npos);
    EXPECT_NE(r.find("\r\n\r\nPOST /echo x=1 " + body), std::string::npos) << r;
  }
  // Chunked request bodies are read too.
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
           "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  EXPECT_NE(read_response(fd).find("POST /echo  abcde"), std::string::npos);
  ::close(fd);
}

TEST(ServeHttp, ChunkedStreamFromAnotherThread) {
  Fixture f;
  const int fd = connect_to(f.server->port());
  send_all(fd, "GET /stream HTTP/1.1\r\nHost: a\r\n\r\n");
  const std::string r = read_until(fd, "0\r\n\r\n");
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Type: text/event-stream"), std::string::npos);
  // Chunks in order, each framed by its hex size.
  const size_t c0 = r.find("data: chunk0\n\n"), c2 = r.find("data: chunk2\n\n");
  ASSERT_NE(c0, std::string::npos);
  ASSERT_NE(c2, std::string::npos);
  EXPECT_LT(c0, c2);
  EXPECT_NE(r.find("e\r\ndata: chunk1\n\n\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("data: [DONE]\n\n\r\n0\r\n\r\n"), std::string::npos);
  // The connection is still usable.
  send_all(fd, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_NE(read_response(fd).find("GET /echo"), std::string::npos);
  ::close(fd);
}

TEST(ServeHttp, LargeBodyIs413AndBadRequestsAre400) {
  HttpOptions o;
  o.max_body = 1000;
  // The error names the route it was made for (the server picks the dialect's shape by it).
  o.error_response = [](int status, const std::string& message, const std::string& path) {
    return HttpResponse{.status = status,
                        .body = "{\"error\": \"" + message + "\", \"path\": \"" + path + "\"}"};
  };
  Fixture f(o);
  {
    const int fd = connect_to(f.server->port());
    const std::string body(5000, 'x');
    send_all(fd, "POST /v1/messages?beta=true HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n" +
                     body);
    const std::string r = read_response(fd);
    EXPECT_EQ(r.rfind("HTTP/1.1 413 ", 0), 0u) << r;
    EXPECT_NE(r.find("limit of 1000 bytes"), std::string::npos) << r;
    EXPECT_NE(r.find("\"path\": \"/v1/messages\""), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos);
    ::close(fd);
  }
  {
    // A request line that never parsed has no route.
    const int fd = connect_to(f.server->port());
    send_all(fd, "GARBAGE\r\n\r\n");
    const std::string r = read_response(fd);
    EXPECT_NE(r.find("\"path\": \"\""), std::string::npos) << r;
    ::close(fd);
  }
  for (const char* bad : {"GARBAGE\r\n\r\n", "GET / HTTP/9.9\r\n\r\n",
                          "POST /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n"}) {
    const int fd = connect_to(f.server->port());
    send_all(fd, bad);
    const std::string r = read_response(fd);
    EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << bad << " -> " << r;
    ::close(fd);
  }
  // Still serving.
  const int fd = connect_to(f.server->port());
  send_all(fd, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(read_response(fd).rfind("HTTP/1.1 200", 0), 0u);
  ::close(fd);
}

TEST(ServeHttp, ClientLeavingIsNoticed) {
  Fixture f;
  {
    const int fd = connect_to(f.server->port());
    send_all(fd, "GET /forever HTTP/1.1\r\nHost: a\r\n\r\n");
    EXPECT_NE(read_until(fd, "data: first").find("data: first"), std::string::npos);
    ::close(fd);
    EXPECT_TRUE(f.wait_disconnects(1));
  }
  {
    const int fd = connect_to(f.server->port());
    send_all(fd, "POST /wait HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::close(fd);
    EXPECT_TRUE(f.wait_disconnects(2));
  }
  // Connections and answers in flight are counted down when clients leave.
  for (int i = 0; i < 100 && f.server->open_connections() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(f.server->open_connections(), 0u);
  EXPECT_EQ(f.server->answers_in_flight(), 0u);
}

TEST(ServeHttp, HoldsManyConnections) {
  Fixture f;
  // 1000 waiting clients would need more descriptors than a test may have: 400 show the
  // connections cost no thread each (2 I/O threads here).
  constexpr int kClients = 400;
  std::vector<int> fds;
  for (int i = 0; i < kClients; ++i) {
    const int fd = connect_to(f.server->port());
    ASSERT_GE(fd, 0) << i;
    send_all(fd, "POST /wait HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    fds.push_back(fd);
  }
  for (int i = 0; i < 200 && f.server->answers_in_flight() < kClients; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(f.server->answers_in_flight(), static_cast<size_t>(kClients));
  // Another client is answered while they all wait.
  const int fd = connect_to(f.server->port());
  send_all(fd, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(read_response(fd).rfind("HTTP/1.1 200", 0), 0u);
  ::close(fd);
  for (int x : fds) ::close(x);
  EXPECT_TRUE(f.wait_disconnects(kClients));
}

}  // namespace
}  // namespace qwenrt::serve
