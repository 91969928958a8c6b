#include "ops/cuda/check.h"

#include "core/error.h"

namespace qwenrt::ops::cuda {

void cuda_fail(const std::string& message) {
  throw Error(message);
}

void cuda_failed(cudaError_t err, const char* what, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), what,
       file, line);
}

}  // namespace qwenrt::ops::cuda
