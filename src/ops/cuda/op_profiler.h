// QWENRT_CUDA_PROFILE=1 (cuda_ops.h): every op timed with a pair of events on the stream, summed
// per op class after each step, printed at exit.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/cuda/check.h"

namespace qwenrt::ops::cuda {

namespace op_class {
enum OpClass {
  kEmbed,
  kMatmul,
  kNorm,
  kRope,
  kElementwise,
  kAttention,
  kDeltaNet,
  kMoe,
  kFfn,
  kSample,
  kNumClasses
};
}  // namespace op_class
using op_class::OpClass;

class OpProfiler {
 public:
  OpProfiler() = default;
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  ~OpProfiler() {
    for (auto& e : events_) {
      cudaEventDestroy(e.start);
      cudaEventDestroy(e.stop);
    }
  }

  void begin(OpClass c, cudaStream_t stream) {
    if (used_ == events_.size()) {
      Event e{};
      QWENRT_CUDA_CHECK(cudaEventCreate(&e.start));
      QWENRT_CUDA_CHECK(cudaEventCreate(&e.stop));
      events_.push_back(e);
    }
    Event& e = events_[used_];
    e.op = c;
    QWENRT_CUDA_CHECK(cudaEventRecord(e.start, stream));
  }
  void end(cudaStream_t stream) {
    QWENRT_CUDA_CHECK(cudaEventRecord(events_[used_].stop, stream));
    ++used_;
  }
  // After a step's work finished: adds its op times to the totals.
  void collect() {
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      QWENRT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i].start, events_[i].stop));
      ms_[events_[i].op] += ms;
      ++calls_[events_[i].op];
    }
    if (used_) ++steps_;
    used_ = 0;
  }
  void print() const {
    static const char* const kNames[] = {"embed",     "matmul",   "norm", "rope", "elementwise",
                                         "attention", "deltanet", "moe",  "ffn",  "sample"};
    double total = 0;
    for (double ms : ms_) total += ms;
    std::string text = fmt::format("cuda profile: {} steps, {:.3f} ms of ops\n", steps_, total);
    for (int c = 0; c < op_class::kNumClasses; ++c) {
      if (!calls_[c]) continue;
      text += fmt::format("  {:<12} {:>10.3f} ms {:>5.1f}% {:>8} calls\n", kNames[c], ms_[c],
                          total > 0 ? 100 * ms_[c] / total : 0.0, calls_[c]);
    }
    std::fputs(text.c_str(), stderr);
  }

 private:
  struct Event {
    cudaEvent_t start, stop;
    OpClass op;
  };
  std::vector<Event> events_;
  size_t used_ = 0;
  double ms_[op_class::kNumClasses] = {};
  int64_t calls_[op_class::kNumClasses] = {};
  int64_t steps_ = 0;
};

}  // namespace qwenrt::ops::cuda
