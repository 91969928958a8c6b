// Programmatic dependent launch (sm_90 and later; no-ops below): a kernel lets the next kernel of
// its stream launch as soon as all of its own blocks run (pdl_launch_dependents, first thing in
// every decode kernel), and a kernel launched with the programmatic-serialization attribute
// (gemv_resident.cu's GEMV) waits for the previous kernel to finish and its writes to be
// visible (pdl_wait) only where it first reads what that kernel wrote. A kernel launched without
// the attribute waits for its predecessor as always, so the trigger alone changes nothing.
#pragma once

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

}  // namespace qwenrt::ops::cuda
