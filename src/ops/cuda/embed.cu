// The embedding lookup of the CUDA backend (kernels.h, embed_rows): rows of the token table in
// any type the matmul kernels read, dequantised to fp32 on the device.
#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda {
namespace {

using mm::BF16W;
using mm::F16W;
using mm::F32W;
using mm::kMaxGridY;

template <class T>
struct QuantElem {
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return qb::dequant_element<T>(row, i);
  }
};

// out [n, dim] = rows tokens[0..n) of the table; blockIdx.y walks tokens (stride gridDim.y).
template <class E>
__global__ void embed_kernel(const uint8_t* __restrict__ table, int64_t row_bytes, int64_t n_vocab,
                             int64_t dim, const int32_t* __restrict__ tokens, int64_t n,
                             float* __restrict__ out) {
  pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const int32_t id = tokens[t];
    // Ids are checked on the host; one outside the table still must not read past it.
    out[t * dim + i] =
        id >= 0 && id < n_vocab ? E::elem(table + id * row_bytes, i) : __int_as_float(0x7fc00000);
  }
}

}  // namespace

void embed_rows(const Matrix& table, const int32_t* tokens, int64_t n, float* out,
                cudaStream_t stream) {
  if (n <= 0) return;
  if (!has_kernel(table.dtype))
    cuda_fail("embed_rows: no CUDA kernel for {}", dtype_name(table.dtype));
  constexpr int kEmbedThreads = 256;
  const dim3 grid(static_cast<unsigned>((table.in + kEmbedThreads - 1) / kEmbedThreads),
                  static_cast<unsigned>(std::min<int64_t>(n, kMaxGridY)));
  const auto* data = static_cast<const uint8_t*>(table.data);
  switch (table.dtype) {
#define QWENRT_EMBED_CASE(TYPE, ELEM)                                                        \
  case DType::TYPE:                                                                          \
    embed_kernel<ELEM><<<grid, kEmbedThreads, 0, stream>>>(data, table.row_bytes, table.out, \
                                                           table.in, tokens, n, out);        \
    break;
    QWENRT_EMBED_CASE(Q4_K, QuantElem<qb::Q4K>)
    QWENRT_EMBED_CASE(Q5_K, QuantElem<qb::Q5K>)
    QWENRT_EMBED_CASE(Q6_K, QuantElem<qb::Q6K>)
    case DType::Q8_0:
      if (table.q8_superblocks) {
        embed_kernel<QuantElem<qb::Q80S>><<<grid, kEmbedThreads, 0, stream>>>(
            data, table.row_bytes, table.out, table.in, tokens, n, out);
      } else {
        embed_kernel<QuantElem<qb::Q80>><<<grid, kEmbedThreads, 0, stream>>>(
            data, table.row_bytes, table.out, table.in, tokens, n, out);
      }
      break;
      QWENRT_EMBED_CASE(Q4_0, QuantElem<qb::Q40>)
      QWENRT_EMBED_CASE(IQ4_XS, QuantElem<qb::IQ4XS>)
      QWENRT_EMBED_CASE(F32, F32W)
      QWENRT_EMBED_CASE(F16, F16W)
      QWENRT_EMBED_CASE(BF16, BF16W)
#undef QWENRT_EMBED_CASE
    default:
      break;
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
