// Activation quantisation for the quantised-weight matmuls (matmul_args.cuh, "act_quant.cu"):
// x [rows, in] fp32 -> int8 blocks of 32 with an fp32 scale and the block sum, the form every
// GEMV and the tensor-core GEMV read (quant_blocks.cuh, "Activations").
#include <cstdint>

#include "ops/cuda/check.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// One warp per block of 32: d = max|x| / 127, q = round(x / d), s = d * sum(q) (the min and offset
// terms of the tensor-core GEMV). n_blocks = n * in / 32 (rows are contiguous and in is a multiple
// of 32, so a flat index is row-major). A NaN input gives a NaN scale, so it reaches the output as
// the reference would.
// Blocks from n_blocks to n_padded (the rows that pad the last 8-row tile) become zeros.
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_blocks, int64_t n_padded,
                                   int8_t* __restrict__ q, float* __restrict__ d,
                                   float* __restrict__ s) {
  pdl_launch_dependents();
  const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= n_padded) return;  // uniform over the warp
  if (blk >= n_blocks) {
    q[blk * 32 + lane] = 0;
    if (lane == 0) d[blk] = s[blk] = 0.0f;
    return;
  }
  quantize_block32(x[blk * 32 + lane], lane, q + blk * 32, d + blk, s + blk);
}

// The quantised activations' place in the workspace: q [rows, in], then d and s [rows, in / 32],
// rows padded to whole 8-row tiles (zeros) for the tensor-core GEMV.
struct QuantAct {
  int8_t* q;
  float* d;
  float* s;
};
int64_t padded_rows(int64_t rows) {
  return (rows + 7) / 8 * 8;
}
QuantAct quant_act_at(void* workspace, int64_t rows, int64_t in) {
  if (!aligned(workspace, 16)) cuda_fail("matmul workspace {} is not 16-byte aligned", workspace);
  rows = padded_rows(rows);
  auto* base = static_cast<int8_t*>(workspace);
  const int64_t scales = align256(rows * in / qb::kActBlock * 4);
  auto* d = reinterpret_cast<float*>(base + align256(rows * in));
  return {base, d, reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(d) + scales)};
}

}  // namespace

int64_t quant_act_bytes(int64_t rows, int64_t in) {
  rows = padded_rows(rows);
  return align256(rows * in) + 2 * align256(rows * in / qb::kActBlock * 4);
}

// Quantises x [rows, in] into the workspace (when `needed`) and returns the activations a kernel
// reads.
Acts prepare_acts(const float* x, int64_t rows, int64_t in, bool needed, void* workspace,
                  cudaStream_t stream) {
  Acts a{nullptr, nullptr, x, in};
  if (!needed || rows == 0) return a;
  if (in % qb::kActBlock != 0) cuda_fail("matmul: in = {} is not a multiple of 32", in);
  if (workspace == nullptr) cuda_fail("matmul: quantised weights need a workspace");
  const QuantAct qa = quant_act_at(workspace, rows, in);
  const int64_t n_blocks = rows * in / qb::kActBlock;
  const int64_t n_padded = padded_rows(rows) * in / qb::kActBlock;
  constexpr int kBlocksPerCta = 256 / 32;
  const int64_t grid = (n_padded + kBlocksPerCta - 1) / kBlocksPerCta;
  quantize_q8_kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(x, n_blocks, n_padded, qa.q,
                                                                      qa.d, qa.s);
  QWENRT_CUDA_CHECK_LAUNCH();
  a.q = qa.q;
  a.d = qa.d;
  a.s = qa.s;
  return a;
}

}  // namespace qwenrt::ops::cuda::mm
