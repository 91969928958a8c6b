// `qwenrt bench [-m MODEL] [-p 512,4096] [-n 128] [-d 0] [-b 8,32,128] [-r 5] [--json]`: the speed
// figures DESIGN.md asks for, measured through Engine::step on random token ids:
//   ppP      prefill of P tokens from an empty sequence, one step; tok/s and time to first token
//   tgN      decode at batch 1: N steps of one token after 4 untimed warm-up steps
//   tgN xB   aggregate decode: B sequences, N steps of B rows (one token each); tok/s of all rows
//   tgN checkR / tgN mtp-draft   speculative checks of R rows / MTP drafts at batch 1 (below)
// Each figure is the median of -r repeats (min and max shown); peak resident memory at the end.
// bench/llamacpp_compare.py runs the same figures through llama.cpp on the same file.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "core/error.h"
#include "engine/engine.h"

namespace qwenrt::cli {
namespace {

struct BenchOptions {
  ModelOption model;
  std::vector<int64_t> prefill{512, 4096};
  int64_t depth = 0;  // decode after a prompt of this many tokens (llama-bench's -d)
  int64_t decode = 128;
  std::vector<int64_t> batches{8, 32, 128};
  std::vector<int64_t> check_rows;  // speculative checks of this many rows (--check-rows)
  bool mtp_drafts = false;          // time MTP drafts at batch 1 (--mtp-drafts)
  int64_t draft_vocab = 0;          // their draft vocabulary (--draft-vocab; 0: every id)
  int repeats = 5;
  uint64_t seed = 1;
  bool json = false;
  BackendOptions backend;
};

constexpr int kWarmupSteps = 4;

struct Figure {
  std::string test;
  int64_t tokens = 0;           // tokens per repeat
  std::vector<double> seconds;  // one per repeat
  // Streamed experts (--expert-cache) over the timed steps of every repeat.
  ops::ExpertStats experts;
  int64_t timed_tokens = 0;
  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
  double rate(double sec) const { return sec > 0 ? tokens / sec : 0.0; }
  double slowest_rate() const { return rate(*std::max_element(seconds.begin(), seconds.end())); }
  double fastest_rate() const { return rate(*std::min_element(seconds.begin(), seconds.end())); }
};

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class Bench {
 public:
  Bench(const BenchOptions& opt, std::string path) : opt_(opt), path_(std::move(path)) {}

  std::vector<Figure> run() {
    std::vector<Figure> out;
    const int64_t max_p = *std::max_element(opt_.prefill.begin(), opt_.prefill.end());
    {
      engine::EngineOptions eo;
      apply(opt_.backend, eo);
      const int64_t max_check = opt_.check_rows.empty() ? 0
                                                        : *std::max_element(opt_.check_rows.begin(),
                                                                            opt_.check_rows.end());
      eo.n_ctx = std::max(max_p, opt_.depth + opt_.decode + kWarmupSteps + max_check);
      eo.verify_rows = static_cast<int>(max_check);
      eo.draft_vocab = opt_.draft_vocab;
      const double load_s = seconds_of([&] { e_ = engine::Engine::load(path_, eo); });
      load_seconds_ = load_s;
      auto& e = e_;
      rng_.seed(opt_.seed);
      n_vocab_ = e->config().n_vocab;
      for (int64_t p : opt_.prefill) out.push_back(prefill(*e, p));
      out.push_back(decode(*e, 1));
      for (int64_t rows : opt_.check_rows) out.push_back(check(*e, rows));
      if (opt_.mtp_drafts) out.push_back(mtp_drafts(*e));
      e_.reset();
    }
    for (int64_t b : opt_.batches) {
      if (b == 0) continue;
      engine::EngineOptions eo;
      apply(opt_.backend, eo);
      eo.n_slots = static_cast<int>(b);
      eo.n_ctx = opt_.depth + opt_.decode + kWarmupSteps;
      auto e = engine::Engine::load(path_, eo);
      out.push_back(decode(*e, b));
    }
    return out;
  }

 private:
  int32_t token() { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(n_vocab_)); }

  Figure prefill(engine::Engine& e, int64_t p) {
    Figure f{fmt::format("pp{}", p), p, {}};
    for (int r = 0; r <= opt_.repeats; ++r) {  // repeat 0 warms up and is not counted
      e.states().reset(0);
      engine::Batch b;
      for (int64_t i = 0; i < p; ++i) b.add(0, token(), static_cast<int32_t>(i), i == p - 1);
      const double s = seconds_of([&] { e.step(b); });
      if (r > 0) f.seconds.push_back(s);
    }
    return f;
  }

  // Empty slots 0..n_seq - 1, then the untimed prompt of `depth` tokens in each.
  void prime(engine::Engine& e, int64_t n_seq) {
    for (int64_t s = 0; s < n_seq; ++s) e.states().reset(static_cast<int>(s));
    if (opt_.depth <= 0) return;
    for (int64_t s = 0; s < n_seq; ++s) {
      engine::Batch p;
      for (int64_t i = 0; i < opt_.depth; ++i)
        p.add(static_cast<int>(s), token(), static_cast<int32_t>(i), i == opt_.depth - 1);
      e.step(p);
    }
  }

  // Each repeat: slots 0..n_seq - 1 primed, kWarmupSteps untimed steps, then `decode` timed ones;
  // step(pos) runs the step at position pos.
  template <class Step>
  void time_steps(engine::Engine& e, int64_t n_seq, Step& step, Figure& f) {
    for (int r = 0; r < opt_.repeats; ++r) {
      prime(e, n_seq);
      const auto base = static_cast<int32_t>(opt_.depth);
      for (int32_t pos = 0; pos < kWarmupSteps; ++pos) step(base + pos);
      const ops::ExpertStats before = e.backend().expert_stats();
      f.seconds.push_back(seconds_of([&] {
        for (int64_t i = 0; i < opt_.decode; ++i)
          step(base + static_cast<int32_t>(kWarmupSteps + i));
      }));
      const ops::ExpertStats after = e.backend().expert_stats();
      f.experts.lookups += after.lookups - before.lookups;
      f.experts.hits += after.hits - before.hits;
      f.experts.prefetch_hits += after.prefetch_hits - before.prefetch_hits;
      f.experts.loads += after.loads - before.loads;
      f.experts.bytes_read += after.bytes_read - before.bytes_read;
      f.experts.capacity = after.capacity;
      f.timed_tokens += f.tokens;
    }
  }

  // Speculative checks as the scheduler runs them, at batch 1: each step feeds `n_rows` rows
  // (the sequence's token and n_rows - 1 drafts) keeping their states, samples every row
  // greedily, then keeps only the first (Engine::rollback): a check that accepts nothing. Its
  // rate against tgN's is what a check costs against a plain step.
  Figure check(engine::Engine& e, int64_t n_rows) {
    const std::string depth = opt_.depth > 0 ? fmt::format(" @ d{}", opt_.depth) : "";
    Figure f{fmt::format("tg{} check{}{}", opt_.decode, n_rows, depth), opt_.decode, {}};
    std::vector<ops::SamplingRow> rows(static_cast<size_t>(n_rows));
    for (auto& r : rows) r = {.temperature = 0, .logprobs = false};  // as generation asks
    std::vector<ops::SampledToken> out;
    engine::Batch b;
    auto step = [&](int32_t pos) {
      b.clear();
      for (int64_t j = 0; j < n_rows; ++j) b.add(0, token(), pos + static_cast<int32_t>(j), true);
      b.keep_states = {0};
      e.step_sample(b, rows, 0, out);
      e.rollback(0, pos + 1);  // the slot's length: up to and including the first row
    };
    time_steps(e, 1, step, f);
    return f;
  }

  // MTP drafts as drafting runs them, at batch 1: each step is one Engine::mtp_draft of one row
  // (a random token, the previous draft's hidden state: a chain), then the row is cut off the
  // MTP track again (Engine::truncate_mtp), so every step sees the same track. Its rate against
  // tgN's is what a draft costs against a plain step.
  Figure mtp_drafts(engine::Engine& e) {
    if (!e.has_mtp()) fail("--mtp-drafts: {} has no MTP block (synth --mtp adds one)", path_);
    const std::string vocab = opt_.draft_vocab > 0 ? fmt::format(" v{}", opt_.draft_vocab) : "";
    Figure f{fmt::format("tg{} mtp-draft{}", opt_.decode, vocab), opt_.decode, {}};
    std::vector<float> hidden(static_cast<size_t>(e.config().n_embd), 0.0f), next;
    std::vector<int32_t> drafts;
    engine::MtpBatch b;
    auto step = [&](int32_t) {
      const auto at = static_cast<int32_t>(e.states().n_mtp_tokens(0));
      b.clear();
      b.add(0, token(), at, hidden, true);
      e.mtp_draft(b, drafts, next);
      e.truncate_mtp(0, at);
      hidden.swap(next);
    };
    time_steps(e, 1, step, f);
    return f;
  }

  // Decode steps as generation runs them: each ends in a greedy sample on the backend (the
  // sampled ids are not fed back: random ids keep every repeat's work the same), after an
  // untimed prompt of `depth` tokens per sequence.
  Figure decode(engine::Engine& e, int64_t n_seq) {
    const std::string depth = opt_.depth > 0 ? fmt::format(" @ d{}", opt_.depth) : "";
    Figure f{n_seq == 1 ? fmt::format("tg{}{}", opt_.decode, depth)
                        : fmt::format("tg{}{} x{}", opt_.decode, depth, n_seq),
             opt_.decode * n_seq,
             {}};
    std::vector<ops::SamplingRow> rows(static_cast<size_t>(n_seq));
    for (auto& r : rows) r = {.temperature = 0, .logprobs = false};  // as generation asks
    std::vector<ops::SampledToken> out;
    engine::Batch b;
    auto step_all = [&](int32_t pos) {
      b.clear();
      for (int64_t s = 0; s < n_seq; ++s) b.add(static_cast<int>(s), token(), pos, true);
      e.step_sample(b, rows, 0, out);
    };
    time_steps(e, n_seq, step_all, f);
    return f;
  }

 public:
  double load_seconds() const { return load_seconds_; }

 private:
  std::unique_ptr<engine::Engine> e_;
  double load_seconds_ = 0;

  const BenchOptions& opt_;
  std::string path_;
  std::mt19937_64 rng_;
  int64_t n_vocab_ = 0;
};

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;  // Linux reports KiB
}

int run_bench(const BenchOptions& opt) {
  if (opt.repeats < 1) fail("-r: expected at least 1 repeat, got {}", opt.repeats);
  if (opt.decode < 1) fail("-n: expected at least 1 decode step, got {}", opt.decode);
  if (opt.prefill.empty()) fail("-p: expected at least one prefill length");
  for (int64_t p : opt.prefill)
    if (p < 1) fail("-p: prefill lengths must be at least 1, got {}", p);
  for (int64_t c : opt.check_rows)
    if (c < 2 || c > 16) fail("--check-rows: rows per check must be 2..16, got {}", c);
  for (int64_t b : opt.batches)
    if (b != 0 && (b < 2 || b > 4096)) fail("-b: aggregate batch sizes must be 2..4096, got {}", b);
  const std::string path = resolve_model(opt.model);
  Bench bench(opt, path);
  const std::vector<Figure> figures = bench.run();
  const double rss = peak_rss_mib();

  if (opt.json) {
    nlohmann::json j = {{"model", path},
                        {"backend", opt.backend.backend},
                        {"threads", opt.backend.threads},
                        {"repeats", opt.repeats},
                        {"depth", opt.depth},
                        {"load_seconds", bench.load_seconds()},
                        {"peak_rss_mib", rss},
                        {"results", nlohmann::json::array()}};
    for (const Figure& f : figures) {
      j["results"].push_back({{"test", f.test},
                              {"tokens", f.tokens},
                              {"seconds", f.seconds},
                              {"tok_s_median", f.rate(f.median())},
                              {"tok_s_min", f.slowest_rate()},
                              {"tok_s_max", f.fastest_rate()},
                              {"median_ms", f.median() * 1e3}});
      if (f.experts.capacity > 0) {
        j["results"].back()["experts"] = {
            {"cache_slots", f.experts.capacity},
            {"lookups", f.experts.lookups},
            {"hits", f.experts.hits},
            {"prefetch_hits", f.experts.prefetch_hits},
            {"loads", f.experts.loads},
            {"bytes_read", f.experts.bytes_read},
            {"bytes_per_token", f.timed_tokens ? f.experts.bytes_read / f.timed_tokens : 0}};
      }
    }
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  fmt::print("model: {}  backend: {}  threads: {}  repeats: {} (median; min..max)\n", path,
             opt.backend.backend, opt.backend.threads, opt.repeats);
  fmt::print("{:<14} {:>12} {:>22} {:>12}\n", "test", "tok/s", "min..max", "median ms");
  for (const Figure& f : figures) {
    fmt::print("{:<14} {:>12.1f} {:>22} {:>12.1f}\n", f.test, f.rate(f.median()),
               fmt::format("{:.1f}..{:.1f}", f.slowest_rate(), f.fastest_rate()), f.median() * 1e3);
    if (f.experts.capacity > 0 && f.experts.lookups > 0) {
      fmt::print(
          "  experts: {} slots, hit rate {:.1f}% ({:.1f}% by prefetch), {:.2f} MB read per "
          "token\n",
          f.experts.capacity, 100.0 * f.experts.hits / f.experts.lookups,
          100.0 * f.experts.prefetch_hits / f.experts.lookups,
          f.timed_tokens ? f.experts.bytes_read / 1e6 / f.timed_tokens : 0.0);
    }
  }
  fmt::print(
      "ppP median ms is the time to first token for a P-token prompt; load {:.2f} s; peak RSS "
      "{:.0f} MiB\n",
      bench.load_seconds(), rss);
  return 0;
}

}  // namespace

Run add_bench(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand(
      "bench", "Measure prefill, decode and aggregate decode speed (medians of repeats)");
  add_model_option(sub, opt->model, "Model (default: the embedded tiny model)");
  add_backend_options(sub, opt->backend);
  sub->add_option("-p,--prefill", opt->prefill, "Prefill lengths (comma-separated)")
      ->delimiter(',');
  sub->add_option("-n,--decode", opt->decode, "Decode steps per repeat");
  sub->add_option("-d,--depth", opt->depth, "Decode after a prompt of this many tokens (untimed)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("-b,--batches", opt->batches,
                  "Concurrent sequences for aggregate decode (comma-separated; 0 skips them)")
      ->delimiter(',');
  sub->add_option("--check-rows", opt->check_rows,
                  "Also time speculative checks of this many rows at batch 1 (comma-separated, "
                  "2..16; each keeps one row: the cost of a check against a plain step)")
      ->delimiter(',');
  sub->add_flag("--mtp-drafts", opt->mtp_drafts,
                "Also time MTP drafts at batch 1 (one chained row each, cut off again): the "
                "drafter's cost against a plain step; the model needs an MTP block");
  sub->add_option("--draft-vocab", opt->draft_vocab,
                  "The MTP drafts' vocabulary: the first N token ids (0: every id)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("-r,--repeats", opt->repeats, "Repeats per figure");
  sub->add_option("--seed", opt->seed, "Seed of the random token ids");
  sub->add_flag("--json", opt->json, "Print JSON (every repeat's seconds) instead of a table");
  return [opt] { return run_bench(*opt); };
}

}  // namespace qwenrt::cli
