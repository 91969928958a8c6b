#include "core/thread_pool.h"

#include <algorithm>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace qwenrt {
namespace {

// How long an idle thread polls before it sleeps: long enough to bridge the gap between two
// parallel regions of one decode step (a few microseconds of serial work), short enough not to
// steal a core from other processes when the pool is idle.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  { std::lock_guard lock(sleep_mutex_); }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_part(int index) {
  if (index >= job_parts_) return;
  try {
    job_fn_(job_ctx_, index, job_parts_);
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::run_erased(int n_parts, JobFn fn, void* ctx) {
  n_parts = std::clamp(n_parts, 1, size());
  if (n_parts == 1) {
    fn(ctx, 0, 1);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_parts_ = n_parts;
  // Every worker takes part in every generation (those past n_parts just acknowledge it), so no
  // worker can still be reading job_* when the next call overwrites them.
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  // seq_cst pairs with the worker's sleepers_ increment + generation re-check: either it sees the
  // new generation, or we see it asleep and wake it. Taking the mutex orders the notify after a
  // sleeper's predicate check, so it cannot fall between the check and the wait.
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard lock(sleep_mutex_); }
    wake_.notify_all();
  }
  run_part(0);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) {
      cpu_relax();
      continue;
    }
    std::unique_lock lock(sleep_mutex_);
    caller_asleep_.store(true, std::memory_order_seq_cst);
    done_.wait(lock, [this] { return pending_.load(std::memory_order_seq_cst) == 0; });
    caller_asleep_.store(false, std::memory_order_relaxed);
  }
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;  // the generation at construction (not a fresh load: a job may already be out)
  for (;;) {
    uint64_t g;
    for (int spin = 0; (g = generation_.load(std::memory_order_acquire)) == seen; ++spin) {
      if (spin < kSpinIterations) {
        cpu_relax();
        continue;
      }
      std::unique_lock lock(sleep_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      spin = 0;
    }
    seen = g;
    if (stopping_.load(std::memory_order_acquire)) return;
    run_part(index);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_asleep_.load(std::memory_order_seq_cst)) {
      { std::lock_guard lock(sleep_mutex_); }
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int parts = static_cast<int>(std::min<int64_t>(n, size()));
  run(parts, [&](int part, int n_parts) {
    const int64_t begin = n * part / n_parts, end = n * (part + 1) / n_parts;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace qwenrt
