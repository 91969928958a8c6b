#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace qwenrt::serve {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t weight) {
  if (weight == 0) return;
  std::lock_guard lock(mutex_);
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket] += weight;
  sum_ += value * static_cast<double>(weight);
  count_ += weight;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard lock(mutex_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
  return out;
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28}),
      sequence_seconds_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  requests_[{endpoint, status}]++;
}

void Metrics::sequence(double ttft_seconds, double generate_seconds, int64_t n_generated) {
  ttft_.observe(ttft_seconds);
  sequence_seconds_.observe(ttft_seconds + generate_seconds);
  // The gaps between generated tokens: the mean gap of this sequence, once per gap.
  if (n_generated > 1)
    inter_token_.observe(generate_seconds / static_cast<double>(n_generated - 1),
                         static_cast<uint64_t>(n_generated - 1));
}

std::string Metrics::render(const MetricsSnapshot& s) const {
  std::string out;
  auto gauge = [&](const char* name, const char* help, double value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, value);
  };
  auto counter = [&](const char* name, const char* help, double value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, value);
  };
  {
    std::lock_guard lock(mutex_);
    out += "# HELP qwenrt_requests_total HTTP requests answered, by endpoint and status\n";
    out += "# TYPE qwenrt_requests_total counter\n";
    for (const auto& [key, n] : requests_)
      out += fmt::format("qwenrt_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                         key.second, n);
  }
  gauge("qwenrt_ready", "1 once the model is loaded", s.ready ? 1 : 0);
  gauge("qwenrt_http_connections", "Open HTTP connections", static_cast<double>(s.connections));
  gauge("qwenrt_http_answers_in_flight", "Requests read and not yet completely answered",
        static_cast<double>(s.answers_in_flight));
  gauge("qwenrt_queue_depth", "Sequences waiting for a slot", s.scheduler.queued);
  gauge("qwenrt_running_sequences", "Sequences in an engine slot", s.scheduler.running);
  gauge("qwenrt_kv_pages_in_use", "KV cache pages held by sequences",
        static_cast<double>(s.scheduler.kv_pages_in_use));
  const gen::PrefixCacheStats& c = s.scheduler.cache;
  gauge("qwenrt_prefix_cache_kv_pages", "KV pages held only by the prefix cache",
        static_cast<double>(s.scheduler.kv_pages_cached));
  gauge("qwenrt_prefix_cache_entries", "Prefix cache entries (snapshots)",
        static_cast<double>(c.entries));
  gauge("qwenrt_prefix_cache_state_bytes",
        "Recurrent state the prefix cache holds in backend memory",
        static_cast<double>(c.state_bytes));
  gauge("qwenrt_prefix_cache_host_bytes", "Recurrent state the prefix cache spilled to host memory",
        static_cast<double>(c.host_bytes));
  counter("qwenrt_prefix_cache_lookups_total", "Prompts looked up in the prefix cache",
          static_cast<double>(c.lookups));
  counter("qwenrt_prefix_cache_hits_total", "Lookups that resumed from a cached prefix",
          static_cast<double>(c.hits));
  counter("qwenrt_prefix_cache_misses_total", "Lookups that found nothing",
          static_cast<double>(c.lookups - c.hits));
  counter("qwenrt_prefix_cache_hit_tokens_total", "Prompt tokens restored instead of prefilled",
          static_cast<double>(c.hit_tokens));
  counter("qwenrt_prefix_cache_evictions_total", "Prefix cache entries evicted",
          static_cast<double>(c.evictions));
  counter("qwenrt_prefix_cache_spills_total", "Snapshots moved to host memory",
          static_cast<double>(c.spills));
  counter("qwenrt_sequences_submitted_total", "Sequences submitted",
          static_cast<double>(s.scheduler.submitted));
  counter("qwenrt_sequences_finished_total", "Sequences ended (any reason)",
          static_cast<double>(s.scheduler.finished));
  counter("qwenrt_sequences_cancelled_total", "Sequences cancelled",
          static_cast<double>(s.scheduler.cancelled));
  counter("qwenrt_prompt_tokens_total", "Prompt tokens processed",
          static_cast<double>(s.scheduler.prompt_tokens));
  counter("qwenrt_generated_tokens_total", "Tokens generated",
          static_cast<double>(s.scheduler.generated_tokens));
  out += ttft_.render("qwenrt_time_to_first_token_seconds",
                      "Submit to first generated token (queue + prompt), per sequence");
  out += inter_token_.render("qwenrt_inter_token_seconds", "Time between generated tokens");
  out += sequence_seconds_.render("qwenrt_sequence_seconds", "Submit to end, per sequence");
  return out;
}

}  // namespace qwenrt::serve
