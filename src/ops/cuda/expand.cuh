// Weight rows as the prefill GEMMs read them (gemm.cu, moe_gemm.cu): eight consecutive elements at
// a time in fp32 (quantised types through qb::dequant8, the reference's arithmetic; float types as
// stored), the bf16 store of eight, and the dispatch from a weight's type to its reader.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/kernels.h"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::expand {

template <class T>
struct Quant {
  static __device__ __forceinline__ void elem8(const uint8_t* row, int64_t i0, float (&v)[8]) {
    qb::dequant8<T>(row, i0, v);
  }
};
struct F32 {
  static __device__ __forceinline__ void elem8(const uint8_t* row, int64_t i0, float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = reinterpret_cast<const float*>(row)[i0 + j];
  }
};
struct F16 {
  static __device__ __forceinline__ void elem8(const uint8_t* row, int64_t i0, float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = qb::half_bits_to_float(qb::load2(row + 2 * (i0 + j)));
  }
};
struct BF16 {
  static __device__ __forceinline__ void elem8(const uint8_t* row, int64_t i0, float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = qb::bf16_bits_to_float(qb::load2(row + 2 * (i0 + j)));
  }
};

// dst [8] (16-byte aligned) = v rounded to bf16.
__device__ __forceinline__ void store8(__nv_bfloat16* dst, const float (&v)[8]) {
  __align__(16) __nv_bfloat16 b[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) b[j] = __float2bfloat16_rn(v[j]);
  *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(b);
}

// Calls f(Reader{}) with the reader of w's type (host side: f launches a kernel templated on it);
// false, having called nothing, for a type without one.
template <class F>
bool with_reader(const Matrix& w, F&& f) {
  switch (w.dtype) {
    case DType::Q4_K:
      f(Quant<qb::Q4K>{});
      return true;
    case DType::Q5_K:
      f(Quant<qb::Q5K>{});
      return true;
    case DType::Q6_K:
      f(Quant<qb::Q6K>{});
      return true;
    case DType::Q4_0:
      f(Quant<qb::Q40>{});
      return true;
    case DType::IQ4_XS:
      f(Quant<qb::IQ4XS>{});
      return true;
    case DType::Q8_0:
      if (w.q8_superblocks) {
        f(Quant<qb::Q80S>{});
      } else {
        f(Quant<qb::Q80>{});
      }
      return true;
    case DType::F32:
      f(F32{});
      return true;
    case DType::F16:
      f(F16{});
      return true;
    case DType::BF16:
      f(BF16{});
      return true;
    default:
      return false;
  }
}

}  // namespace qwenrt::ops::cuda::expand
