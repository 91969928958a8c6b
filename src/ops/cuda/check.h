// CUDA error checks: every runtime call and every launch is checked, and a failure names the call,
// the file and the line.
//
// nvcc 13 with C++20 cannot compile fmt's headers, so .cu files never include core/error.h: they
// throw through cuda_fail (check.cpp, compiled by the host compiler), whose format form replaces
// each "{}" with the next argument as an ostream prints it.
#pragma once

#include <cuda_runtime.h>

#include <sstream>
#include <string>

namespace qwenrt::ops::cuda {

// Throws qwenrt::Error with `message`.
[[noreturn]] void cuda_fail(const std::string& message);
// cuda_fail("{}: in = {} is not a multiple of {}", what, in, 32).
template <class... Args>
[[noreturn]] void cuda_fail(const char* format, const Args&... args) {
  std::ostringstream out;
  const char* p = format;
  auto next = [&](const auto& value) {
    while (*p && !(p[0] == '{' && p[1] == '}')) out << *p++;
    if (*p) p += 2;
    out << value;
  };
  (next(args), ...);
  (void)next;
  out << p;
  cuda_fail(out.str());
}
// Throws qwenrt::Error naming the CUDA error, the failed expression, file and line.
[[noreturn]] void cuda_failed(cudaError_t err, const char* what, const char* file, int line);

}  // namespace qwenrt::ops::cuda

#define QWENRT_CUDA_CHECK(expr)                                                      \
  do {                                                                               \
    const cudaError_t qwenrt_cuda_err_ = (expr);                                     \
    if (qwenrt_cuda_err_ != cudaSuccess)                                             \
      ::qwenrt::ops::cuda::cuda_failed(qwenrt_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here (execution errors surface at
// the next synchronising call, which is checked too).
#define QWENRT_CUDA_CHECK_LAUNCH() QWENRT_CUDA_CHECK(cudaGetLastError())
