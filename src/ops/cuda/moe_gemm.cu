// MoE prefill: the routed experts of many rows as grouped GEMMs on tensor cores (kernels.h,
// "MoE prefill"). The (row, choice) pairs are ordered by expert on the device (no host read of
// the routing), and each block multiplies one expert's tile of up to kTileRows pairs by a tile of
// that expert's weight rows:
// - order_kernel (one block): counts the pairs of each expert, scans the counts into each
//   expert's first pair and first tile, and scatters the pair indices into expert order. The
//   order within an expert depends on atomics, which changes nothing: every pair's outputs are
//   computed on their own, with the same arithmetic wherever the pair sits in a tile.
// - grouped_kernel: blockIdx.x is a tile (a host-known upper bound of them is launched; blocks
//   past the last tile return), blockIdx.y a run of output rows. Per step of kStepK along `in`, the
//   block loads the tile's activation rows (fp32 -> bf16) and dequantises its weight rows
//   (qb::dequant8, the reference's arithmetic, -> bf16) into shared memory, and its four
//   warps multiply them with WMMA (bf16 inputs, fp32 accumulators). SwiGLU blocks take kTileN gate
//   rows and the same kTileN up rows, so silu(gate) * up is formed in the epilogue; down blocks
//   take 2 * kTileN rows of the down matrix.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/cuda/check.h"
#include "ops/cuda/expand.cuh"
#include "ops/cuda/expert_order.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 128;       // 4 warps
constexpr int kTileRows = 32;       // pairs per tile (M)
constexpr int kTileN = 64;          // gate (and up) rows per SwiGLU block; down: 2 * kTileN
constexpr int kRowsB = 2 * kTileN;  // weight rows a block holds
constexpr int kStepK = 64;          // `in` elements per shared-memory step
constexpr int kLd = kStepK + 8;     // bf16 row stride in shared memory (WMMA: multiple of 8)
constexpr int kLdC = kRowsB + 4;    // fp32 row stride of the epilogue's tile
constexpr int kOrderThreads = 1024;

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

__global__ void __launch_bounds__(kOrderThreads)
    order_kernel(const int32_t* __restrict__ ids, int64_t n_pairs, int n_expert, int tile_rows,
                 int32_t* __restrict__ pairs, int32_t* __restrict__ pair_start,
                 int32_t* __restrict__ tile_start) {
  extern __shared__ int32_t s_order[];  // count [n_expert], cursor [n_expert]
  int32_t* count = s_order;
  int32_t* cursor = s_order + n_expert;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
  __syncthreads();
  // Ids come from the routing kernel; one out of range still must not write out of bounds.
  auto expert_of = [&](int64_t p) { return min(max(int(ids[p]), 0), n_expert - 1); };
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(&count[expert_of(p)], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t pos = 0, tiles = 0;
    for (int e = 0; e < n_expert; ++e) {
      pair_start[e] = pos;
      tile_start[e] = tiles;
      cursor[e] = pos;
      pos += count[e];
      tiles += (count[e] + tile_rows - 1) / tile_rows;
    }
    pair_start[n_expert] = pos;
    tile_start[n_expert] = tiles;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x)
    pairs[atomicAdd(&cursor[expert_of(p)], 1)] = static_cast<int32_t>(p);
}

struct GroupedArgs {
  const uint8_t* w0;  // gate (SwiGLU) or down
  const uint8_t* w1;  // up (SwiGLU)
  int64_t row_bytes, expert_bytes, in, out;
  const float* x;  // SwiGLU: x [n, in], pair p reads row p / k; down: x [n_pairs, in]
  int k;
  ExpertOrder order;
  float* y;  // [n_pairs, out]
};

template <class E, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads) grouped_kernel(const __grid_constant__ GroupedArgs a) {
  const ExpertOrder& o = a.order;
  const int tile = blockIdx.x;
  if (tile >= o.tile_start[o.n_expert]) return;
  const int e = tile_expert(o, tile);
  const int64_t m0 = o.pair_start[e] + int64_t(tile - o.tile_start[e]) * kTileRows;
  const int64_t left = o.pair_start[e + 1] - m0;
  const int rows = static_cast<int>(left < kTileRows ? left : kTileRows);
  const int64_t n0 = int64_t(blockIdx.y) * (kSwiGlu ? kTileN : kRowsB);

  __shared__ __align__(32)
      uint8_t smem[std::max((kTileRows + kRowsB) * kLd * 2, kTileRows * kLdC * 4)];
  __shared__ int32_t s_pair[kTileRows];
  auto* sa = reinterpret_cast<__nv_bfloat16*>(smem);
  auto* sb = sa + kTileRows * kLd;
  auto* sc = reinterpret_cast<float*>(smem);
  if (threadIdx.x < kTileRows)
    s_pair[threadIdx.x] = threadIdx.x < rows ? o.pairs[m0 + threadIdx.x] : -1;
  __syncthreads();

  // Weight row j of the block (nullptr past the matrix's end).
  const uint8_t* expert0 = a.w0 + e * a.expert_bytes;
  const uint8_t* expert1 = kSwiGlu ? a.w1 + e * a.expert_bytes : nullptr;
  auto b_row = [&](int j) -> const uint8_t* {
    if (kSwiGlu) {
      const int64_t r = n0 + (j % kTileN);
      if (r >= a.out) return nullptr;
      return (j < kTileN ? expert0 : expert1) + r * a.row_bytes;
    }
    const int64_t r = n0 + j;
    return r < a.out ? expert0 + r * a.row_bytes : nullptr;
  };

  const int warp = threadIdx.x / 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 2; ++ni) wmma::fill_fragment(acc[mi][ni], 0.0f);

  for (int64_t k0 = 0; k0 < a.in; k0 += kStepK) {
    // Activations: kTileRows x kStepK as runs of 8.
    for (int item = threadIdx.x; item < kTileRows * kStepK / 8; item += kThreads) {
      const int r = item / (kStepK / 8), c = (item % (kStepK / 8)) * 8;
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const int32_t p = s_pair[r];
      if (p >= 0 && k0 + c < a.in) {
        const float* src = a.x + (kSwiGlu ? int64_t(p / a.k) : int64_t(p)) * a.in + k0 + c;
        const float4 lo4 = reinterpret_cast<const float4*>(src)[0];
        const float4 hi4 = reinterpret_cast<const float4*>(src)[1];
        v[0] = lo4.x, v[1] = lo4.y, v[2] = lo4.z, v[3] = lo4.w;
        v[4] = hi4.x, v[5] = hi4.y, v[6] = hi4.z, v[7] = hi4.w;
      }
      expand::store8(sa + r * kLd + c, v);
    }
    // Weights: kRowsB x kStepK, dequantised.
    for (int item = threadIdx.x; item < kRowsB * kStepK / 8; item += kThreads) {
      const int j = item / (kStepK / 8), c = (item % (kStepK / 8)) * 8;
      const uint8_t* row = b_row(j);
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (row != nullptr && k0 + c < a.in) E::elem8(row, k0 + c, v);
      expand::store8(sb + j * kLd + c, v);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kStepK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) wmma::load_matrix_sync(fa[mi], sa + mi * 16 * kLd + kk, kLd);
#pragma unroll
      for (int ni = 0; ni < 2; ++ni)
        wmma::load_matrix_sync(fb[ni], sb + (warp * 32 + ni * 16) * kLd + kk, kLd);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) wmma::mma_sync(acc[mi][ni], fa[mi], fb[ni], acc[mi][ni]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 2; ++ni)
      wmma::store_matrix_sync(sc + mi * 16 * kLdC + warp * 32 + ni * 16, acc[mi][ni], kLdC,
                              wmma::mem_row_major);
  __syncthreads();
  constexpr int kCols = kSwiGlu ? kTileN : kRowsB;
  for (int item = threadIdx.x; item < kTileRows * kCols; item += kThreads) {
    const int r = item / kCols, j = item % kCols;
    if (r >= rows || n0 + j >= a.out) continue;
    const float v =
        kSwiGlu ? mm::silu(sc[r * kLdC + j]) * sc[r * kLdC + kTileN + j] : sc[r * kLdC + j];
    a.y[int64_t(s_pair[r]) * a.out + n0 + j] = v;
  }
}

template <bool kSwiGlu>
void launch_grouped(const Matrix& w0, const Matrix* w1, const ExpertOrder& order, int k,
                    const float* x, float* y, cudaStream_t stream) {
  if (order.n_pairs == 0) return;
  if (order.tile_rows != kTileRows)
    cuda_fail("grouped experts: pairs ordered in tiles of {}, not {}", order.tile_rows, kTileRows);
  if (w0.in % kStepK != 0)
    cuda_fail("grouped experts: in = {} is not a multiple of {}", w0.in, kStepK);
  if (!mm::aligned(x, 16))
    cuda_fail("grouped experts: x {} is not 16-byte aligned", static_cast<const void*>(x));
  GroupedArgs a{};
  a.w0 = static_cast<const uint8_t*>(w0.data);
  a.w1 = w1 ? static_cast<const uint8_t*>(w1->data) : nullptr;
  a.row_bytes = w0.row_bytes;
  a.expert_bytes = w0.expert_bytes;
  a.in = w0.in;
  a.out = w0.out;
  a.x = x;
  a.k = k;
  a.order = order;
  a.y = y;
  const int cols = kSwiGlu ? kTileN : kRowsB;
  const dim3 grid(static_cast<unsigned>(order.max_tiles),
                  static_cast<unsigned>((w0.out + cols - 1) / cols));
  const bool launched = expand::with_reader(w0, [&](auto reader) {
    grouped_kernel<decltype(reader), kSwiGlu><<<grid, kThreads, 0, stream>>>(a);
  });
  if (!launched) cuda_fail("grouped experts: no kernel for {}", dtype_name(w0.dtype));
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool grouped_experts_fit(const Matrix& w) {
  return has_kernel(w.dtype) && w.in % kStepK == 0;
}

int64_t expert_order_workspace_bytes(int64_t n_pairs, int n_expert) {
  return align256(n_pairs * 4) + 2 * align256((int64_t{n_expert} + 1) * 4);
}

int grouped_tile_rows() {
  return kTileRows;
}

ExpertOrder order_by_expert(const int32_t* ids, int64_t n_pairs, int n_expert, int tile_rows,
                            void* workspace, cudaStream_t stream) {
  if (n_expert < 1) cuda_fail("order_by_expert: {} experts", n_expert);
  if (tile_rows < 1) cuda_fail("order_by_expert: tiles of {} pairs", tile_rows);
  auto* base = static_cast<uint8_t*>(workspace);
  auto* pairs = reinterpret_cast<int32_t*>(base);
  auto* pair_start = reinterpret_cast<int32_t*>(base + align256(n_pairs * 4));
  auto* tile_start = reinterpret_cast<int32_t*>(base + align256(n_pairs * 4) +
                                                align256((int64_t{n_expert} + 1) * 4));
  ExpertOrder o{pairs,    pair_start, tile_start,
                n_expert, n_pairs,    (n_pairs + tile_rows - 1) / tile_rows + n_expert,
                tile_rows};
  const size_t smem = 2 * sizeof(int32_t) * static_cast<size_t>(n_expert);
  // Past 48 KiB (streamed experts: slots of a device pool for ids) the kernel opts in to more.
  static size_t smem_set = 48 << 10;
  if (smem > smem_set) {
    if (cudaFuncSetAttribute(order_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) != cudaSuccess) {
      cudaGetLastError();
      cuda_fail("order_by_expert: " + std::to_string(n_expert) +
                " experts need more shared memory than a block has");
    }
    smem_set = smem;
  }
  order_kernel<<<1, kOrderThreads, smem, stream>>>(ids, n_pairs, n_expert, tile_rows, pairs,
                                                   pair_start, tile_start);
  QWENRT_CUDA_CHECK_LAUNCH();
  return o;
}

void grouped_experts_swiglu(const Matrix& gate, const Matrix& up, const ExpertOrder& order, int k,
                            const float* x, float* y, cudaStream_t stream) {
  if (gate.in != up.in || gate.out != up.out || gate.dtype != up.dtype ||
      gate.row_bytes != up.row_bytes || gate.expert_bytes != up.expert_bytes ||
      gate.q8_superblocks != up.q8_superblocks)
    cuda_fail("grouped_experts_swiglu: gate and up differ in shape or layout");
  launch_grouped<true>(gate, &up, order, k, x, y, stream);
}

void grouped_experts_down(const Matrix& down, const ExpertOrder& order, const float* x,
                          float* y_pairs, cudaStream_t stream) {
  launch_grouped<false>(down, nullptr, order, 1, x, y_pairs, stream);
}

}  // namespace qwenrt::ops::cuda
