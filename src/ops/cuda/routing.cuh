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
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/prefetch.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {

inline constexpr int kRouteThreads = kNormRowThreads;

// One row of x + delta (dim4 float4s, NV a thread of kRouteThreads) into v, and h = its rmsnorm
// times w (the thread's norm weights) into s_h [dim4]: norm_row.cuh's arithmetic, as
// elementwise.cu's rmsnorm_regs_kernel does it, so h is add_rmsnorm's bit for bit. Every thread of
// the block calls it; s_h is complete when it returns.
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
    v[j] = add4(x[i], delta[i]);
  }
  float ss = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j) ss = add_sq4(ss, v[j]);
  ss = warp_sum(ss);
  if (lane == 0) s_warp[warp] = ss;
  __syncthreads();
  float total = 0;
#pragma unroll
  for (int q = 0; q < kWarps; ++q) total += s_warp[q];
  const float inv = norm_row_inv(total, dim4, eps);
#pragma unroll
  for (int j = 0; j < NV; ++j)
    s_h[threadIdx.x + j * kRouteThreads] = norm_row_scale(v[j], inv, w[j]);
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

// An order-preserving 32-bit key of a float that is not NaN: a larger float has a larger key, -0
// and +0 the same one (equal floats, equal probabilities); no float's key is 0.
__device__ __forceinline__ unsigned logit_key(float v) {
  const unsigned b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_logit(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Sorts N (a power of two) pairs of (key, id) into the order the routing takes them: larger key
// first, equal keys by lower id (a bitonic network on registers: every index is a constant).
template <int N>
__device__ __forceinline__ void sort_keys_desc(unsigned (&key)[N], int (&id)[N]) {
  static_assert((N & (N - 1)) == 0, "a power of two");
#pragma unroll
  for (int size = 2; size <= N; size *= 2) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int j = i ^ stride;
        if (j <= i) continue;
        // Descending runs where (i & size) == 0 (all of them in the last merge), ascending else.
        const bool j_first = key[j] > key[i] || (key[j] == key[i] && id[j] < id[i]);
        if (j_first == ((i & size) == 0)) {
          const unsigned tk = key[i];
          key[i] = key[j];
          key[j] = tk;
          const int ti = id[i];
          id[i] = id[j];
          id[j] = ti;
        }
      }
    }
  }
}

// The top k of a warp's logits taken on their keys (logit_key; k < 32): every lane sorts its
// own (sort_keys_desc), then k rounds of two 32-bit warp reductions over the lanes' heads (the
// largest key, then the lowest id holding it) pop one pair each. Lane j gets choice j's key and
// id; the result is the largest key left after the k (0: none left).
template <int N>
__device__ __forceinline__ unsigned top_keys_warp(unsigned (&key)[N], int (&id)[N], int k,
                                                  unsigned& chosen_key, int& chosen_id) {
  const int lane = threadIdx.x % 32;
  sort_keys_desc<N>(key, id);
  for (int j = 0; j < k; ++j) {
    const unsigned mk = __reduce_max_sync(0xffffffffu, key[0]);
    const unsigned wid =
        __reduce_min_sync(0xffffffffu, key[0] == mk ? static_cast<unsigned>(id[0]) : 0xffffffffu);
    if (lane == j) {
      chosen_key = mk;
      chosen_id = static_cast<int>(wid);
    }
    if (key[0] == mk && static_cast<unsigned>(id[0]) == wid) {  // this lane's head is taken
#pragma unroll
      for (int i = 0; i + 1 < N; ++i) {
        key[i] = key[i + 1];
        id[i] = id[i + 1];
      }
      key[N - 1] = 0;
    }
  }
  return __reduce_max_sync(0xffffffffu, key[0]);
}

// Routes one row of logits l [n_expert] in one warp (every lane calls it) with everything in
// registers: the softmax in double, the top k with ties to the lower id, renormalised as ref
// does; a row with a NaN logit routes nowhere (ids -1, NaN weights). Lane j writes choice j and
// asks L2 for its slices of the prefetch tensors. The logits are read from L2 (__ldcg): other
// blocks of the same kernel may have written them (norm_route_kernel).
// Two ways to the same ids and weights:
// - `fast` (k < 32): the top k taken on the float logits (top_keys_warp), beside the softmax,
//   and only the chosen probabilities divided by the sum. The softmax keeps the logits' order
//   but may round unequal logits to equal probabilities (underflow to 0, or quotients a double
//   ulp apart), where ref's order is the lower id; so the chosen probabilities, each ref's own
//   exp(l - max) / sum, must fall strictly, and the k-th lie strictly above the best unchosen;
//   where they do not, the row takes the other way.
// - otherwise: every probability divided, then k rounds of a warp arg max over the doubles
//   (ties to the lower id).
template <int kPerLane>
__device__ void route_row_warp(const float* l, int n_expert, int k, int32_t* __restrict__ row_ids,
                               float* __restrict__ row_w, const ExpertPrefetch& prefetch,
                               bool fast = false) {
  const int lane = threadIdx.x % 32;
  double p[kPerLane];
  unsigned key[kPerLane];
  int key_id[kPerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const float v = e < n_expert ? __ldcg(l + e) : -FLT_MAX;
    p[i] = v;
    key[i] = e < n_expert && v == v ? logit_key(v) : 0u;
    key_id[i] = e;
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
  double picked = 0;
  double chosen_p = 0;  // lane j keeps choice j's probability (k <= 32)
  int chosen_id = 0;
  bool done = false;
  if (fast && k < 32) {
    unsigned chosen_key = 0;
    const unsigned rest = top_keys_warp<kPerLane>(key, key_id, k, chosen_key, chosen_id);
    // Lane j < k: choice j's probability; lane k: the best unchosen one's (if any).
    const bool has = lane < k || (lane == k && rest != 0);
    const float lv = key_logit(lane < k ? chosen_key : rest);
    const double pv = has ? exp(double(lv) - double(mx)) / sum : -1.0;
    const double next = __shfl_down_sync(0xffffffffu, pv, 1);  // lane 31 (>= k): its own
    const bool strict = lane >= k || next < pv;                // next -1: nothing below
    if (__all_sync(0xffffffffu, strict)) {
      for (int j = 0; j < k; ++j) picked += __shfl_sync(0xffffffffu, pv, j);  // ref's order
      chosen_p = pv;
      done = true;
    }
  }
  if (!done) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) p[i] /= sum;
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
        const unsigned long long bits =
            v >= 0 ? static_cast<unsigned long long>(__double_as_longlong(v)) + 1ull : 0ull;
        const unsigned hi = static_cast<unsigned>(bits >> 32), lo = static_cast<unsigned>(bits);
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
