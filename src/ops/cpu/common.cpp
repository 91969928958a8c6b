#include "ops/cpu/common.h"

#include <algorithm>
#include <memory>
#include <new>

namespace qwenrt::ops::cpu {
namespace {

SimdLevel detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return SimdLevel::kAvx512;
  }
  if (fma && __builtin_cpu_supports("avx2")) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kPortable;
}

std::atomic<int>& active_level() {
  static std::atomic<int> level{static_cast<int>(detect())};
  return level;
}

}  // namespace

SimdLevel best_simd_level() {
  static const SimdLevel best = detect();
  return best;
}

SimdLevel simd_level() {
  return static_cast<SimdLevel>(active_level().load(std::memory_order_relaxed));
}

SimdLevel force_simd_level(SimdLevel level) {
  const SimdLevel set = std::min(level, best_simd_level());
  active_level().store(static_cast<int>(set), std::memory_order_relaxed);
  return set;
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> levels;
  for (int l = 0; l <= static_cast<int>(best_simd_level()); ++l) {
    levels.push_back(static_cast<SimdLevel>(l));
  }
  return levels;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kPortable:
      break;
  }
  return "portable";
}

float* thread_scratch(size_t n, int slot) {
  struct Buffer {
    struct Free {
      void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
    };
    std::unique_ptr<float[], Free> data;
    size_t size = 0;
  };
  constexpr int kSlots = 4;
  thread_local Buffer buffers[kSlots];
  Buffer& b = buffers[slot];
  if (b.size < n) {
    b.data.reset(static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64))));
    b.size = n;
  }
  return b.data.get();
}

}  // namespace qwenrt::ops::cpu
