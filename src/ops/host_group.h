// The ranks of a tensor-parallel model on host-memory backends (ref, cpu): one thread a rank, in
// one process. all_reduce_sum adds every rank's array in rank order, slice by slice (each rank sums
// its slice for all), so every rank ends with the same floats. A rank that fails aborts the group:
// the others' waits throw instead of hanging.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace qwenrt::ops {

class HostGroup {
 public:
  explicit HostGroup(int size);
  int size() const { return size_; }
  // Called by every rank with its x [n] (the same n); returns when each x holds the sum.
  void all_reduce_sum(int rank, float* x, int64_t n);
  // A rank failed: wakes the others, whose calls throw. reset() rearms the group (between steps,
  // when no rank is inside a call).
  void abort();
  void reset();

 private:
  void wait();
  int size_;
  std::vector<float*> arrays_;
  std::vector<std::vector<float>> sums_;  // per rank: its slice of the sum
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace qwenrt::ops
