// Device helpers over an ExpertOrder (kernels.h, "MoE prefill"), shared by the grouped expert
// kernels of moe_gemm.cu and moe_mmq.cu.
#pragma once

#include "ops/cuda/kernels.h"

namespace qwenrt::ops::cuda {

// The expert of tile `tile`: the last e with tile_start[e] <= tile (experts without pairs have
// tile_start[e] == tile_start[e + 1] and are skipped by taking the last).
__device__ __forceinline__ int tile_expert(const ExpertOrder& o, int tile) {
  int lo = 0, hi = o.n_expert - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (o.tile_start[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace qwenrt::ops::cuda
