// What the two files of the chunked delta rule share (deltanet_chunked.cu: prep, the fp32 state
// and output kernels, the entry point; deltanet_chunked_tc.cu: the tensor-core state and output
// kernels): the kernels' arguments, the chunk lookup, and the tf32 mma.sync helpers.
#pragma once

#include <cstdint>

#include "ops/cuda/kernels.h"

namespace qwenrt::ops::cuda::chunked {

constexpr int kL = 64;         // chunk length
constexpr int kThreads = 256;  // every kernel: 8 warps
constexpr int kCols = 32;      // value columns per block of the state kernels (and fp32 output)

struct ChunkParams {
  const Span* spans;
  int n_spans;
  const float* mixed;  // [n, C]: q [Hk D] | k [Hk D] | v [Hv D] per row (conv + SiLU)
  const float* z;      // [n, Hv D]
  const float* alpha;  // [n, Hv]
  const float* beta;   // [n, Hv]
  const float* dt_bias;
  const float* a;
  const float* norm;   // [D]
  float* delta_state;  // [n_slots, Hv, D, D]
  float* out;          // [n, Hv D]
  float* q;            // [n, Hk, D] normalised
  float* k;            // [n, Hk, D] normalised
  float* g;            // [n, Hv] cumulative log decay within the row's chunk
  float* u;            // [n, Hv, D]: U from kernel 1, D after kernel 2
  float* w;            // [n, Hv, D]
  float* s0;           // [max_chunks, Hv, D, D]: each chunk's start state
  int64_t C;
  int Hk, Hv;
  float eps;
  bool sigmoid_gate;  // qwen4exp: the output gate is sigmoid(z), not silu(z)
};

// The gated norm's output gate: silu(z), or sigmoid(z) with sigmoid_gate (qwen4exp); the
// recurrent kernels of deltanet.cu use it too.
__device__ __forceinline__ float output_gate(float z, bool sigmoid_gate) {
  return (sigmoid_gate ? 1.0f : z) / (1.0f + expf(-z));
}

__device__ __forceinline__ int chunks_of(const Span& s) {
  return (s.count + kL - 1) / kL;
}

// The index'th chunk over all spans in span order: its span and number within the span.
__device__ inline bool find_chunk(const ChunkParams& p, int index, Span& span, int& c) {
  for (int s = 0; s < p.n_spans; ++s) {
    const Span sp = p.spans[s];
    const int n = chunks_of(sp);
    if (index < n) {
      span = sp;
      c = index;
      return true;
    }
    index -= n;
  }
  return false;
}

// ---- tf32 tensor cores: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ----
// c [16][8] += a [16][8] b [8][8], fp32 accumulators. Lane l, g = l / 4, q = l % 4 holds
// (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32):
//   A (row, k): a0 (g, q)      a1 (g + 8, q)      a2 (g, q + 4)      a3 (g + 8, q + 4)
//   B (k, col): b0 (q, g)      b1 (q + 4, g)
//   C (row, col): c0 (g, 2q)   c1 (g, 2q + 1)     c2 (g + 8, 2q)     c3 (g + 8, 2q + 1)
// Operands are read from fp32 shared memory through accessors at(row, col) and rounded to tf32
// (round to nearest, 10-bit mantissa) as they are loaded; accumulators stay fp32. Shared memory
// banks: a row stride of 4 mod 32 floats makes the reads of a row-major A, a(m, k) = x[m][k], and
// of a transposed B, b(k, n) = x[n][k], conflict-free; 8 mod 32 does the same for a row-major B,
// b(k, n) = x[k][n], and a transposed A, a(m, k) = x[k][m].
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

struct FragA {
  uint32_t x[4];
};
struct FragB {
  uint32_t x[2];
};

// The A fragment of rows m0.. m0+15, k k0.. k0+7.
template <typename At>
__device__ __forceinline__ FragA load_a(At at, int m0, int k0) {
  const int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
  return {{to_tf32(at(m0 + g, k0 + q)), to_tf32(at(m0 + g + 8, k0 + q)),
           to_tf32(at(m0 + g, k0 + q + 4)), to_tf32(at(m0 + g + 8, k0 + q + 4))}};
}

// The B fragment of k k0.. k0+7, columns n0.. n0+7.
template <typename At>
__device__ __forceinline__ FragB load_b(At at, int k0, int n0) {
  const int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
  return {{to_tf32(at(k0 + q, n0 + g)), to_tf32(at(k0 + q + 4, n0 + g))}};
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const FragA& a, const FragB& b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
}

// Row and column of accumulator element i (0..3) of the tile at (m0, n0), for this lane.
__device__ __forceinline__ int c_row(int m0, int i) {
  return m0 + (threadIdx.x % 32) / 4 + 8 * (i / 2);
}
__device__ __forceinline__ int c_col(int n0, int i) {
  return n0 + 2 * (threadIdx.x % 4) + i % 2;
}

// The chunk's [kL][kL] dot products of rows of a with rows of b (both [kL][kStride] fp32 in shared
// memory, kD columns used, kStride = 4 mod 32) on tensor cores: warp w takes rows 16 (w / 2)..
// and columns 32 (w % 2).. (four n-tiles), each product handed to put(t, s, dot).
template <int kD, int kStride, typename Put>
__device__ __forceinline__ void gram_rows_tc(const float* a, const float* b, Put put) {
  static_assert(kThreads == 256 && kL == 64, "8 warps: 4 row tiles x 2 column halves");
  const int warp = threadIdx.x / 32, m0 = 16 * (warp / 2), n_base = 32 * (warp % 2);
  float acc[4][4] = {};
  const auto at_a = [&](int row, int k) { return a[row * kStride + k]; };
  const auto at_bt = [&](int k, int col) { return b[col * kStride + k]; };  // b^T
#pragma unroll 4
  for (int k0 = 0; k0 < kD; k0 += 8) {
    const FragA fa = load_a(at_a, m0, k0);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) mma_tf32(acc[nt], fa, load_b(at_bt, k0, n_base + 8 * nt));
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) put(c_row(m0, i), c_col(n_base + 8 * nt, i), acc[nt][i]);
  }
}

// The tensor-core state and output kernels (deltanet_chunked_tc.cu), launched after prep.
template <int kD>
void launch_state_output_tc(const DeviceStep& step, const ChunkParams& prm, cudaStream_t stream);

}  // namespace qwenrt::ops::cuda::chunked
