#include "serve/server.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <list>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "gen/defaults.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "serve/anthropic.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/responses.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::serve {

namespace {

using Clock = std::chrono::steady_clock;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

HttpResponse json_response(int status, const Json& body, Headers headers = {}) {
  return {.status = status,
          .content_type = "application/json",
          .headers = std::move(headers),
          .body = dump_json(body)};
}

// What a request in flight needs from the server.
struct Services {
  gen::Scheduler* scheduler = nullptr;
  Metrics* metrics = nullptr;
  double request_timeout = 0;
};

// A request the reaper may time out.
struct Tracked {
  virtual ~Tracked() = default;
  Clock::time_point deadline = Clock::time_point::max();
  virtual void expire() = 0;
};

}  // namespace

struct Server::Impl {
  ServeOptions options;
  Metrics metrics;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<gen::Scheduler> scheduler;
  std::thread scheduler_thread;
  Services services;
  ModelInfo model;
  int64_t created = unix_now();
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> request_counter{0};

  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stop_requested = false;

  // Timeouts: requests in flight, checked by the reaper thread.
  std::mutex tracked_mutex;
  std::list<std::weak_ptr<Tracked>> tracked;
  std::thread reaper;
  std::atomic<bool> reaper_stop{false};

  void handle(HttpRequest&& req, std::shared_ptr<Responder> out);
  void chat_completions(const HttpRequest& req, const std::shared_ptr<Responder>& out);
  void completions(const HttpRequest& req, const std::shared_ptr<Responder>& out);
  void messages(const HttpRequest& req, const std::shared_ptr<Responder>& out);
  void count_tokens(const HttpRequest& req, const std::shared_ptr<Responder>& out);
  void responses(const HttpRequest& req, const std::shared_ptr<Responder>& out);
  gen::PreparedTurn prepare(const openai::ChatRequest& request) const;
  void track(const std::shared_ptr<Tracked>& t);
  void reap();

  template <class Reply>
  void launch(const std::shared_ptr<Responder>& out, const std::string& endpoint, Reply reply,
              std::vector<gen::SequenceParams> sequences, bool stream);

  MetricsSnapshot snapshot() const {
    MetricsSnapshot s;
    s.ready = ready.load();
    if (s.ready) s.scheduler = scheduler->stats();
    s.connections = http->open_connections();
    s.answers_in_flight = http->answers_in_flight();
    return s;
  }
};

namespace {

// A failure's body and its SSE event in the reply's dialect (OpenAI's unless the reply says).
template <class Reply>
Json error_body(const Reply& reply, int status, const std::string& message) {
  if constexpr (requires { reply.error_body(status, message); })
    return reply.error_body(status, message);
  else
    return openai::error_json(status, message);
}
template <class Reply>
std::string stream_error(Reply& reply, int status, const std::string& message) {
  if constexpr (requires { reply.stream_error(status, message); })
    return reply.stream_error(status, message);
  else
    return sse_event(dump_json(openai::error_json(status, message)));
}

// One request's sequences and its reply, touched only on the connection's strand (updates are
// posted there by the sinks, which run on the scheduler's thread and must not block).
template <class Reply>
struct Pending : Tracked, std::enable_shared_from_this<Pending<Reply>> {
  Pending(Reply r) : reply(std::move(r)) {}
  const Services* server = nullptr;
  std::shared_ptr<Responder> out;
  std::string endpoint;
  std::string id;
  Reply reply;
  bool stream = false;
  std::vector<uint64_t> ids;
  bool abandoned = false;  // answered already (429 after a partial submit, or the client left)
  bool timed_out = false;
  Clock::time_point start = Clock::now();
  double ttft = -1;  // seconds to the first choice's first token
  double generate_seconds = 0;

  void cancel_all();
  void expire() override {
    auto self = this->shared_from_this();
    out->post([self] {
      self->timed_out = true;
      self->cancel_all();
    });
  }
  void on_update(int choice, const gen::SequenceUpdate& u);
  void finish();
};

template <class Reply>
void Pending<Reply>::cancel_all() {
  if (!server->scheduler) return;
  for (uint64_t sid : ids) server->scheduler->cancel(sid);
}

template <class Reply>
void Pending<Reply>::on_update(int choice, const gen::SequenceUpdate& u) {
  if (abandoned) return;
  if (u.done) {
    const double t = u.queue_seconds + u.prompt_seconds;
    if (ttft < 0 || t < ttft) ttft = t;
    generate_seconds = std::max(generate_seconds, u.generate_seconds);
    server->metrics->sequence(t, u.generate_seconds, u.n_generated);
  }
  if (stream) {
    out->write(reply.stream(choice, u));
  } else {
    reply.collect(choice, u);
  }
  if (reply.done()) finish();
}

template <class Reply>
void Pending<Reply>::finish() {
  int status = 200;
  const std::string timeout =
      fmt::format("the request timed out after {} s", server->request_timeout);
  if (stream) {
    if (timed_out) out->write(stream_error(reply, 504, timeout));
    out->write(reply.stream_end());
    out->end();
  } else if (timed_out) {
    status = 504;
    out->respond(json_response(504, error_body(reply, 504, timeout)));
  } else if (!reply.error().empty()) {
    status = 500;
    out->respond(json_response(500, error_body(reply, 500, reply.error())));
  } else {
    out->respond(json_response(200, reply.response()));
  }
  if (out->disconnected()) status = 499;  // nginx's "client closed request", for the log
  server->metrics->request(endpoint, status);
  const auto& usage = reply.usage();
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  // One line per request, whatever the log level: what an operator greps for.
  fmt::print(stderr,
             "serve: {} {} {} prompt {} cached {} gen {} ttft {:.3f}s {:.1f} tok/s total {:.3f}s "
             "finish {}\n",
             id, endpoint, status, usage.prompt, usage.cached, usage.completion,
             std::max(ttft, 0.0), usage.completion / std::max(generate_seconds, 1e-9), total,
             reply.finish_reasons());
}

// A request path without the /v1 prefix and trailing slashes: "/v1/messages/" -> "/messages".
std::string route_of(const std::string& path) {
  std::string route = path.rfind("/v1/", 0) == 0 ? path.substr(3) : path;
  while (route.size() > 1 && route.back() == '/') route.pop_back();
  return route;
}

// Anthropic's routes (/messages, /messages/count_tokens and anything under /messages/, with or
// without /v1) answer every error, the HTTP layer's included, in Anthropic's shape.
bool anthropic_route(const std::string& route) {
  return route == "/messages" || route.rfind("/messages/", 0) == 0;
}

// The request's error in its dialect's shape (Anthropic's on /v1/messages, OpenAI's elsewhere).
HttpResponse api_error_response(const ApiError& e, bool anthropic_shape) {
  Headers h;
  if (e.status() == 429) h.emplace_back("Retry-After", "1");
  return json_response(e.status(),
                       anthropic_shape
                           ? anthropic::error_json(e.status(), e.what())
                           : openai::error_json(e.status(), e.what(), e.param(), e.code()),
                       std::move(h));
}

}  // namespace

template <class Reply>
void Server::Impl::launch(const std::shared_ptr<Responder>& out, const std::string& endpoint,
                          Reply reply, std::vector<gen::SequenceParams> sequences, bool stream) {
  auto p = std::make_shared<Pending<Reply>>(std::move(reply));
  p->server = &services;
  p->out = out;
  p->endpoint = endpoint;
  p->stream = stream;
  p->id = fmt::format("req-{}", ++request_counter);
  if (options.request_timeout > 0)
    p->deadline = p->start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(options.request_timeout));
  // Submitting all n sequences happens on this strand before any update can run (updates are
  // posted to it), so a failed submit can still answer and drop the ones already submitted.
  try {
    for (size_t i = 0; i < sequences.size(); ++i) {
      const int choice = static_cast<int>(i);
      // The sinks own the request's state: it lives until its last sequence has ended.
      p->ids.push_back(scheduler->submit(
          std::move(sequences[i]), [self = p, choice, out](gen::SequenceUpdate&& u) {
            out->post([self, choice, u = std::move(u)] { self->on_update(choice, u); });
          }));
    }
  } catch (const gen::QueueFull& e) {
    p->abandoned = true;
    p->cancel_all();
    throw ApiError(429, std::string("the server is busy: ") + e.what());
  } catch (const gen::ShuttingDown&) {
    p->abandoned = true;
    p->cancel_all();
    throw ApiError(503, "the server is shutting down");
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    p->abandoned = true;
    p->cancel_all();
    throw ApiError(400, e.what());
  }
  if (stream) out->begin_stream(200, "text/event-stream");
  // The client leaving frees its slots within a step.
  std::weak_ptr<Pending<Reply>> weak = p;
  out->on_disconnect([weak] {
    if (auto self = weak.lock()) self->cancel_all();
  });
  track(p);
}

void Server::Impl::track(const std::shared_ptr<Tracked>& t) {
  if (t->deadline == Clock::time_point::max()) return;
  std::lock_guard lock(tracked_mutex);
  tracked.push_back(t);
}

void Server::Impl::reap() {
  while (!reaper_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<std::shared_ptr<Tracked>> expired;
    {
      std::lock_guard lock(tracked_mutex);
      const auto now = Clock::now();
      for (auto it = tracked.begin(); it != tracked.end();) {
        auto t = it->lock();
        if (!t) {
          it = tracked.erase(it);
        } else if (t->deadline <= now) {
          expired.push_back(std::move(t));
          it = tracked.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& t : expired) t->expire();
  }
}

gen::PreparedTurn Server::Impl::prepare(const openai::ChatRequest& request) const {
  gen::PreparedTurn turn;
  try {
    turn = gen::prepare_turn(*tokenizer, model.dialect, request.turn);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, std::string("messages: ") + e.what(), "messages");
  }
  return turn;
}

void Server::Impl::chat_completions(const HttpRequest& req, const std::shared_ptr<Responder>& out) {
  const Json body = parse_json_body(req.body);
  auto request = openai::parse_chat_request(body, model);
  const gen::PreparedTurn turn = prepare(request);
  check_prompt_fits(turn.prompt.size(), model.n_ctx, "messages");
  std::vector<gen::SequenceParams> sequences;
  for (int i = 0; i < request.gen.n; ++i)
    sequences.push_back(openai::chat_sequence(request, turn, model, i));
  openai::ReplyFormat format{.id = random_id("chatcmpl-"),
                             .created = unix_now(),
                             .model = model.name,
                             .n = request.gen.n,
                             .logprobs = request.gen.top_logprobs >= 0,
                             .include_usage = request.gen.include_usage,
                             .parallel_tool_calls = request.parallel_tool_calls};
  const tokenizer::Tokenizer* tok = tokenizer.get();
  openai::ChatReply reply(format, [tok](int32_t id) { return tok->decode({&id, 1}); });
  launch(out, "/v1/chat/completions", std::move(reply), std::move(sequences), request.gen.stream);
}

void Server::Impl::completions(const HttpRequest& req, const std::shared_ptr<Responder>& out) {
  const Json body = parse_json_body(req.body);
  auto request = openai::parse_completion_request(body, model);
  std::vector<int32_t> prompt =
      request.prompt_text ? tokenizer->encode(*request.prompt_text, /*parse_special=*/true)
                          : request.prompt_ids;
  check_prompt_fits(prompt.size(), model.n_ctx, "prompt");
  std::vector<gen::SequenceParams> sequences;
  for (int i = 0; i < request.gen.n; ++i)
    sequences.push_back(openai::completion_sequence(request, prompt, model, i));
  openai::ReplyFormat format{.id = random_id("cmpl-"),
                             .created = unix_now(),
                             .model = model.name,
                             .n = request.gen.n,
                             .logprobs = request.gen.top_logprobs >= 0,
                             .include_usage = request.gen.include_usage};
  const tokenizer::Tokenizer* tok = tokenizer.get();
  openai::CompletionReply reply(format, [tok](int32_t id) { return tok->decode({&id, 1}); });
  launch(out, "/v1/completions", std::move(reply), std::move(sequences), request.gen.stream);
}

void Server::Impl::messages(const HttpRequest& req, const std::shared_ptr<Responder>& out) {
  const Json body = parse_json_body(req.body);
  const auto request = anthropic::parse_messages_request(body, model);
  const gen::PreparedTurn turn = prepare(request);
  check_prompt_fits(turn.prompt.size(), model.n_ctx, "messages");
  std::vector<gen::SequenceParams> sequences;
  sequences.push_back(openai::chat_sequence(request, turn, model, 0));
  anthropic::ReplyFormat format{.id = random_id("msg_"),
                                .model = model.name,
                                .n_prompt = static_cast<int64_t>(turn.prompt.size()),
                                .stop = request.gen.stop};
  const tokenizer::Tokenizer* tok = tokenizer.get();
  anthropic::MessageReply reply(format, [tok](int32_t id) { return tok->decode({&id, 1}); });
  launch(out, "/v1/messages", std::move(reply), std::move(sequences), request.gen.stream);
}

void Server::Impl::count_tokens(const HttpRequest& req, const std::shared_ptr<Responder>& out) {
  const Json body = parse_json_body(req.body);
  const gen::PreparedTurn turn = prepare(anthropic::parse_count_tokens_request(body, model));
  metrics.request("/v1/messages/count_tokens", 200);
  out->respond(json_response(200, {{"input_tokens", turn.prompt.size()}}));
}

void Server::Impl::responses(const HttpRequest& req, const std::shared_ptr<Responder>& out) {
  const Json body = parse_json_body(req.body);
  const auto request = responses::parse_request(body, model);
  const gen::PreparedTurn turn = prepare(request);
  check_prompt_fits(turn.prompt.size(), model.n_ctx, "input");
  std::vector<gen::SequenceParams> sequences;
  sequences.push_back(openai::chat_sequence(request, turn, model, 0));
  responses::ReplyFormat format{.id = random_id("resp_"),
                                .created = unix_now(),
                                .model = model.name,
                                .n_prompt = static_cast<int64_t>(turn.prompt.size()),
                                .thinking = turn.thinking};
  responses::echo_request(body, format);
  const tokenizer::Tokenizer* tok = tokenizer.get();
  responses::ResponseReply reply(format, [tok](int32_t id) { return tok->decode({&id, 1}); });
  launch(out, "/v1/responses", std::move(reply), std::move(sequences), request.gen.stream);
}

void Server::Impl::handle(HttpRequest&& req, std::shared_ptr<Responder> out) {
  // Paths with and without the /v1 prefix are the same endpoint.
  const std::string path = route_of(req.path);
  const std::string endpoint = path == "/health" || path == "/metrics" ? path : "/v1" + path;
  const bool anthropic_shape = anthropic_route(path);
  auto answer = [&](HttpResponse r) {
    metrics.request(endpoint, r.status);
    out->respond(std::move(r));
  };
  try {
    if (req.method == "OPTIONS") {
      // CORS preflight: any origin, the methods and headers the API uses.
      const std::string* asked = req.header("access-control-request-headers");
      return answer({.status = 204,
                     .content_type = "",
                     .headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                                 {"Access-Control-Allow-Headers",
                                  asked ? *asked
                                        : "Authorization, Content-Type, x-api-key, "
                                          "anthropic-version"},
                                 {"Access-Control-Max-Age", "86400"}}});
    }
    if (path == "/health") {
      if (stopping.load()) return answer(json_response(503, {{"status", "shutting down"}}));
      if (!ready.load()) return answer(json_response(503, {{"status", "loading"}}));
      return answer(json_response(200, {{"status", "ok"}}));
    }
    if (!options.api_key.empty()) {
      std::string key;
      if (const std::string* a = req.header("authorization"); a && a->rfind("Bearer ", 0) == 0)
        key = a->substr(7);
      else if (const std::string* x = req.header("x-api-key"))
        key = *x;
      if (!constant_time_equal(key, options.api_key))
        throw ApiError(401, key.empty()
                                ? "no API key given (Authorization: Bearer KEY or x-api-key)"
                                : "invalid API key");
    }
    if (!ready.load()) throw ApiError(503, "the model is loading");
    const bool get = req.method == "GET", post = req.method == "POST";
    if (path == "/metrics" && get) {
      return answer({.status = 200,
                     .content_type = "text/plain; version=0.0.4",
                     .body = metrics.render(snapshot())});
    }
    if (path == "/models" && get)
      return answer(json_response(200, openai::models_json(model, created)));
    if (path.rfind("/models/", 0) == 0 && get) {
      if (path.substr(8) != model.name)
        throw ApiError(
            404, fmt::format("no model '{}' (this server has '{}')", path.substr(8), model.name),
            "model", "model_not_found");
      return answer(json_response(200, openai::model_json(model, created)));
    }
    if (path == "/chat/completions" && post) return chat_completions(req, out);
    if (path == "/completions" && post) return completions(req, out);
    if (path == "/messages" && post) return messages(req, out);
    if (path == "/messages/count_tokens" && post) return count_tokens(req, out);
    if (path == "/responses" && post) return responses(req, out);
    const bool known = path == "/metrics" || path == "/models" || path == "/chat/completions" ||
                       path == "/completions" || path == "/messages" ||
                       path == "/messages/count_tokens" || path == "/responses";
    if (known) throw ApiError(405, fmt::format("{} does not take {}", req.path, req.method));
    throw ApiError(404, fmt::format("no endpoint {} {}", req.method, req.path));
  } catch (const ApiError& e) {
    answer(api_error_response(e, anthropic_shape));
  } catch (const std::exception& e) {
    // A bad request never costs the process: anything unexpected is a 500 for this request only.
    log(LogLevel::kError, "serve: {} {}: {}", req.method, req.path, e.what());
    const std::string message = std::string("internal error: ") + e.what();
    answer(json_response(500, anthropic_shape ? anthropic::error_json(500, message)
                                              : openai::error_json(500, message)));
  }
}

Server::Server(ServeOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
}

Server::~Server() {
  auto& s = *impl_;
  if (s.scheduler && s.scheduler_thread.joinable()) {
    s.scheduler->shutdown(false);
    s.scheduler_thread.join();
  }
  s.reaper_stop = true;
  if (s.reaper.joinable()) s.reaper.join();
  if (s.http) s.http->stop();
}

void Server::start() {
  auto& s = *impl_;
  HttpOptions ho = s.options.http;
  ho.error_response = [](int status, const std::string& message, const std::string& path) {
    return api_error_response(ApiError(status, message), anthropic_route(route_of(path)));
  };
  s.http = std::make_unique<HttpServer>(
      ho,
      [&s](HttpRequest&& req, std::shared_ptr<Responder> out) { s.handle(std::move(req), out); });
  s.http->start();
  s.reaper = std::thread([&s] { s.reap(); });
}

void Server::load() {
  auto& s = *impl_;
  s.engine = engine::Engine::load(s.options.model_path, s.options.engine);
  s.tokenizer =
      std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(s.engine->file()));
  s.model.name = s.options.model_name;
  if (s.model.name.empty())
    s.model.name = std::filesystem::path(s.options.model_path).stem().string();
  s.model.dialect = chat::dialect_for(s.engine->identity().checkpoint);
  s.model.checkpoint = s.engine->identity().checkpoint;
  s.model.n_ctx = s.engine->states().n_ctx();
  s.model.n_vocab = s.tokenizer->n_vocab();
  s.model.defaults = gen::to_json(gen::checkpoint_defaults(s.engine->identity(), s.tokenizer.get(),
                                                           s.engine->config().n_layer_nextn));
  s.scheduler =
      std::make_unique<gen::Scheduler>(*s.engine, *s.tokenizer,
                                       gen::SchedulerOptions{.max_queue = s.options.max_queue,
                                                             .prefix_cache = s.options.prefix_cache,
                                                             .cache = s.options.cache,
                                                             .draft = s.options.draft});
  s.services = {.scheduler = s.scheduler.get(),
                .metrics = &s.metrics,
                .request_timeout = s.options.request_timeout};
  s.scheduler_thread = std::thread([&s] { s.scheduler->run(); });
  s.ready = true;
  fmt::print(stderr, "serve: {} ({} slots, {} tokens each, dialect {}) on http://{}:{}\n",
             s.model.name, s.options.engine.n_slots, s.model.n_ctx,
             chat::dialect_name(s.model.dialect), s.options.http.host, s.http->port());
  auto& st = s.engine->states();
  if (s.options.prefix_cache) {
    const int64_t room =
        st.free_pages(state::Track::kTrunk) -
        int64_t{st.n_slots()} * ((st.n_ctx() + st.page_size() - 1) / st.page_size());
    fmt::print(stderr,
               "serve: prefix cache on: KV room {} pages ({} MiB), snapshots {} MiB each, up to "
               "{} MiB in backend memory and {} MiB on the host, one every {} pages\n",
               std::max<int64_t>(room, 0),
               std::max<int64_t>(room, 0) * st.page_bytes(state::Track::kTrunk) >> 20,
               st.recurrent_bytes() >> 20, s.options.cache.state_bytes >> 20,
               s.options.cache.host_bytes >> 20, s.options.cache.snapshot_every_pages);
  } else {
    fmt::print(stderr, "serve: prefix cache off\n");
  }
}

int Server::port() const {
  return impl_->http ? impl_->http->port() : 0;
}

void Server::request_stop() {
  std::lock_guard lock(impl_->stop_mutex);
  impl_->stop_requested = true;
  impl_->stop_cv.notify_all();
}

void Server::wait() {
  auto& s = *impl_;
  {
    std::unique_lock lock(s.stop_mutex);
    s.stop_cv.wait(lock, [&] { return s.stop_requested; });
  }
  fmt::print(stderr, "serve: stopping: no new connections; finishing running requests\n");
  s.stopping = true;
  s.http->stop_accepting();
  if (s.scheduler) {
    s.scheduler->shutdown(/*drain=*/true);
    s.scheduler_thread.join();
  }
  // The last updates are posted to their connections: let them be written (bounded wait).
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (s.http->answers_in_flight() > 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.reaper_stop = true;
  if (s.reaper.joinable()) s.reaper.join();
  s.http->stop();
  fmt::print(stderr, "serve: stopped\n");
}

}  // namespace qwenrt::serve
