// The scalar activations the CUDA kernels share, in the reference's arithmetic (expf and one
// division, as ops/ref computes them): SiLU and the logistic sigmoid.
#pragma once

namespace qwenrt::ops::cuda {

__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

}  // namespace qwenrt::ops::cuda
