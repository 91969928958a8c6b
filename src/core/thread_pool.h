// A fixed pool of worker threads running parallel_for over index ranges.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qwenrt {

class ThreadPool {
 public:
  // n_threads counts the calling thread; 0 means the hardware concurrency.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n); returns when all are done.
  // The first exception thrown by any chunk is rethrown here. Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  void run_chunk(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;  // bumped per job so workers run each job once
  int pending_ = 0;          // workers still running the current job
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace qwenrt
