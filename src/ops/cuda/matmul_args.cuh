// What the matmul kernels of this folder share (matmul.cu, gemv_*.cu, moe_mmq.cu, act_quant.cu,
// embed.cu):
// the activations and weight matrices as kernels read them, the projection groups, and the entry
// points each file gives the others. Device and host code; internal to ops/cuda (kernels.h is the
// backend's interface).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/activation.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {

inline constexpr int kMaxJobs = 8;  // matrices of one matmul_group launch

inline bool aligned(const void* p, int64_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

// The activations of a pass: row r's int8 values at q + r * in, scales at d + r * in / 32, block
// sums d * sum(q) at s + r * in / 32, and the fp32 row at x + r * in (float weights use x;
// quantised ones q, d and s; prepare_acts pads q, d and s with zero rows to a multiple of 8).
// Where asked (prepare_acts' `tiles`, `in` a multiple of 256), the same values also in the
// tensor-core GEMV's tile order (tq, td, ts; mma_quant.cuh, ActTiles): per 8-row n-tile and
// superblock, the int8 values every lane of a warp loads for it are one contiguous run, and so
// are their scales and block sums.
struct Acts {
  const int8_t* q;
  const float* d;
  const float* x;
  int64_t in;
  const float* s = nullptr;
  const int8_t* tq = nullptr;    // k32 order (Q4_K, Q5_K)
  const int8_t* tq16 = nullptr;  // k16 order (Q6_K)
  const float* td = nullptr;
  const float* ts = nullptr;
};
__host__ __device__ inline Acts shift_rows(Acts a, int64_t rows) {
  a.tq = a.tq16 = nullptr;  // (the tile order has no row offsets)
  a.td = a.ts = nullptr;
  a.q = a.q ? a.q + rows * a.in : nullptr;
  a.d = a.d ? a.d + rows * (a.in / qb::kActBlock) : nullptr;
  a.s = a.s ? a.s + rows * (a.in / qb::kActBlock) : nullptr;
  a.x = a.x ? a.x + rows * a.in : nullptr;
  return a;
}

// A weight matrix as a kernel reads it; vec: float rows may be read 16 bytes at a time.
struct MatArg {
  const uint8_t* data;
  int64_t row_bytes, expert_bytes, out, n_expert;
  DType dtype;
  bool vec;
  bool q8s;  // Q8_0 in superblocks (qb::Q80S)
};

// A group of projections of one input, as the GEMV kernels walk it.
struct Job {
  MatArg m;
  float* y;             // [rows, y_stride]
  int64_t y_stride;     // = m.out
  int64_t first_block;  // the job's first row block
};
struct Group {
  Job job[kMaxJobs];
  int n_jobs;
  int ts, rows_per_block;
  int64_t n_chunks;  // passes of NR activation rows; block b is chunk b % n_chunks
};

using ::qwenrt::ops::cuda::silu;  // (activation.cuh)

// One block of 32 activations, lane l holding value v (act_quant.cu's form): d = max|x| / 127,
// q = round(x / d), s = d * sum(q); a NaN anywhere in the block makes d NaN. Lane l writes q[l],
// lane 0 *d and *s.
__device__ __forceinline__ void quantize_block32(float v, int lane, int8_t* q, float* d, float* s) {
  float amax = fabsf(v);
  for (int off = 16; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const bool bad = __any_sync(0xffffffffu, isnan(v));
  const float scale = bad ? __int_as_float(0x7fc00000) : amax / 127.0f;
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  const int qi = __float2int_rn(v * inv);
  q[lane] = static_cast<int8_t>(qi);
  int sum = qi;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    *d = scale;
    *s = scale * float(sum);
  }
}

template <int NV>
__device__ __forceinline__ void warp_sum(float (&v)[NV]) {
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
  }
}

// ---- matmul.cu -----------------------------------------------------------------------------
bool is_quantised(DType t);

// ---- act_quant.cu ---------------------------------------------------------------------------
// Quantises x [rows, in] into the workspace (when `needed`) and returns the activations a kernel
// reads; with `tiles` (and in % 256 == 0) also in the tensor-core GEMV's tile order, unless
// QWENRT_CUDA_MMA_TILED=0 (read per call; =2 gives Q8_0 the tile order too).
Acts prepare_acts(const float* x, int64_t rows, int64_t in, bool needed, void* workspace,
                  cudaStream_t stream, bool tiles = false);
// Workspace bytes prepare_acts needs for `rows` rows of `in`.
int64_t quant_act_bytes(int64_t rows, int64_t in);

// ---- gemv_staged.cu: quantised weights, n <= 8 rows (activations quantised by the caller) ----
// Each returns false, having launched nothing, where it has no kernel (type, alignment, n).
bool staging_off();                  // QWENRT_CUDA_STAGED=0
int staged_vec_of(const MatArg& m);  // the widest tile copy the layout allows (0: none)
bool staged_group(const Group& g, int64_t n, const Acts& a, cudaStream_t stream);
bool staged_swiglu(const MatArg& g, const MatArg& u, float* y, int64_t n, const Acts& a,
                   cudaStream_t stream);
bool staged_experts_swiglu(const MatArg& g, const MatArg& u, const int32_t* ids, int k, float* y,
                           int64_t n_pairs, const Acts& a, cudaStream_t stream);
bool staged_experts_down_pairs(const MatArg& d, const int32_t* ids, float* y, int64_t n_pairs,
                               const Acts& a, cudaStream_t stream);
bool staged_experts_down(const MatArg& d, const int32_t* ids, const float* weights, int k, float* y,
                         int64_t n, const Acts& a, cudaStream_t stream);

// ---- gemv_mma.cu: quantised weights on int8 tensor cores, 2..64 rows (activations quantised by
// the caller, with their block sums) ----
// Whether n rows take the tensor-core GEMV (QWENRT_CUDA_MMA_MIN_ROWS <= n <= QWENRT_CUDA_MMA_ROWS,
// defaults 3 and 32; at most 64; QWENRT_CUDA_MMA_ROWS=0: never).
bool mma_rows(int64_t n);
// Whether W has a tensor-core GEMV (Q4_K, Q5_K, Q6_K, Q8_0 in superblocks; single matrices).
bool mma_kind(const Matrix& w);
// Whether its tensor-core GEMV reads the activations in tile order (prepare_acts' `tiles`).
bool mma_tiled(const Matrix& w);
// Each returns false, having launched nothing, where it has no kernel (type, alignment, n).
bool mma_group(const Group& g, int64_t n, const Acts& a, cudaStream_t stream);
bool mma_swiglu(const MatArg& g, const MatArg& u, float* y, int64_t n, const Acts& a,
                cudaStream_t stream);

// ---- moe_mmq.cu: dense matrices of many rows on the MoE's int8 GEMM (activations quantised by
// the caller, with their block sums) ----
// Whether n rows take it (QWENRT_CUDA_DENSE_MMQ="lo,hi", default 33..64; "0": never).
bool mmq_dense_rows(int64_t n);
// Whether W has a kernel (Q4_K, Q5_K, Q6_K, Q8_0 in superblocks; in a multiple of 256; aligned).
bool mmq_dense_kind(const Matrix& w);
// The same for a SwiGLU pair (one type; out a multiple of 64).
bool mmq_dense_swiglu_kind(const Matrix& gate, const Matrix& up);
// Whether n rows of a matrix of `out` rows make a launch of at least one block an SM at tiles of
// 16 rows. Its blocks walk a whole row's superblocks in order, about 2 us each on an H100, so a
// narrower launch pays that walk for little work: the 27B's 48-row beta and alpha projections
// at 64 rows took 39 us each (ncu), and go to cuBLAS instead.
bool mmq_dense_wide(int64_t n, int64_t out, bool swiglu);
// y [n, ldy] (columns 0..w.out) = x @ W^T; tiles of tile_rows rows (16, 32 or 64; 0: the rule
// that keeps two blocks an SM).
void mmq_dense(const MatArg& w, const Acts& a, int64_t n, float* y, int64_t ldy,
               cudaStream_t stream, int tile_rows = 0);
// y [n, gate.out] = silu(x @ gate^T) * (x @ up^T).
void mmq_dense_swiglu(const MatArg& gate, const MatArg& up, const Acts& a, int64_t n, float* y,
                      cudaStream_t stream, int tile_rows = 0);

// ---- gemv_resident.cu: one activation row, x in fp32 (quantised inside) ----
// Each returns false, having launched nothing, where it has no kernel or measured slower.
bool resident_group(const Group& g, const float* x, int64_t in, void* workspace,
                    cudaStream_t stream);
bool resident_swiglu(const MatArg& g, const MatArg& u, const float* x, int64_t in, float* y,
                     void* workspace, cudaStream_t stream);
bool resident_experts_swiglu(const MatArg& g, const MatArg& u, const int32_t* ids, int k,
                             const float* x, int64_t in, float* y, void* workspace,
                             cudaStream_t stream);
// y [n_pairs, d.out]: row p = expert ids[p]'s down over x row p (each row quantised in the kernel).
bool resident_experts_down_pairs(const MatArg& d, const int32_t* ids, const float* x, int64_t in,
                                 int64_t n_pairs, float* y, cudaStream_t stream);
// y [n, d.out]: row t = sum_j weights[t k + j] (x[t k + j] @ down[ids[t k + j]]^T) +
// shared_scale[t] shared[t] (shared null: none), x [n k, ff]; false (nothing launched) where the
// resident kernel does not take it (ff not whole superblocks, k ff over 8192, the type).
bool resident_experts_down_combine(const MatArg& d, const int32_t* ids, const float* weights, int k,
                                   const float* x, int64_t ff, const float* shared,
                                   const float* shared_scale, float* y, int64_t n,
                                   cudaStream_t stream);

// The MoE FFN of one decode row after routing in two launches, each a resident_two_kernel: the
// chosen experts' gate / up (mid [k, ff]) beside the shared expert's (shared_mid [shared_ff]),
// which also zeroes out; then the routed down summed over the pairs with their weights beside
// the shared down times *shared_scale, both parts adding into out [dim]. False where the types,
// shapes or alignment have no such pair of kernels (launching nothing; with launch false, only
// the check).
struct MoeRowArgs {
  MatArg gate, up, down, shared_gate, shared_up, shared_down;
  const int32_t* ids;
  const float* weights;
  int k;
  const float* h;
  int64_t dim, ff, shared_ff;
  float* mid;
  float* shared_mid;
  const float* shared_scale;
  float* out;
};
bool resident_moe_row(const MoeRowArgs& m, bool launch, cudaStream_t stream);
// The same with the routing in front, in one launch (moe_fused.cu).
bool resident_moe_fused(const MoeRowArgs& m, const NormRouteArgs& route, bool launch,
                        cudaStream_t stream);

// ---- gemm.cu: prefill GEMM on cuBLAS (weights expanded a chunk of rows at a time) ----
// Whether a matmul of n rows of W runs as a GEMM (n >= QWENRT_CUDA_GEMM_ROWS, default 32; 0: never;
// single matrices only).
bool gemm_rows(const Matrix& w, int64_t n);
// Workspace of one gemm call: x as bf16, then the expanded chunk.
int64_t gemm_workspace_bytes(const Matrix& w, int64_t n);
// x [n, in] as bf16 at the start of the workspace (for quantised W); float W take x itself.
const void* gemm_prepare_x(const float* x, int64_t n, int64_t in, void* workspace,
                           cudaStream_t stream);
// y [n, out] (rows ldy floats apart) = x @ W^T, x as gemm_prepare_x returned it (or fp32 x for
// float W).
void gemm(const Matrix& w, const void* x, int64_t n, float* y, int64_t ldy, void* workspace,
          cudaStream_t stream);

inline constexpr int kMaxGridY = 65535;  // the hardware limit of gridDim.y

// ---- Float weights ----------------------------------------------------------------------------
// Element access for F32 / F16 / BF16 rows: `elem` at any alignment the type allows, `unpack` of
// one 16-byte vector (kPerVec elements) when the rows are 16-byte aligned.
struct F32W {
  static constexpr int kPerVec = 4;
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return __ldg(reinterpret_cast<const float*>(row) + i);
  }
  static __device__ __forceinline__ void unpack(const int4& v, float (&f)[kPerVec]) {
    f[0] = __int_as_float(v.x);
    f[1] = __int_as_float(v.y);
    f[2] = __int_as_float(v.z);
    f[3] = __int_as_float(v.w);
  }
};
// F16 and BF16 (BF16 = true): two 16-bit values a 32-bit word.
template <bool BF16>
struct Half16W {
  static constexpr int kPerVec = 8;
  static __device__ __forceinline__ float widen(uint32_t bits) {
    return BF16 ? qb::bf16_bits_to_float(static_cast<uint16_t>(bits))
                : qb::half_bits_to_float(static_cast<uint16_t>(bits));
  }
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return widen(qb::load2(row + 2 * i));
  }
  static __device__ __forceinline__ void unpack(const int4& v, float (&f)[kPerVec]) {
    const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = widen(w[i] & 0xffff);
      f[2 * i + 1] = widen(w[i] >> 16);
    }
  }
};
using F16W = Half16W<false>;
using BF16W = Half16W<true>;

}  // namespace qwenrt::ops::cuda::mm
