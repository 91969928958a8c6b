// The server's counters and histograms, and GET /metrics in Prometheus' text format (0.0.4).
// Request counts and latency histograms are kept here; token totals, queue depth, running
// sequences and KV pages come from the scheduler's stats when the page is rendered.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gen/scheduler.h"

namespace qwenrt::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, increasing; +Inf is implied
  void observe(double value, uint64_t weight = 1);
  // "# HELP", "# TYPE" and the _bucket / _sum / _count lines.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative (made cumulative when rendered)
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the page shows besides the metrics kept here.
struct MetricsSnapshot {
  bool ready = false;
  gen::SchedulerStats scheduler;
  size_t connections = 0;
  size_t answers_in_flight = 0;
};

class Metrics {
 public:
  Metrics();
  // A request answered: endpoint ("/v1/chat/completions"), HTTP status.
  void request(const std::string& endpoint, int status);
  // A sequence ended: its time to first token (queue + prompt), its generation time and tokens.
  void sequence(double ttft_seconds, double generate_seconds, int64_t n_generated);
  std::string render(const MetricsSnapshot& snapshot) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, inter_token_, sequence_seconds_;
};

}  // namespace qwenrt::serve
