#include "ops/host_group.h"

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace qwenrt::ops {

HostGroup::HostGroup(int size) : size_(size), arrays_(size), sums_(size) {
  if (size < 1) fail("host group: {} ranks", size);
}

void HostGroup::wait() {
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (aborted_.load(std::memory_order_acquire)) fail("tensor parallel: another rank failed");
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
    arrived_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    return;
  }
  auto passed = [&] {
    return generation_.load(std::memory_order_acquire) != gen ||
           aborted_.load(std::memory_order_acquire);
  };
  for (int i = 0; i < 4096 && !passed(); ++i) std::this_thread::yield();
  if (!passed()) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, passed);
  }
  if (generation_.load(std::memory_order_acquire) == gen)
    fail("tensor parallel: another rank failed");
}

void HostGroup::all_reduce_sum(int rank, float* x, int64_t n) {
  if (size_ == 1) return;
  arrays_[rank] = x;
  wait();  // every rank's array is posted
  const int64_t begin = n * rank / size_, end = n * (rank + 1) / size_;
  std::vector<float>& sum = sums_[rank];
  sum.assign(arrays_[0] + begin, arrays_[0] + end);
  for (int r = 1; r < size_; ++r) {
    const float* a = arrays_[r];
    for (int64_t i = begin; i < end; ++i) sum[i - begin] += a[i];
  }
  wait();  // every slice is summed: nobody reads the arrays any more
  for (int r = 0; r < size_; ++r) std::copy(sum.begin(), sum.end(), arrays_[r] + begin);
  wait();  // every array holds the whole sum
}

void HostGroup::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void HostGroup::reset() {
  aborted_.store(false, std::memory_order_release);
  arrived_.store(0, std::memory_order_relaxed);
}

}  // namespace qwenrt::ops
