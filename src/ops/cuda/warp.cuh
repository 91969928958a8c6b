// Warp-wide reductions shared by the kernel files. Every lane of the full warp must call them
// (mask 0xffffffff, width 32); each lane gets the result. (matmul_args.cuh's mm::warp_sum is
// another thing: NV sums in place, for the GEMV kernels' accumulators.)
#pragma once

namespace qwenrt::ops::cuda {

// The sum of `v` over the 32 lanes (butterfly: the same result in every lane).
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace qwenrt::ops::cuda
