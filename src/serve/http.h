// The HTTP/1.1 layer of `qwenrt serve`: Boost.Beast parsing on Boost.Asio, asynchronous accept,
// read and write on a small pool of I/O threads, so a thousand connections that wait or stream
// cost a socket and a few buffers each, not a thread (docs/decisions.md says why not cpp-httplib).
//
// A request is read whole (body up to `max_body`, else 413 and the connection closes), handed to
// the handler on an I/O thread, and answered through its Responder: one whole response, or a
// chunked stream (SSE). Responder calls may come from any thread (the scheduler's sinks post to
// it); they never block. While a request is being answered the socket is watched, so a client
// that goes away is noticed (on_disconnect) before the answer is complete. Keep-alive is the
// default; Beast and Asio stay inside http.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qwenrt::serve {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", "OPTIONS", ...
  std::string path;    // the target up to '?'
  std::string query;   // after '?', raw
  Headers headers;     // names lower-cased, in arrival order
  std::string body;
  std::string remote;  // "ADDRESS:PORT" of the client

  // The first header of that (lower-case) name, or null.
  const std::string* header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  Headers headers;  // added to the defaults (Content-Length, Connection, CORS)
  std::string body;
};

// One request's answer. Either respond() once, or begin_stream(), write() any number of times,
// end(). Calls after the answer is complete, or after the client went away, do nothing.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void respond(HttpResponse response) = 0;
  virtual void begin_stream(int status, std::string content_type, Headers headers = {}) = 0;
  virtual void write(std::string chunk) = 0;  // one chunk of the body (empty: nothing written)
  virtual void end() = 0;
  // Runs `fn` on the connection's strand: serialised with every other callback of this
  // connection, so per-request state touched only there needs no lock.
  virtual void post(std::function<void()> fn) = 0;
  // `fn` runs once, on the strand, when the client goes away before the answer is complete (at
  // once, posted, if it already has).
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
};

using Handler = std::function<void(HttpRequest&&, std::shared_ptr<Responder>)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() tells which)
  int io_threads = 4;
  size_t max_body = 16u << 20;             // bytes; larger bodies are answered 413
  size_t max_header = 64u << 10;           // bytes of request line and headers; larger: 431
  std::chrono::seconds idle_timeout{60};   // keep-alive wait for the next request, and header reads
  std::chrono::seconds write_timeout{60};  // a client that reads nothing for this long is dropped
  // The body of an error the HTTP layer answers itself (400 malformed, 413, 431): the JSON error
  // shape of the route's dialect, made by the server. `path` is the request's path (up to '?')
  // when its request line was read (a body over the limit), else empty.
  std::function<HttpResponse(int status, const std::string& message, const std::string& path)>
      error_response;
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, Handler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (Error naming the address when it cannot), raises the open-files limit to
  // what the system allows, and starts the I/O threads.
  void start();
  int port() const;
  // Closes the listening socket; connections already open keep being served.
  void stop_accepting();
  // Stops the I/O threads (open connections are dropped) and joins them.
  void stop();

  size_t open_connections() const;
  size_t answers_in_flight() const;  // requests read and not yet completely answered

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "HTTP/1.1 200 OK"'s reason phrase for a status code.
std::string_view status_reason(int status);

// One server-sent event: "data: PAYLOAD\n\n" (payload without newlines), or with an event name,
// "event: NAME\ndata: PAYLOAD\n\n".
std::string sse_event(std::string_view data, std::string_view event = {});

// Compares without an early exit, so the time taken does not tell how much of a key matched.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace qwenrt::serve
