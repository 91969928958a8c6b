// L2 prefetch from device code (prefetch.cu; the routing kernel's expert prefetch, moe.cu).
#pragma once

#include <cstdint>

namespace qwenrt::ops::cuda {

// One thread asks L2 for [p, p + bytes) in bulk prefetches of `chunk` bytes (sm_90: the copy
// engine fetches them, nothing waits). Start and size are taken to 16 bytes, the bulk prefetch's
// granularity (a partial first or last line only costs that line's miss). Below sm_90 nothing:
// a per-line prefetch from one thread would take longer than the read it is meant to speed up.
__device__ __forceinline__ void l2_prefetch_range(const void* p, int64_t bytes,
                                                  int64_t chunk = 64 << 10) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + 15) & ~uintptr_t{15};
  const uintptr_t end = (a + static_cast<uintptr_t>(bytes)) & ~uintptr_t{15};
  for (uintptr_t at = begin; at < end; at += static_cast<uintptr_t>(chunk)) {
    const uintptr_t size = end - at < static_cast<uintptr_t>(chunk) ? end - at : chunk;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at),
                 "r"(static_cast<uint32_t>(size))
                 : "memory");
  }
#else
  (void)p;
  (void)bytes;
  (void)chunk;
#endif
}

}  // namespace qwenrt::ops::cuda
