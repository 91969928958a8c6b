// Elementwise and norm kernels of the CUDA backend (ref::rmsnorm, ref::rope_neox, ref::silu_mul,
// ref::sigmoid_mul, add, copy_2d, row gathers). All are bandwidth- or launch-bound: each launch
// shape below is picked so that a decode step's tiny tensors take one short wave and a prefill's
// large ones stream at close to copy bandwidth. Grid sizes depend on the host-known sizes only.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kThreads = 256;         // block size of the elementwise kernels
constexpr int kMaxGridY = 65535;      // the hardware limit of gridDim.y
constexpr int kWarpRowsMaxDim = 256;  // rmsnorm rows up to this long take one warp each
constexpr int kWarpRowValues = kWarpRowsMaxDim / 32;  // values a lane keeps for such a row

unsigned blocks_for(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---- RMSNorm ----
// Short rows (head_dim rows of q/k norms, <= 256 floats): one warp per row, 8 rows per block; each
// lane keeps its <= 8 values in registers between the sum of squares and the scaling.
// kAdd: x += delta first (and stored), the residual add fused with the next norm.
template <bool kAdd>
__global__ void rmsnorm_warp_kernel(float* x, const float* delta, const float* weight, float* out,
                                    int64_t rows, int dim, float eps) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together: the shuffles below stay full-warp
  float* xr = x + row * dim;
  float v[kWarpRowValues];
  // Every load before any store, so that they are all in flight at once (a store to x between
  // them would order the loads that may alias it one after another).
#pragma unroll
  for (int k = 0; k < kWarpRowValues; ++k) {
    const int i = lane + 32 * k;
    v[k] = i < dim ? xr[i] : 0.0f;
    if constexpr (kAdd) v[k] += i < dim ? delta[row * dim + i] : 0.0f;
  }
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kWarpRowValues; ++k) {
    const int i = lane + 32 * k;
    if constexpr (kAdd) {
      if (i < dim) xr[i] = v[k];
    }
    ss += v[k] * v[k];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
#pragma unroll
  for (int k = 0; k < kWarpRowValues; ++k) {
    const int i = lane + 32 * k;
    if (i < dim) out[row * dim + i] = v[k] * inv * weight[i];
  }
}

// Long rows of a multiple of 4 x kThreads floats up to 8192 (the model widths: 2048..5120), 16-byte
// aligned: one block per row, each thread's NV float4 of x (and delta, and the weight) loaded at
// once into registers before anything is stored or summed. A decode step's norm is one row: its
// time is the latency of these loads, so they must all be in flight together (ncu: the loop
// below, whose stores to x order the loads after them, took 6-7 us for a 2048-wide add_rmsnorm).
// Safe in place (out == x): every read precedes the block-wide sum, every write follows it.
constexpr int kRegsMaxVec = kNormRowMaxVec;  // float4 a thread, at most
static_assert(kThreads == kNormRowThreads, "the register kernel is norm_row.cuh's row layout");

template <bool kAdd, int NV>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_regs_kernel(float4* x, const float4* __restrict__ delta,
                        const float4* __restrict__ weight, float4* out, int64_t dim4, float eps) {
  pdl_launch_dependents();
  float4 v[NV], w[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k)
    w[k] = weight[threadIdx.x + int64_t{k} * kThreads];  // no kernel writes it
  pdl_wait();  // launched dependent (pdl.cuh): before any read of what earlier kernels write
  __shared__ float s_warp[kThreads / 32];
  const int64_t row = blockIdx.x;
  float4* xr = x + row * dim4;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * kThreads;
    v[k] = xr[i];
    if constexpr (kAdd) v[k] = add4(v[k], delta[row * dim4 + i]);
  }
  float ss = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    if constexpr (kAdd) xr[threadIdx.x + int64_t{k} * kThreads] = v[k];
    ss = add_sq4(ss, v[k]);
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0;
#pragma unroll
  for (int q = 0; q < kThreads / 32; ++q) total += s_warp[q];
  const float inv = norm_row_inv(total, dim4, eps);
#pragma unroll
  for (int k = 0; k < NV; ++k)
    out[row * dim4 + threadIdx.x + int64_t{k} * kThreads] = norm_row_scale(v[k], inv, w[k]);
}

// Other long rows: one block per row. The second pass re-reads x, which the same thread read (or,
// with kAdd, wrote) in the first pass: an L1 hit, and safe in place (out == x) because every read
// of the first pass completes before the block-wide sum.
template <bool kAdd>
__global__ void rmsnorm_block_kernel(float* x, const float* delta, const float* weight, float* out,
                                     int64_t dim, float eps) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  __shared__ float s_warp[32];
  const int64_t row = blockIdx.x;
  float* xr = x + row * dim;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if constexpr (kAdd) {
      v += delta[row * dim + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += s_warp[w];
  const float inv = 1.0f / sqrtf(total / dim + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    out[row * dim + i] = xr[i] * inv * weight[i];
}

// fn(std::integral_constant<int, nv>{}) for nv in 1..kRegsMaxVec (the register kernel's NV).
template <int NV = 1, class Fn>
void with_vec_count(int nv, Fn&& fn) {
  if constexpr (NV < kRegsMaxVec) {
    if (nv > NV) return with_vec_count<NV + 1>(nv, fn);
  }
  fn(std::integral_constant<int, NV>{});
}

template <bool kAdd>
void launch_rmsnorm(float* x, const float* delta, const float* weight, float* out, int64_t rows,
                    int64_t dim, float eps, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  if (dim <= kWarpRowsMaxDim) {
    launch_dependent(rmsnorm_warp_kernel<kAdd>, blocks_for(rows, kThreads / 32), kThreads, 0,
                     stream, x, delta, weight, out, rows, static_cast<int>(dim), eps);
  } else if (norm_row_fits(dim) && aligned16(x) && (!kAdd || aligned16(delta)) &&
             aligned16(weight) && aligned16(out)) {
    const int64_t dim4 = dim / 4;
    auto launch = [&](auto nv) {
      launch_dependent(
          rmsnorm_regs_kernel<kAdd, decltype(nv)::value>, static_cast<unsigned>(rows), kThreads, 0,
          stream, reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(delta),
          reinterpret_cast<const float4*>(weight), reinterpret_cast<float4*>(out), dim4, eps);
    };
    with_vec_count(static_cast<int>(dim / (4 * kThreads)), launch);
  } else {
    // 8+ floats per thread keep enough loads in flight; 512 threads for the widest rows.
    const int threads = dim > 4096 ? 512 : 256;
    launch_dependent(rmsnorm_block_kernel<kAdd>, static_cast<unsigned>(rows), threads, 0, stream, x,
                     delta, weight, out, dim, eps);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

// ---- RoPE (NeoX) ----
// One thread per (token, head, rotated pair i < n_rot/2). The angle pos * theta^(-2i/n_rot) is
// formed and rotated in double as ref does: positions reach 10^5..10^6, where a float angle is
// off by a good part of a radian. Both H200 and A100 run fp64 at half the fp32 rate, and rope
// touches only n * n_heads * n_rot/2 pairs.
__global__ void rope_neox_kernel(float* x, const int32_t* positions, int64_t n_pairs, int n_heads,
                                 int head_dim, int64_t token_stride, int n_rot, double theta) {
  pdl_launch_dependents();
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= n_pairs) return;
  const int half = n_rot / 2;
  const int i = static_cast<int>(idx % half);
  const int64_t token_head = idx / half;
  const int h = static_cast<int>(token_head % n_heads);
  const int64_t t = token_head / n_heads;
  float* v = x + t * token_stride + int64_t{h} * head_dim;
  const double freq = pow(theta, -2.0 * i / n_rot);
  const double angle = positions[t] * freq;
  double s, c;
  sincos(angle, &s, &c);
  const double a = v[i], b = v[i + half];
  v[i] = static_cast<float>(a * c - b * s);
  v[i + half] = static_cast<float>(a * s + b * c);
}

// ---- The gated attention's head prologue (Ops::attention_heads) ----
// One warp per head row, 8 rows a block: q rows (token t, head h) take the query half of q_gate's
// head and write its gate half to `gate`; k rows are normed in place. The norm is
// rmsnorm_warp_kernel's arithmetic and the rotation rope_neox_kernel's (angles in double), so the
// result equals the unfused sequence bit for bit; the normed row goes through shared memory so
// that each rotated pair meets in one lane. Rows up to kWarpRowsMaxDim floats.
__global__ void __launch_bounds__(kThreads)
    attention_heads_kernel(const float* __restrict__ q_gate, const float* __restrict__ q_norm,
                           const float* __restrict__ k_norm, float* __restrict__ q,
                           float* __restrict__ gate, float* k,
                           const int32_t* __restrict__ positions, int64_t n, int n_head,
                           int n_head_kv, int dim, int n_rot, double theta, float eps) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  __shared__ float s_rows[kThreads / 32][kWarpRowsMaxDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = int64_t{blockIdx.x} * (kThreads / 32) + warp;
  const int64_t q_rows = n * n_head;
  if (row >= q_rows + n * n_head_kv) return;  // whole warps leave together
  const bool is_q = row < q_rows;
  const int64_t k_row = row - q_rows;
  const int64_t t = is_q ? row / n_head : k_row / n_head_kv;
  const float* src = is_q ? q_gate + row * 2 * dim : k + k_row * dim;
  float* dst = is_q ? q + row * dim : k + k_row * dim;
  const float* weight = is_q ? q_norm : k_norm;
  float v[kWarpRowValues];
#pragma unroll
  for (int j = 0; j < kWarpRowValues; ++j) {
    const int i = lane + 32 * j;
    v[j] = i < dim ? src[i] : 0.0f;
  }
  if (is_q) {
#pragma unroll
    for (int j = 0; j < kWarpRowValues; ++j) {
      const int i = lane + 32 * j;
      if (i < dim) gate[row * dim + i] = src[dim + i];
    }
  }
  float ss = 0;
#pragma unroll
  for (int j = 0; j < kWarpRowValues; ++j) ss += v[j] * v[j];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  float* normed = s_rows[warp];
#pragma unroll
  for (int j = 0; j < kWarpRowValues; ++j) {
    const int i = lane + 32 * j;
    if (i < dim) normed[i] = v[j] * inv * weight[i];
  }
  __syncwarp();
  const int half = n_rot / 2;
#pragma unroll
  for (int j = 0; j < kWarpRowValues; ++j) {
    const int i = lane + 32 * j;
    if (i >= dim) continue;
    if (i >= n_rot) {
      dst[i] = normed[i];
      continue;
    }
    const int p = i < half ? i : i - half;  // the pair (p, p + half)
    const double freq = pow(theta, -2.0 * p / n_rot);
    const double angle = positions[t] * freq;
    double sn, cs;
    sincos(angle, &sn, &cs);
    const double a = normed[p], b = normed[p + half];
    dst[i] = i < half ? static_cast<float>(a * cs - b * sn) : static_cast<float>(a * sn + b * cs);
  }
}

// ---- Plain elementwise ----
// A float4 per thread when every pointer is 16-byte aligned and n is a multiple of 4 (the common
// case: activations come from the aligned workspace), one float per thread otherwise.
template <class Fn>
__global__ void map2_vec4_kernel(const float4* a, const float4* b, float4* out, int64_t n4, Fn fn) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 x = a[i], y = b[i];
  out[i] = make_float4(fn(x.x, y.x), fn(x.y, y.y), fn(x.z, y.z), fn(x.w, y.w));
}

template <class Fn>
__global__ void map2_kernel(const float* a, const float* b, float* out, int64_t n, Fn fn) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fn(a[i], b[i]);
}

template <class Fn>
void launch_map2(const float* a, const float* b, float* out, int64_t n, Fn fn,
                 cudaStream_t stream) {
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(out)) {
    map2_vec4_kernel<<<blocks_for(n / 4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
        reinterpret_cast<float4*>(out), n / 4, fn);
  } else {
    map2_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(a, b, out, n, fn);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

struct SiluMul {
  __device__ float operator()(float gate, float up) const { return silu(gate) * up; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Strided 2D kernels: blockIdx.x tiles the columns, blockIdx.y walks rows (grid-stride past the
// 65535 limit of gridDim.y).
__global__ void sigmoid_mul_kernel(const float* x, const float* gate, int64_t gate_stride,
                                   float* out, int64_t rows, int64_t cols) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    out[r * cols + c] = x[r * cols + c] * sigmoid(gate[r * gate_stride + c]);
}

__global__ void copy_2d_kernel(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                               int64_t rows, int64_t cols) {
  pdl_launch_dependents();
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    dst[r * dst_stride + c] = src[r * src_stride + c];
}

__global__ void gather_rows_kernel(const float* x, int64_t dim, const int32_t* rows, int64_t n_rows,
                                   float* out) {
  pdl_launch_dependents();
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) out[r * dim + c] = x[rows[r] * dim + c];
}

dim3 grid_2d(int64_t rows, int64_t cols) {
  return dim3(blocks_for(cols, kThreads),
              static_cast<unsigned>(std::min<int64_t>(rows, kMaxGridY)));
}

}  // namespace

void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
             cudaStream_t stream) {
  // x is only read when there is no delta; the kernels share one signature with add_rmsnorm.
  launch_rmsnorm<false>(const_cast<float*>(x), nullptr, weight, out, rows, dim, eps, stream);
}

void add_rmsnorm(float* x, const float* delta, const float* weight, float* out, int64_t rows,
                 int64_t dim, float eps, cudaStream_t stream) {
  launch_rmsnorm<true>(x, delta, weight, out, rows, dim, eps, stream);
}

void rope_neox(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim,
               int64_t token_stride, int n_rot, float theta, cudaStream_t stream) {
  if (n_rot % 2 != 0 || n_rot > head_dim) {
    cuda_fail("rope_neox: n_rot " + std::to_string(n_rot) + " must be even and at most head_dim " +
              std::to_string(head_dim));
  }
  const int64_t n_pairs = n * n_heads * (n_rot / 2);
  if (n_pairs == 0) return;
  rope_neox_kernel<<<blocks_for(n_pairs, kThreads), kThreads, 0, stream>>>(
      x, positions, n_pairs, n_heads, head_dim, token_stride, n_rot, double(theta));
  QWENRT_CUDA_CHECK_LAUNCH();
}

bool attention_heads_fit(int head_dim, int n_rot) {
  return head_dim <= kWarpRowsMaxDim && n_rot % 2 == 0 && n_rot <= head_dim;
}

void attention_heads(const float* q_gate, const float* q_norm, const float* k_norm, float* q,
                     float* gate, float* k, const int32_t* positions, int64_t n, int n_head,
                     int n_head_kv, int head_dim, int n_rot, float theta, float eps,
                     cudaStream_t stream) {
  if (!attention_heads_fit(head_dim, n_rot)) {
    cuda_fail("attention_heads: head_dim " + std::to_string(head_dim) + ", n_rot " +
              std::to_string(n_rot));
  }
  const int64_t rows = n * (n_head + n_head_kv);
  if (rows == 0) return;
  launch_dependent(attention_heads_kernel, blocks_for(rows, kThreads / 32), kThreads, 0, stream,
                   q_gate, q_norm, k_norm, q, gate, k, positions, n, n_head, n_head_kv, head_dim,
                   n_rot, double(theta), eps);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  launch_map2(gate, up, out, n, SiluMul{}, stream);
}

void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  launch_map2(a, b, out, n, Add{}, stream);
}

void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  launch_dependent(sigmoid_mul_kernel, grid_2d(rows, cols), kThreads, 0, stream, x, gate,
                   gate_stride, out, rows, cols);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
             int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  copy_2d_kernel<<<grid_2d(rows, cols), kThreads, 0, stream>>>(src, src_stride, dst, dst_stride,
                                                               rows, cols);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n_rows, float* out,
                 cudaStream_t stream) {
  if (n_rows == 0 || dim == 0) return;
  gather_rows_kernel<<<grid_2d(n_rows, dim), kThreads, 0, stream>>>(x, dim, rows, n_rows, out);
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
