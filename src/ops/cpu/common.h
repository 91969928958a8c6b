// What the CPU backend's non-matmul kernels share: the batch layout (Span), the SIMD level chosen
// at run time (with a test hook to force a lower one), dynamic task scheduling over the pool, and
// per-thread scratch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace qwenrt::ops::cpu {

// One sequence of a step's batch: rows [begin, begin + count) of the activations belong to
// sequence slot `slot`, which had n_past tokens before this step. (The engine converts to this.)
struct Span {
  int32_t slot;
  int32_t begin;
  int32_t count;
  int32_t n_past;
  int32_t keep_states;  // ops::Span::keep_states
};

// Which instantiation of the kernels runs. Every kernel is compiled for each level in its own
// file-local target region (no global -march), and the best one the CPU supports is picked once.
enum class SimdLevel { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU and build support (AVX2 = avx2+fma; AVX512 = avx512f/bw/vl+fma).
SimdLevel best_simd_level();
// The level kernels use now: best_simd_level() unless forced lower.
SimdLevel simd_level();
// Test hook: make kernels run at `level` (clamped to best_simd_level()); returns the level set.
SimdLevel force_simd_level(SimdLevel level);
// Every level this machine can run, lowest first (what tests loop over).
std::vector<SimdLevel> supported_simd_levels();
const char* simd_level_name(SimdLevel level);

// Runs fn(task) for task in [0, n_tasks) on the pool, handing tasks out one at a time from a shared
// counter so that tasks of uneven cost balance; list expensive tasks first. fn must not throw.
template <class Fn>
void run_tasks(ThreadPool& pool, int64_t n_tasks, const Fn& fn) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || pool.size() == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  struct Shared {
    const Fn* fn;
    int64_t n;
    std::atomic<int64_t> next{0};
  } shared{&fn, n_tasks};
  Shared* s = &shared;  // one pointer captured: std::function keeps it inline (no allocation)
  pool.parallel_for(std::min<int64_t>(pool.size(), n_tasks), [s](int64_t, int64_t) {
    for (int64_t i; (i = s->next.fetch_add(1, std::memory_order_relaxed)) < s->n;) (*s->fn)(i);
  });
}

// A per-thread float buffer of at least n floats, 64-byte aligned, reused across calls (it grows,
// never shrinks). slot picks one of a few independent buffers.
float* thread_scratch(size_t n, int slot = 0);

}  // namespace qwenrt::ops::cpu
