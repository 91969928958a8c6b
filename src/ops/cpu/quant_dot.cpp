#include "ops/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"

namespace qwenrt::ops::cpu {

ActFormat act_format(DType t) {
  switch (t) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return ActFormat::kQ8K;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
      return ActFormat::kQ8_32;
    default:
      return ActFormat::kF32;
  }
}

int64_t act_row_bytes(ActFormat f, int64_t in) {
  switch (f) {
    case ActFormat::kQ8K:
      return in / 256 * int64_t{sizeof(BlockQ8K)};
    case ActFormat::kQ8_32:
      return in / 32 * int64_t{sizeof(BlockQ8_32)};
    case ActFormat::kF32:
      break;
  }
  return in * 4;
}

namespace {

// Symmetric int8 of one block: q = round(x / d), d = max|x| / 127 (d = 0 for an all-zero block).
template <int N>
float quantize_block_i8(const float* x, int8_t* q) {
  float amax = 0;
  for (int i = 0; i < N; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0) {
    std::memset(q, 0, N);
    return 0;
  }
  const float id = 127.0f / amax;
  for (int i = 0; i < N; ++i) q[i] = static_cast<int8_t>(std::lrintf(x[i] * id));
  return amax / 127.0f;
}

}  // namespace

void quantize_act_row(ActFormat f, const float* x, int64_t in, void* dst) {
  if (f != ActFormat::kF32) {
    const Isa isa = active_isa();
    if (isa >= Isa::kAvx512) return quantize_act_row_avx512(f, x, in, dst);
    if (isa >= Isa::kAvx2) return quantize_act_row_avx2(f, x, in, dst);
  }
  switch (f) {
    case ActFormat::kQ8K: {
      auto* b = static_cast<BlockQ8K*>(dst);
      for (int64_t i = 0; i < in / 256; ++i, x += 256, ++b) {
        b->d = quantize_block_i8<256>(x, b->qs);
        for (int j = 0; j < 16; ++j) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += b->qs[16 * j + l];
          b->bsums[j] = static_cast<int16_t>(s);
        }
      }
      return;
    }
    case ActFormat::kQ8_32: {
      auto* b = static_cast<BlockQ8_32*>(dst);
      for (int64_t i = 0; i < in / 32; ++i, x += 32, ++b) {
        b->d = quantize_block_i8<32>(x, b->qs);
        int s = 0;
        for (int l = 0; l < 32; ++l) s += b->qs[l];
        b->sum = s;
      }
      return;
    }
    case ActFormat::kF32:
      std::memcpy(dst, x, in * 4);
      return;
  }
}

DotFn dot_kernel(DType type, Isa isa) {
  DotFn fn = nullptr;
  if (isa >= Isa::kAvx512) fn = dot_kernel_avx512(type);
  if (!fn && isa >= Isa::kAvx2) fn = dot_kernel_avx2(type);
  if (!fn) fn = dot_kernel_scalar(type);
  return fn;
}

float dot_f32(const float* a, const float* b, int64_t n, Isa isa) {
  if (isa >= Isa::kAvx512) return dot_f32_avx512(a, b, n);
  if (isa >= Isa::kAvx2) return dot_f32_avx2(a, b, n);
  // Eight partial sums, so the compiler may vectorise without reassociating one chain.
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

}  // namespace qwenrt::ops::cpu
