// The CUDA backend's entry points in a build without CUDA (QWENRT_CUDA=OFF or no nvcc).
#include "core/error.h"
#include "ops/ops.h"

namespace qwenrt::ops {

std::unique_ptr<Ops> make_cuda_ops(int) {
  fail(
      "the cuda backend is not in this build (configure with -DQWENRT_CUDA=ON where nvcc is "
      "found)");
}

bool cuda_available() {
  return false;
}

std::string cuda_unsupported(int, int) {
  return "the cuda backend is not in this build";
}

}  // namespace qwenrt::ops
