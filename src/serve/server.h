// `qwenrt serve`: the model, the scheduler on its own thread, the HTTP layer on a few I/O threads,
// and the routes (OpenAI in openai.cpp; ops endpoints here). /health answers 503 until the model
// is loaded, then 200; request_stop() stops accepting, lets running requests finish and returns
// from wait().
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "gen/draft.h"
#include "gen/prefix_cache.h"
#include "serve/http.h"

namespace qwenrt::serve {

struct ServeOptions {
  std::string model_path;
  std::string model_name;  // the id replies carry; empty: the model's name
  HttpOptions http;
  engine::EngineOptions engine;  // n_slots = --parallel, n_ctx = -c
  int max_queue = 256;           // sequences waiting for a slot; beyond: 429
  std::string api_key;           // empty: no authentication
  double request_timeout = 600;  // seconds from arrival to the end of the answer; 0: none
  bool prefix_cache = true;      // gen/prefix_cache.h; engine.cache_kv_bytes sizes its KV room
  gen::PrefixCacheOptions cache;
  gen::DraftOptions draft;  // speculative decoding; engine.verify_rows must fit draft.max_tokens
};

class Server {
 public:
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens (Error when it cannot); requests other than /health answer 503 until load() is done.
  void start();
  // Loads the model and starts the scheduler thread (Error on a bad model).
  void load();
  int port() const;
  // From any thread (the signal thread): stop accepting, drain, and make wait() return.
  void request_stop();
  // Blocks until request_stop(), then finishes the running requests and stops the I/O threads.
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qwenrt::serve
