// What the routing kernels share (moe.cu's norm_route_kernel and route_block_kernel, moe_fused.cu's
// fused MoE row): the FFN input's add and norm into shared memory, the router's dot products and
// one row's routing by one warp, the same arithmetic in every kernel that computes them.
#pragma once

#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/prefetch.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {

inline constexpr int kRouteThreads = 256;

// One row of x + delta (dim4 float4s, NV a thread of kRouteThreads) into v, and h = its rmsnorm
// times w (the thread's norm weights) into s_h [dim4]: elementwise.cu's rmsnorm_regs_kernel
// arithmetic, so h is add_rmsnorm's bit for bit. Every thread of the block calls it; s_h is
// complete when it returns.
template <int NV>
__device__ __forceinline__ void add_norm_row(const float4* x, const float4* delta,
                                             const float4 (&w)[NV], float eps, int64_t dim4,
                                             float4 (&v)[NV], float4* s_h) {
  constexpr int kWarps = kRouteThreads / 32;
  __shared__ float s_warp[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kRouteThreads;
    v[j] = x[i];
    const float4 d = delta[i];
    v[j] = make_float4(v[j].x + d.x, v[j].y + d.y, v[j].z + d.z, v[j].w + d.w);
  }
  float ss = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j)
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  ss = warp_sum(ss);
  if (lane == 0) s_warp[warp] = ss;
  __syncthreads();
  float total = 0;
#pragma unroll
  for (int q = 0; q < kWarps; ++q) total += s_warp[q];
  const float inv = 1.0f / sqrtf(total / (4 * dim4) + eps);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    s_h[threadIdx.x + j * kRouteThreads] = make_float4(
        v[j].x * inv * w[j].x, v[j].y * inv * w[j].y, v[j].z * inv * w[j].z, v[j].w * inv * w[j].w);
  }
  __syncthreads();
}

// a . b over n4 float4s by one warp (lane-strided, then the warp's butterfly sum; every lane
// gets it): the router logits and the shared expert's gate, the same arithmetic in every kernel
// that computes them.
__device__ __forceinline__ float dot4_warp(const float4* a, const float4* b, int64_t n4) {
  const int lane = threadIdx.x % 32;
  float acc = 0;
#pragma unroll 16
  for (int64_t i = lane; i < n4; i += 32) {
    const float4 u = a[i], v = b[i];
    acc += u.x * v.x + u.y * v.y + u.z * v.z + u.w * v.w;
  }
  return warp_sum(acc);
}

// Routes one row of logits l [n_expert] in one warp (every lane calls it) with everything in
// registers: the softmax in double, k rounds of a warp arg max (ties to the lower id),
// renormalised as ref does; a row with a NaN logit routes nowhere (ids -1, NaN weights). Lane j
// writes choice j and asks L2 for its slices of the prefetch tensors. The logits are read from L2
// (__ldcg): other blocks of the same kernel may have written them (norm_route_kernel).
template <int kPerLane>
__device__ void route_row_warp(const float* l, int n_expert, int k, int32_t* __restrict__ row_ids,
                               float* __restrict__ row_w, const ExpertPrefetch& prefetch) {
  const int lane = threadIdx.x % 32;
  double p[kPerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const float v = e < n_expert ? __ldcg(l + e) : -FLT_MAX;
    p[i] = v;
    mx = fmaxf(mx, v);
  }
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  double sum = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < n_expert ? exp(p[i] - double(mx)) : 0.0;
    sum += p[i];
  }
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (sum != sum) {  // a NaN logit: route nowhere (the expert kernels then write NaN)
    if (lane < k) {
      row_ids[lane] = -1;
      row_w[lane] = __int_as_float(0x7fc00000);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] /= sum;
  double picked = 0;
  double chosen_p = 0;  // lane j keeps choice j's probability (k <= 32)
  int chosen_id = 0;
  for (int j = 0; j < k; ++j) {
    double v = -1;
    int id = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < n_expert && p[i] > v) {  // ascending e per lane: the first of equal values
        v = p[i];
        id = e;
      }
    }
    // The warp's largest v, ties to the lower id. Non-negative doubles order as their bit
    // patterns (+1 here, so that 0 stands for a lane with nothing left): three warp reductions
    // (high word, low word among the lanes holding the high word, the lowest id among the
    // lanes holding both) instead of five rounds of two double and one int shuffles.
    {
      const unsigned long long key =
          v >= 0 ? static_cast<unsigned long long>(__double_as_longlong(v)) + 1ull : 0ull;
      const unsigned hi = static_cast<unsigned>(key >> 32), lo = static_cast<unsigned>(key);
      const unsigned max_hi = __reduce_max_sync(0xffffffffu, hi);
      const unsigned max_lo = __reduce_max_sync(0xffffffffu, hi == max_hi ? lo : 0u);
      const bool best = hi == max_hi && lo == max_lo;
      id = static_cast<int>(
          __reduce_min_sync(0xffffffffu, best ? static_cast<unsigned>(id) : 0xffffffffu));
      v = __longlong_as_double(static_cast<long long>(
          ((static_cast<unsigned long long>(max_hi) << 32) | max_lo) - 1ull));
    }
    picked += v;
    if (lane == j) {
      chosen_p = v;
      chosen_id = id;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i == id) p[i] = -2;  // taken
    }
  }
  picked = fmax(picked, 6.103515625e-5);
  if (lane < k) {
    row_ids[lane] = chosen_id;
    row_w[lane] = static_cast<float>(chosen_p / picked);
#pragma unroll
    for (int m = 0; m < ExpertPrefetch::kMax; ++m) {
      if (prefetch.base[m] == nullptr) continue;
      l2_prefetch_range(
          static_cast<const char*>(prefetch.base[m]) + int64_t{chosen_id} * prefetch.stride[m],
          prefetch.bytes[m]);
    }
  }
}

// fn(std::integral_constant<int, nv>{}) for nv in 1..kNormRouteMaxVec (float4 of the row a thread).
template <int NV = 1, class Fn>
void with_norm_vec(int nv, Fn&& fn) {
  if constexpr (NV < kNormRouteMaxVec) {
    if (nv > NV) return with_norm_vec<NV + 1>(nv, fn);
  }
  fn(std::integral_constant<int, NV>{});
}

// fn(std::integral_constant<int, per_lane>{}) for the experts a lane holds in the routing warp
// (n_expert <= 512).
template <class Fn>
void with_per_lane(int n_expert, Fn&& fn) {
  if (n_expert <= 64) {
    fn(std::integral_constant<int, 2>{});
  } else if (n_expert <= 128) {
    fn(std::integral_constant<int, 4>{});
  } else if (n_expert <= 256) {
    fn(std::integral_constant<int, 8>{});
  } else {
    fn(std::integral_constant<int, 16>{});
  }
}

}  // namespace qwenrt::ops::cuda
