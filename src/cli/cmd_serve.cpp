// `qwenrt serve [-m MODEL] [--host H] [--port P] [--parallel N] [-c CTX] [--max-queue N]
// [--api-key KEY] [--backend ...]`: the HTTP server (src/serve): OpenAI chat, completions and
// Responses, Anthropic Messages.
#include <fmt/format.h>
#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <thread>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/draft_options.h"
#include "cli/model_option.h"
#include "core/error.h"
#include "serve/server.h"

namespace qwenrt::cli {
namespace {

struct ServeCliOptions {
  ModelOption model;
  BackendOptions backend;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int64_t n_ctx = 0;
  int max_queue = 256;
  std::string api_key;
  std::string alias;
  int io_threads = 4;
  size_t max_body_mb = 16;
  double timeout = 600;
  std::string prefix_cache = "on";
  int64_t cache_kv_mb = -1;  // -1: eight times the slots' own KV, at most 4 GiB
  int64_t cache_state_mb = 2048;
  int64_t cache_host_mb = 4096;
  int cache_snapshot_pages = 16;
  DraftCliOptions draft;
};

int run_serve(const ServeCliOptions& opt) {
  // SIGINT / SIGTERM go to one thread that asks the server to stop (blocked before any other
  // thread starts, so every thread inherits the mask and none is interrupted by them).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error code, not a signal

  serve::ServeOptions so;
  so.model_path = resolve_model(opt.model);
  so.model_name = opt.alias;
  so.http.host = opt.host;
  so.http.port = opt.port;
  so.http.io_threads = opt.io_threads;
  so.http.max_body = opt.max_body_mb << 20;
  so.engine.n_slots = opt.parallel;
  so.engine.n_ctx = opt.n_ctx;
  apply(opt.backend, so.engine);
  so.max_queue = opt.max_queue;
  so.api_key = opt.api_key;
  if (so.api_key.empty())
    if (const char* key = std::getenv("QWENRT_API_KEY")) so.api_key = key;
  so.request_timeout = opt.timeout;
  so.prefix_cache = opt.prefix_cache == "on";
  so.engine.cache_kv_bytes =
      so.prefix_cache ? (opt.cache_kv_mb < 0 ? -1 : opt.cache_kv_mb << 20) : 0;
  so.cache.state_bytes = opt.cache_state_mb << 20;
  so.cache.host_bytes = opt.cache_host_mb << 20;
  so.cache.snapshot_every_pages = opt.cache_snapshot_pages;
  {
    gen::SchedulerOptions sched;
    apply(opt.draft, so.model_path, so.engine, sched);
    so.draft = sched.draft;
  }

  serve::Server server(so);
  server.start();
  std::thread([&server, signals] {
    int received = 0;
    sigwait(&signals, &received);
    fmt::print(stderr, "serve: signal {}\n", received);
    server.request_stop();
  }).detach();
  server.load();
  server.wait();
  return 0;
}

}  // namespace

Run add_serve(CLI::App& app) {
  auto opt = std::make_shared<ServeCliOptions>();
  auto* sub = app.add_subcommand("serve", "Serve the model over HTTP (OpenAI and Anthropic APIs)");
  add_model_option(sub, opt->model, "Model (default: the embedded tiny chat model)");
  sub->add_option("--host", opt->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", opt->port, "Port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  sub->add_option("--parallel", opt->parallel, "Sequences generated at once (engine slots)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("-c,--ctx-size", opt->n_ctx,
                  "Context per sequence in tokens (default: model's, capped)");
  sub->add_option("--max-queue", opt->max_queue,
                  "Sequences waiting for a slot before requests get 429")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--api-key", opt->api_key,
                  "Require this key (Authorization: Bearer KEY or x-api-key; default: "
                  "$QWENRT_API_KEY, none if unset)");
  sub->add_option("--alias", opt->alias, "Model id the API reports (default: the file's name)");
  sub->add_option("--io-threads", opt->io_threads, "HTTP I/O threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--max-body-mb", opt->max_body_mb, "Largest request body in MiB (else 413)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--timeout", opt->timeout, "Seconds a request may take (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_draft_options(sub, opt->draft);
  sub->add_option("--prefix-cache", opt->prefix_cache,
                  "Resume prompts from the longest cached prefix (KV pages + recurrent-state "
                  "snapshots)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--cache-kv-mb", opt->cache_kv_mb,
                  "KV room for the prefix cache in MiB (default: eight times the slots' own, at "
                  "most 4096)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  sub->add_option("--cache-state-mb", opt->cache_state_mb,
                  "Recurrent-state snapshots kept in backend memory, MiB (then spilled to host)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  sub->add_option("--cache-host-mb", opt->cache_host_mb,
                  "Recurrent-state snapshots kept in host memory, MiB (then evicted)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  sub->add_option("--cache-snapshot-pages", opt->cache_snapshot_pages,
                  "A snapshot every this many KV pages (64 tokens) inside long prompts (0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  add_backend_options(sub, opt->backend);
  return [opt] { return run_serve(*opt); };
}

}  // namespace qwenrt::cli
