// CUDA error checks: every runtime call and every launch is checked, and a failure names the call,
// the file and the line.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace qwenrt::ops::cuda {

[[noreturn]] inline void cuda_failed(cudaError_t err, const char* what, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), what,
       file, line);
}

}  // namespace qwenrt::ops::cuda

#define QWENRT_CUDA_CHECK(expr)                                                       \
  do {                                                                                \
    const cudaError_t qwenrt_cuda_err_ = (expr);                                      \
    if (qwenrt_cuda_err_ != cudaSuccess)                                              \
      ::qwenrt::ops::cuda::cuda_failed(qwenrt_cuda_err_, #expr, __FILE__, __LINE__);  \
  } while (0)

// After a kernel launch: launch-configuration errors surface here (execution errors surface at
// the next synchronising call, which is checked too).
#define QWENRT_CUDA_CHECK_LAUNCH() QWENRT_CUDA_CHECK(cudaGetLastError())
