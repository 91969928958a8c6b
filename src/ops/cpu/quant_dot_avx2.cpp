// AVX2 + FMA + F16C dot kernels (quant_dot_x86.inc), compiled for that level with a target
// pragma so the rest of the build keeps baseline flags; only called when the CPU has AVX2.
#include <cstring>

#include "ops/cpu/quant_dot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace qwenrt::ops::cpu {
namespace {
#include "ops/cpu/quant_dot_x86.inc"
}  // namespace

DotFn dot_kernel_avx2(DType type) {
  return kernel_for(type);
}

float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int u = 0; u < 4; ++u)
      acc[u] =
          _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * u), _mm256_loadu_ps(b + i + 8 * u), acc[u]);
  for (; i + 8 <= n; i += 8)
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
  float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// quantize_act_row's blocks at 256 bits, the same values as the scalar code (see the AVX-512
// version): 32 values a step, packed to int8 in order.
namespace {
inline float abs_max(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}
// 32 values -> int8 codes at q; sums of each 16 in sums[0], sums[1].
inline void quantize32(const float* x, __m256 id, int8_t* q, int32_t* sums) {
  __m256i v[4];
  for (int k = 0; k < 4; ++k)
    v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
  sums[0] = hsum(_mm256_add_epi32(v[0], v[1]));
  sums[1] = hsum(_mm256_add_epi32(v[2], v[3]));
  // packs work within 128-bit lanes: the dwords come out as 0 4 1 5 2 6 3 7 of the order.
  const __m256i w =
      _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(w, order));
}
}  // namespace

void quantize_act_row_avx2(ActFormat f, const float* x, int64_t in, void* dst) {
  int32_t sums[2];
  if (f == ActFormat::kQ8K) {
    auto* b = static_cast<BlockQ8K*>(dst);
    for (int64_t i = 0; i < in / 256; ++i, x += 256, ++b) {
      const float amax = abs_max(x, 256);
      const __m256 id = _mm256_set1_ps(amax == 0 ? 0.0f : 127.0f / amax);
      b->d = amax == 0 ? 0.0f : amax / 127.0f;
      for (int j = 0; j < 8; ++j) {
        quantize32(x + 32 * j, id, b->qs + 32 * j, sums);
        b->bsums[2 * j] = static_cast<int16_t>(sums[0]);
        b->bsums[2 * j + 1] = static_cast<int16_t>(sums[1]);
      }
    }
  } else {
    auto* b = static_cast<BlockQ8_32*>(dst);
    for (int64_t i = 0; i < in / 32; ++i, x += 32, ++b) {
      const float amax = abs_max(x, 32);
      const __m256 id = _mm256_set1_ps(amax == 0 ? 0.0f : 127.0f / amax);
      b->d = amax == 0 ? 0.0f : amax / 127.0f;
      quantize32(x, id, b->qs, sums);
      b->sum = sums[0] + sums[1];
    }
  }
}

}  // namespace qwenrt::ops::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86-64: the scalar level covers everything

namespace qwenrt::ops::cpu {
DotFn dot_kernel_avx2(DType) {
  return nullptr;
}
float dot_f32_avx2(const float*, const float*, int64_t) {
  return 0;
}
void quantize_act_row_avx2(ActFormat, const float*, int64_t, void*) {}
}  // namespace qwenrt::ops::cpu

#endif
