// MoE routing and the shared expert's gated combine (ref::moe_route, ref::moe_ffn's tail). The
// expert matmuls are matmul.cu's experts_swiglu / experts_down.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/prefetch.cuh"
#include "ops/cuda/routing.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {
namespace {

// Block-wide reduction of (value, index) to the largest value, ties to the lower index.
__device__ void block_argmax(double& v, int& i, double* s_v, int* s_i) {
  for (int off = 16; off > 0; off /= 2) {
    const double ov = __shfl_down_sync(0xffffffffu, v, off);
    const int oi = __shfl_down_sync(0xffffffffu, i, off);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < blockDim.x / 32; ++w) {
      if (s_v[w] > s_v[0] || (s_v[w] == s_v[0] && s_i[w] < s_i[0])) {
        s_v[0] = s_v[w];
        s_i[0] = s_i[w];
      }
    }
  }
  __syncthreads();
  v = s_v[0];
  i = s_i[0];
  __syncthreads();
}

// One block per row: softmax in double, then k rounds of argmax (ties to the lower id, as ref's
// stable sort), renormalised over the chosen with the reference's floor.
__global__ void route_kernel(const float* logits, int n_expert, int k, int32_t* ids,
                             float* weights) {
  pdl_launch_dependents();
  extern __shared__ double s_p[];  // [n_expert]
  __shared__ double s_v[kRouteThreads / 32];
  __shared__ int s_i[kRouteThreads / 32];
  __shared__ double s_picked;
  const float* l = logits + int64_t{blockIdx.x} * n_expert;
  double mx = -DBL_MAX;
  int dummy = 0;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) mx = fmax(mx, double(l[e]));
  block_argmax(mx, dummy, s_v, s_i);
  double sum = 0;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) sum += s_p[e] = exp(double(l[e]) - mx);
  // Sum via the same shared scratch: warp sums, then thread 0.
  for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) s_v[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < blockDim.x / 32; ++w) total += s_v[w];
    s_v[0] = total;
  }
  __syncthreads();
  const double total = s_v[0];
  __syncthreads();
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) s_p[e] /= total;
  if (threadIdx.x == 0) s_picked = 0;
  __syncthreads();
  int32_t* row_ids = ids + int64_t{blockIdx.x} * k;
  float* row_w = weights + int64_t{blockIdx.x} * k;
  for (int j = 0; j < k; ++j) {
    double v = -1;
    int id = n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
      if (s_p[e] > v) {  // ascending e: the first of equal values is kept
        v = s_p[e];
        id = e;
      }
    }
    block_argmax(v, id, s_v, s_i);
    if (threadIdx.x == 0) {
      row_ids[j] = id;
      row_w[j] = static_cast<float>(v);  // the probability for now; renormalised below
      s_picked += v;
      s_p[id] = -2;  // taken
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double picked = fmax(s_picked, 6.103515625e-5);
    // Recompute from the exact double probabilities: row_w holds them rounded to float, so
    // divide the doubles again (kept in s_v scratch is not enough for k > 8; re-derive).
    for (int j = 0; j < k; ++j) {
      const int e = row_ids[j];
      const double p = exp(double(l[e]) - mx) / total;
      row_w[j] = static_cast<float>(p / picked);
    }
  }
}

// One block of kRouteThreads per row: the first warp routes the row (route_row_warp), the second
// computes the shared expert's gate of the row (gate_inp null: none) as norm_route_kernel does
// where the rows are float4s. (Counting every
// expert's rank at once, a thread an expert, instead of the k rounds measured slower end to end
// on the H200: 35B-A3B 347.8 -> 314.8 tok/s,
// bench/results/h200-decode-small-kernels-2026-12-05.md.)
template <int kPerLane>
__global__ void __launch_bounds__(kRouteThreads)
    route_block_kernel(const float* __restrict__ logits, int n_expert, int k,
                       int32_t* __restrict__ ids, float* __restrict__ weights,
                       const float* __restrict__ x, const float* __restrict__ gate_inp, int64_t dim,
                       float* __restrict__ shared_scale, const ExpertPrefetch prefetch, bool fast) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x / 32;
  if (warp == 1 && gate_inp) {  // the shared expert's gate beside the routing
    const float* xr = x + row * dim;
    float g;
    if (dim % 4 == 0 && reinterpret_cast<uintptr_t>(xr) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(gate_inp) % 16 == 0) {
      g = dot4_warp(reinterpret_cast<const float4*>(xr), reinterpret_cast<const float4*>(gate_inp),
                    dim / 4);
    } else {
      float acc = 0;
      for (int64_t i = threadIdx.x % 32; i < dim; i += 32) acc += xr[i] * gate_inp[i];
      g = warp_sum(acc);
    }
    if (threadIdx.x % 32 == 0) shared_scale[row] = sigmoid(g);
  }
  if (warp != 0) return;
  route_row_warp<kPerLane>(logits + row * n_expert, n_expert, k, ids + row * k, weights + row * k,
                           prefetch, fast);
}

// The FFN's input norm, the router and the routing of a decode-sized step in one kernel. Grid
// (G, n): the G blocks of row r each form x[r] + delta[r] and h = its rmsnorm * norm (the
// arithmetic of elementwise.cu's rmsnorm_regs_kernel, so h is add_rmsnorm's bit for bit) into
// shared memory, then the router logits of their experts, kSplit warps a router row (each a
// kSplit-th of the row, the parts summed in warp order; kSplit = 1: a warp a row) and, as one
// more row, the shared expert's gate (one warp, route_block_kernel's dot4_warp; fp32 weights
// asked into L2 before the wait for the previous kernel). The row's last block to finish (a
// counter a row, which it resets) writes x and h (only now: every block of the row has read x)
// and the routing (route_block_kernel's).
template <int NV, int kPerLane, int kSplit>
__global__ void __launch_bounds__(kRouteThreads)
    norm_route_kernel(float4* x, const float4* __restrict__ delta, const float4* __restrict__ norm,
                      float eps, float4* __restrict__ h, int64_t dim4,
                      const float4* __restrict__ router, int n_expert, float* __restrict__ logits,
                      unsigned* __restrict__ counters, int k, int32_t* __restrict__ ids,
                      float* __restrict__ weights, const float* __restrict__ gate_inp,
                      float* __restrict__ shared_scale, const ExpertPrefetch prefetch, bool fast) {
  constexpr int kWarps = kRouteThreads / 32, kRows = kWarps / kSplit;  // router rows a block
  static_assert(kWarps % kSplit == 0, "whole router rows a block");
  pdl_launch_dependents();
  const int64_t row = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = blockIdx.x * kRows;
  // Rows of the router, then the shared expert's gate as row n_expert.
  const int n_rows = n_expert + (gate_inp ? 1 : 0);
  const float4* gate4 = reinterpret_cast<const float4*>(gate_inp);
  if (threadIdx.x == 0) {
    for (int e = first; e < n_rows; e += gridDim.x * kRows) {
      if (e < n_expert)
        l2_prefetch_range(router + e * dim4, int64_t{min(kRows, n_expert - e)} * dim4 * 16);
      if (gate_inp && n_expert >= e && n_expert < e + kRows) l2_prefetch_range(gate4, dim4 * 16);
    }
  }
  float4 v[NV], w[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) w[j] = norm[threadIdx.x + int64_t{j} * kRouteThreads];  // a weight
  pdl_wait();                      // x and delta come from earlier kernels
  extern __shared__ float4 s_h[];  // [dim4]
  __shared__ bool s_last;
  __shared__ float s_part[kWarps];
  add_norm_row<NV>(x + row * dim4, delta + row * dim4, w, eps, dim4, v, s_h);
  const int64_t part4 = dim4 / kSplit;  // float4s of a router row a warp takes
  const int q = warp % kSplit;          // this warp's part of its row
  for (int e0 = first; e0 < n_rows; e0 += gridDim.x * kRows) {  // uniform over the block
    const int e = e0 + warp / kSplit;
    if (e < n_expert) {
      const float acc = dot4_warp(router + e * dim4 + q * part4, s_h + q * part4, part4);
      if constexpr (kSplit == 1) {
        if (lane == 0) logits[row * n_expert + e] = acc;
      } else if (lane == 0) {
        s_part[warp] = acc;
      }
    } else if (e == n_expert && gate_inp && q == 0) {
      const float acc = dot4_warp(gate4, s_h, dim4);
      if (lane == 0) shared_scale[row] = sigmoid(acc);
    }
    if constexpr (kSplit > 1) {
      __syncthreads();
      if (q == 0 && lane == 0 && e < n_expert) {
        float sum = s_part[warp];
#pragma unroll
        for (int p = 1; p < kSplit; ++p) sum += s_part[warp + p];
        logits[row * n_expert + e] = sum;
      }
      __syncthreads();  // s_part is rewritten by the next rows
    }
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(counters + row, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kRouteThreads;
    x[row * dim4 + i] = v[j];
    h[row * dim4 + i] = s_h[i];
  }
  if (threadIdx.x == 0) counters[row] = 0;  // ready for the next launch (graph replays too)
  if (warp != 0) return;
  route_row_warp<kPerLane>(logits + row * n_expert, n_expert, k, ids + row * k, weights + row * k,
                           prefetch, fast);
}

// out = routed + scale[row] * shared, a float4 per thread (dim % 4 == 0; rows 16-byte aligned).
__global__ void combine_kernel(const float4* __restrict__ routed, const float4* __restrict__ shared,
                               const float* __restrict__ scale, float4* __restrict__ out,
                               int64_t dim4, int64_t total4) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total4) return;
  const float s = scale[i / dim4];
  const float4 r = routed[i], h = shared[i];
  out[i] = make_float4(r.x + s * h.x, r.y + s * h.y, r.z + s * h.z, r.w + s * h.w);
}

// The same one float at a time.
__global__ void combine_scalar_kernel(const float* __restrict__ routed,
                                      const float* __restrict__ shared,
                                      const float* __restrict__ scale, float* __restrict__ out,
                                      int64_t dim, int64_t total) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total) return;
  out[i] = routed[i] + scale[i / dim] * shared[i];
}

// One thread per output element: the k routed pairs in choice order, then the shared expert.
__global__ void combine_pairs_kernel(const float* __restrict__ pairs,
                                     const float* __restrict__ weights, int k,
                                     const float* __restrict__ shared,
                                     const float* __restrict__ scale, float* __restrict__ out,
                                     int64_t dim, int64_t total) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / dim, c = i % dim;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc += weights[r * k + j] * pairs[(r * k + j) * dim + c];
  if (shared) acc += scale[r] * shared[i];
  out[i] = acc;
}

}  // namespace

// route_row_warp's top k on the float logits unless QWENRT_CUDA_ROUTE_FAST=0 (read per call: tests
// switch it; a captured graph keeps the way it was captured with). The default since session 34
// (35B-A3B tg128 @ d512 +0.8% on the H100, docs/decisions.md).
bool route_fast() {
  const char* v = std::getenv("QWENRT_CUDA_ROUTE_FAST");
  return !(v != nullptr && v[0] == '0');
}

void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights,
               const float* x, const float* gate_inp, int64_t dim, float* shared_scale,
               cudaStream_t stream, const ExpertPrefetch& prefetch) {
  if (n == 0) return;
  if (k > n_expert || k > 32) {
    cuda_fail("moe: top-" + std::to_string(k) + " of " + std::to_string(n_expert) + " experts");
  }
  if (n_expert <= 512) {
    with_per_lane(n_expert, [&](auto per_lane) {
      launch_dependent(route_block_kernel<decltype(per_lane)::value>, static_cast<unsigned>(n),
                       kRouteThreads, 0, stream, logits, n_expert, k, ids, weights, x, gate_inp,
                       dim, shared_scale, prefetch, route_fast());
    });
  } else {
    if (gate_inp) cuda_fail("moe: a shared expert gate with more than 512 experts");
    route_kernel<<<static_cast<unsigned>(n), kRouteThreads, n_expert * sizeof(double), stream>>>(
        logits, n_expert, k, ids, weights);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

bool norm_route_fits(const NormRouteArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  static_assert(kNormRouteMaxVec == kNormRowMaxVec, "the routing's norm is norm_row.cuh's layout");
  return a.n >= 1 && a.n <= kNormRouteMaxRows && norm_row_fits(a.dim) && a.n_expert <= 512 &&
         a.k <= 32 && a.k <= a.n_expert && aligned(a.x) && aligned(a.delta) && aligned(a.norm) &&
         aligned(a.h) && a.router != nullptr && aligned(a.router) && a.counters != nullptr &&
         (a.gate_inp == nullptr || aligned(a.gate_inp));
}

void moe_norm_route(const NormRouteArgs& a, cudaStream_t stream) {
  if (!norm_route_fits(a)) cuda_fail("moe_norm_route: arguments outside what its kernel takes");
  constexpr int kWarps = kRouteThreads / 32;
  const int rows = a.n_expert + (a.gate_inp ? 1 : 0);  // the shared gate: one more row
  const int64_t dim4 = a.dim / 4;
  const size_t smem = static_cast<size_t>(dim4) * sizeof(float4);
  // QWENRT_CUDA_ROUTE_SPLIT=4 (read per call; opt-in until measured): four warps a router row,
  // four times the blocks (~129 on the 35B-A3B instead of 33).
  const char* env = std::getenv("QWENRT_CUDA_ROUTE_SPLIT");
  const bool split = env && std::string(env) == "4";
  const int per_block = split ? kWarps / 4 : kWarps;
  const unsigned blocks =
      static_cast<unsigned>(std::min((rows + per_block - 1) / per_block, split ? 256 : 64));
  with_per_lane(a.n_expert, [&](auto per_lane) {
    with_norm_vec(static_cast<int>(a.dim / (4 * kRouteThreads)), [&](auto nv) {
      constexpr int kNv = decltype(nv)::value, kPl = decltype(per_lane)::value;
      launch_dependent(split ? norm_route_kernel<kNv, kPl, 4> : norm_route_kernel<kNv, kPl, 1>,
                       dim3(blocks, static_cast<unsigned>(a.n)), kRouteThreads, smem, stream,
                       reinterpret_cast<float4*>(a.x), reinterpret_cast<const float4*>(a.delta),
                       reinterpret_cast<const float4*>(a.norm), a.eps,
                       reinterpret_cast<float4*>(a.h), dim4,
                       reinterpret_cast<const float4*>(a.router), a.n_expert, a.logits, a.counters,
                       a.k, a.ids, a.weights, a.gate_inp, a.shared_scale, a.prefetch, route_fast());
    });
  });
  QWENRT_CUDA_CHECK_LAUNCH();
}

void moe_combine(const float* routed, const float* shared, const float* scale, float* out,
                 int64_t n, int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (dim % 4 == 0 && aligned(routed) && aligned(shared) && aligned(out)) {
    const int64_t total4 = n * dim / 4;
    combine_kernel<<<static_cast<unsigned>((total4 + 255) / 256), 256, 0, stream>>>(
        reinterpret_cast<const float4*>(routed), reinterpret_cast<const float4*>(shared), scale,
        reinterpret_cast<float4*>(out), dim / 4, total4);
  } else {
    combine_scalar_kernel<<<static_cast<unsigned>((n * dim + 255) / 256), 256, 0, stream>>>(
        routed, shared, scale, out, dim, n * dim);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

void moe_combine_pairs(const float* pairs, const float* weights, int k, const float* shared,
                       const float* shared_scale, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream) {
  if (n == 0) return;
  launch_dependent(combine_pairs_kernel, static_cast<unsigned>((n * dim + 255) / 256), 256, 0,
                   stream, pairs, weights, k, shared, shared_scale, out, dim, n * dim);
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
