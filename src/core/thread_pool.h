// A fixed pool of worker threads running parallel regions.
//
// Two entry points share the same workers:
//  - run(n_parts, fn): fn(part, n_parts) for part in [0, n_parts), the calling thread taking part
//  0.
//    No allocation and no lock on the way in or out: the job is a function pointer plus a context
//    pointer, workers spin briefly on a generation counter before sleeping, so a region costs about
//    a microsecond when the workers are awake (the decode step runs ~100 of them per token).
//  - parallel_for(n, std::function): the original range API, built on run().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
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

  // Calls fn(part, n_parts) once for each part in [0, n_parts), n_parts clamped to [1, size()];
  // part p runs on worker p (part 0 on the caller), so a part may own per-thread scratch. Returns
  // when all parts are done; the first exception is rethrown. fn is not copied: zero allocation.
  template <class F>
  void run(int n_parts, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_erased(
        n_parts, [](void* ctx, int part, int parts) { (*static_cast<Fn*>(ctx))(part, parts); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using JobFn = void (*)(void* ctx, int part, int n_parts);
  void run_erased(int n_parts, JobFn fn, void* ctx);
  void worker_loop(int index);
  void run_part(int index);

  std::vector<std::thread> workers_;
  // The current job; written by the caller before it bumps generation_ (release), read by workers
  // after they observe the new generation (acquire), and not written again until every worker has
  // decremented pending_ (so there is no overlap between one job's readers and the next writer).
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int job_parts_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};             // workers that have not finished the current generation
  std::atomic<int> sleepers_{0};            // workers blocked on wake_ (changed under sleep_mutex_)
  std::atomic<bool> caller_asleep_{false};  // the caller is blocked on done_
  std::atomic<bool> stopping_{false};
  // The slow path only: a thread that has spun long enough sleeps on a condition variable.
  // (Not std::atomic::wait: libstdc++ 12's proxy-waiter implementation loses wake-ups.)
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::mutex error_mutex_;  // guards error_ (only touched when a part throws)
  std::exception_ptr error_;
};

}  // namespace qwenrt
