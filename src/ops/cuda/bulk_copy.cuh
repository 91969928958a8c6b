// Bulk copies from global to shared memory completed on mbarriers (sm_90 and later): the weight
// streams of the GEMV kernels land in shared memory without holding registers, so a block can
// keep tens of kilobytes in flight. Below sm_90 the functions compile to nothing; callers launch
// these kernels only on sm_90 (bulk_copy_usable on the host).
//
// Protocol of a ring of stages (one producer thread, C consumer warps):
// - full[s] counts 1 arrival (the producer's arrive.expect_tx) plus the bytes the copies deliver;
// - empty[s] counts C arrivals (one lane of each consumer warp, after its reads of stage s);
// - the k-th use of a stage waits for phase parity k & 1 of full[s]; the producer's k-th refill
//   (k >= 1) waits for parity (k - 1) & 1 of empty[s].
#pragma once

#include <cstdint>

namespace qwenrt::ops::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
#endif
}

// Makes initialised barriers visible to the async (bulk copy) proxy; then a block barrier.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Thread 0 makes a ring's barriers (full[q] for one producer, empty[q] for `consumers` warps,
// q < stages) as the protocol above has them; then the whole block waits for them.
__device__ __forceinline__ void mbar_ring_init(uint64_t* full, uint64_t* empty, int stages,
                                               int consumers) {
  if (threadIdx.x == 0) {
    for (int q = 0; q < stages; ++q) {
      mbar_init(&full[q], 1);
      mbar_init(&empty[q], static_cast<uint32_t>(consumers));
    }
    mbar_init_fence();
  }
  __syncthreads();
}

// One arrival that also expects `bytes` more from bulk copies before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#endif
}

// Waits until the phase with parity `parity` of bar has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// bytes (a multiple of 16) from src (16-byte aligned, global) to dst (16-byte aligned, shared),
// completing on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#endif
}

}  // namespace qwenrt::ops::cuda
