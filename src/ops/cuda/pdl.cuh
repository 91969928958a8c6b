// Programmatic dependent launch (sm_90 and later; no-ops below): a kernel lets the next kernel of
// its stream launch as soon as all of its own blocks run (pdl_launch_dependents, first thing in
// every decode kernel), and a kernel launched with the programmatic-serialization attribute
// (gemv_resident.cu's GEMV; through launch_dependent, the decode step's norms, head prologue,
// routing, combines, conv, delta rule and attention) waits for the previous kernel to finish and
// its writes to be visible (pdl_wait) only where it first reads what that kernel wrote: the GEMV
// loads its first weights before, the others wait first thing. A kernel launched without the
// attribute waits for its predecessor as always, so the trigger alone changes nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "ops/cuda/check.h"

namespace qwenrt::ops::cuda {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- Host side ----
// Whether the device is sm_90 or later (programmatic dependent launch, bulk copies, mbarrier
// transaction counts).
inline bool sm90_or_later() {
  static const bool yes = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return yes;
}

// Programmatic dependent launch: sm_90 and later, unless QWENRT_CUDA_PDL=0.
inline bool pdl_on() {
  static const bool on = [] {
    const char* v = std::getenv("QWENRT_CUDA_PDL");
    return !(v && v[0] == '0') && sm90_or_later();
  }();
  return on;
}

inline int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    QWENRT_CUDA_CHECK(cudaGetDevice(&dev));
    QWENRT_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  return n;
}

// The dynamic shared memory a block of `kernel` can have: the card's opt-in limit less the
// kernel's static shared memory (raising the kernel's limit past that fails, as does a launch
// asking for more).
template <class... Params>
size_t max_dynamic_smem(void (*kernel)(Params...)) {
  int dev = 0, optin = 0;
  cudaFuncAttributes fa{};
  QWENRT_CUDA_CHECK(cudaGetDevice(&dev));
  QWENRT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  QWENRT_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  return size_t(optin) - fa.sharedSizeBytes;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization if pdl.
template <class... Params, class... Args>
void launch_with_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  QWENRT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The same where pdl_on() and the grid is at most two blocks an SM (a decode step's launches;
// NOTES-gpu.md: a 1,056-block kernel waiting early held SMs and got slower). The kernel must call
// pdl_wait() in every thread before it reads what an earlier kernel wrote, and before it exits: a
// kernel that finished without waiting would let the one after it run before the one before it
// had finished.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  launch_with_pdl(pdl_on() && blocks <= 2 * uint64_t(sm_count()), kernel, grid, block, smem, stream,
                  std::forward<Args>(args)...);
}

}  // namespace qwenrt::ops::cuda
