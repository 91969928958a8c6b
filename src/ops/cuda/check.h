// CUDA error checks: every runtime call and every launch is checked, and a failure names the call,
// the file and the line.
//
// nvcc's front end cannot compile fmt's compile-time format strings, so .cu files never call
// qwenrt::fail(): they throw through cuda_fail(message) (check.cpp, compiled by the host
// compiler), building the message with std::string / std::to_string.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace qwenrt::ops::cuda {

// Throws qwenrt::Error with `message`.
[[noreturn]] void cuda_fail(const std::string& message);
// Throws qwenrt::Error naming the CUDA error, the failed expression, file and line.
[[noreturn]] void cuda_failed(cudaError_t err, const char* what, const char* file, int line);

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
