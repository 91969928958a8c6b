// MoE routing and the shared expert's gated combine (ref::moe_route, ref::moe_ffn's tail). The
// expert matmuls are matmul.cu's experts_swiglu / experts_down.
#include <cfloat>

#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kRouteThreads = 256;

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

// One block per row: out = routed + sigmoid(x . gate_inp) * shared.
__global__ void combine_kernel(const float* routed, const float* shared, const float* x,
                               const float* gate_inp, float* out, int64_t dim) {
  __shared__ float s_sum[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float acc = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) acc += xr[i] * gate_inp[i];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) s_sum[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int w = 0; w < blockDim.x / 32; ++w) total += s_sum[w];
    s_sum[0] = 1.0f / (1.0f + expf(-total));
  }
  __syncthreads();
  const float s = s_sum[0];
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    out[row * dim + i] = routed[row * dim + i] + s * shared[row * dim + i];
}

}  // namespace

void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights,
               cudaStream_t stream) {
  if (n == 0) return;
  if (k > n_expert) cuda_fail("moe: top-" + std::to_string(k) + " of " + std::to_string(n_expert) + " experts");
  route_kernel<<<static_cast<unsigned>(n), kRouteThreads, n_expert * sizeof(double), stream>>>(
      logits, n_expert, k, ids, weights);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void moe_combine(const float* routed, const float* shared, const float* x, const float* gate_inp,
                 float* out, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  combine_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(routed, shared, x, gate_inp, out,
                                                               dim);
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
