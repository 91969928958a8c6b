// Activation quantisation for the quantised-weight matmuls (matmul_args.cuh, "act_quant.cu"):
// x [rows, in] fp32 -> int8 blocks of 32 with an fp32 scale and the block sum, the form every
// GEMV and the tensor-core GEMV read (quant_blocks.cuh, "Activations").
#include <cstdint>
#include <cstdlib>

#include "ops/cuda/check.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// The tile orders (Acts::tq, tq16, td, ts; mma_quant.cuh "ActTiles"), for rows padded to whole
// 8-row n-tiles and in % 256 == 0. N-tile nt's superblock sb is 2048 int8 values at
// (nt * n_sb + sb) * 2048 in each order, every lane (g, t) of a warp reading four 16-byte runs
// 512 bytes apart (a warp's load is 512 contiguous bytes):
// - k32 (Q4_K, Q5_K; gemv_mma.cu's k permutation): [block pair jp][row g][lane t][half h][8]
//   holds elements 8t..8t+7 of block 2 jp + h of row 8 nt + g;
// - k16 (Q6_K: the mma's own order in steps of 16): [step quad c][row g][lane t][step i % 4][4]
//   holds elements 16 (i % 2) + 4t .. + 3 of block i / 2 for step i = 4c + i % 4.
// Its scales and block sums are 64 floats at (nt * n_sb + sb) * 64, [row g][block j].
struct Tiles {
  int8_t* q;
  int8_t* q16;
  float* d;
  float* s;
  int64_t nb;  // blocks of 32 a row (0: no tiles)
};

// One warp per block of 32: d = max|x| / 127, q = round(x / d), s = d * sum(q) (the min and offset
// terms of the tensor-core GEMV). n_blocks = n * in / 32 (rows are contiguous and in is a multiple
// of 32, so a flat index is row-major). A NaN input gives a NaN scale, so it reaches the output as
// the reference would.
// Blocks from n_blocks to n_padded (the zero rows padded_rows adds) become zeros; with tiles, each
// block's values, scale and sum are also written in the tile orders.
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_blocks, int64_t n_padded,
                                   int8_t* __restrict__ q, float* __restrict__ d,
                                   float* __restrict__ s, Tiles tl) {
  pdl_launch_dependents();
  const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= n_padded) return;  // uniform over the warp
  if (blk >= n_blocks) {
    q[blk * 32 + lane] = 0;
    if (lane == 0) d[blk] = s[blk] = 0.0f;
  } else {
    quantize_block32(x[blk * 32 + lane], lane, q + blk * 32, d + blk, s + blk);
  }
  if (tl.nb == 0) return;
  // The thread reads back what it (q) or its warp's lane 0 (d, s) wrote.
  __syncwarp();
  const int64_t row = blk / tl.nb, b = blk % tl.nb;
  const int64_t tile = (row / 8) * (tl.nb / 8) + b / 8;
  const int g = static_cast<int>(row % 8), j = static_cast<int>(b % 8);
  const int8_t v = q[blk * 32 + lane];
  tl.q[tile * 2048 + (j / 2) * 512 + g * 64 + (lane / 8) * 16 + (j % 2) * 8 + lane % 8] = v;
  const int i = 2 * j + lane / 16;  // the k16 step
  tl.q16[tile * 2048 + (i / 4) * 512 + g * 64 + (lane % 16 / 4) * 16 + (i % 4) * 4 + lane % 4] = v;
  if (lane == 0) {
    tl.d[tile * 64 + g * 8 + j] = d[blk];
    tl.s[tile * 64 + g * 8 + j] = s[blk];
  }
}

// The quantised activations' place in the workspace: q [rows, in], then d and s [rows, in / 32],
// rows padded to whole 8-row tiles (zeros) for the tensor-core GEMV, then the same three in the
// tile order.
struct QuantAct {
  int8_t* q;
  float* d;
  float* s;
  Tiles tiles;
};
// Rows padded with zero rows to what the tensor-core GEMV reads: 1, 2, 4 or 8 whole 8-row n-tiles
// (gemv_mma.cu's NT), whole n-tiles above.
int64_t padded_rows(int64_t rows) {
  for (int64_t r : {8, 16, 32, 64})
    if (rows <= r) return r;
  return (rows + 7) / 8 * 8;
}
// The tile orders exist for the tensor-core GEMV's row counts only (at most 64): prefill-sized
// quantisations keep their workspace to the row-major copy.
constexpr int64_t kMaxTiledRows = 64;
QuantAct quant_act_at(void* workspace, int64_t rows, int64_t in) {
  if (!aligned(workspace, 16)) cuda_fail("matmul workspace {} is not 16-byte aligned", workspace);
  rows = padded_rows(rows);
  auto* base = static_cast<int8_t*>(workspace);
  const int64_t values = align256(rows * in), scales = align256(rows * in / qb::kActBlock * 4);
  auto at = [&](int64_t off) { return reinterpret_cast<float*>(base + off); };
  int8_t* tq = base + values + 2 * scales;
  return {base,
          at(values),
          at(values + scales),
          {tq, tq + values, at(3 * values + 2 * scales), at(3 * values + 3 * scales), 0}};
}

bool tiles_on() {
  const char* v = std::getenv("QWENRT_CUDA_MMA_TILED");
  return !(v && v[0] == '0');
}

}  // namespace

int64_t quant_act_bytes(int64_t rows, int64_t in) {
  rows = padded_rows(rows);
  const int64_t values = align256(rows * in), scales = align256(rows * in / qb::kActBlock * 4);
  const int64_t tiles = rows > kMaxTiledRows ? 0 : 2 * values + 2 * scales;
  return values + 2 * scales + tiles;
}

// Quantises x [rows, in] into the workspace (when `needed`) and returns the activations a kernel
// reads.
Acts prepare_acts(const float* x, int64_t rows, int64_t in, bool needed, void* workspace,
                  cudaStream_t stream, bool tiles) {
  Acts a{nullptr, nullptr, x, in};
  if (!needed || rows == 0) return a;
  if (in % qb::kActBlock != 0) cuda_fail("matmul: in = {} is not a multiple of 32", in);
  if (workspace == nullptr) cuda_fail("matmul: quantised weights need a workspace");
  QuantAct qa = quant_act_at(workspace, rows, in);
  tiles = tiles && rows <= kMaxTiledRows && in % (8 * qb::kActBlock) == 0 && tiles_on();
  if (tiles) qa.tiles.nb = in / qb::kActBlock;
  const int64_t n_blocks = rows * in / qb::kActBlock;
  const int64_t n_padded = padded_rows(rows) * in / qb::kActBlock;
  constexpr int kBlocksPerCta = 256 / 32;
  const int64_t grid = (n_padded + kBlocksPerCta - 1) / kBlocksPerCta;
  quantize_q8_kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(x, n_blocks, n_padded, qa.q,
                                                                      qa.d, qa.s, qa.tiles);
  QWENRT_CUDA_CHECK_LAUNCH();
  a.q = qa.q;
  a.d = qa.d;
  a.s = qa.s;
  if (tiles) {
    a.tq = qa.tiles.q;
    a.tq16 = qa.tiles.q16;
    a.td = qa.tiles.d;
    a.ts = qa.tiles.s;
  }
  return a;
}

}  // namespace qwenrt::ops::cuda::mm
