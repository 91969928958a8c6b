// AVX-512 (F/BW/VL/VNNI) dot kernels: quant_dot_x86.inc with vpdpbusd, compiled for that level with
// a target pragma so the rest of the build keeps baseline flags; only called when the CPU has
// AVX-512 VNNI.
#include <cstring>

#include "ops/cpu/quant_dot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// GCC 12 flags the _mm512_undefined_*() pass-through operands inside its own intrinsics (insert,
// convert) as maybe-uninitialized once inlined: a false positive in the header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace qwenrt::ops::cpu {
namespace {
#define QWENRT_VNNI 1
#include "ops/cpu/quant_dot_x86.inc"

// Q6_K at 512 bits: one zmm holds 64 codes (two of the 256-bit kernel's 32-code chunks, whose
// high bits come from the same qh bytes at shifts 0/2 or 4/6), so a block takes about half the
// instructions. The output head (Q6_K, ~420 MB-1 GB per token) is this kernel; at 256 bits one
// Zen 4 core ran it at 16 GB/s, below the 21 GB/s the memory gives.
float dot_q6_k_512(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8K*>(act);
  const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(3);
  // Lane k (8 int16 each) of the scale vector for chunk c of a half takes scale 4c + k.
  alignas(64) int16_t idx[2][32];
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 32; ++i) idx[c][i] = static_cast<int16_t>(4 * c + i / 8);
  const __m512i idx0 = _mm512_load_si512(idx[0]), idx1 = _mm512_load_si512(idx[1]);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, w += 210, ++a) {
    prefetch_ahead<210>(w);
    const float d = a->d * f16_at(w + 208);
    const __m256i sc16 = _mm256_cvtepi8_epi16(load128(w + 192));
    // -32 offset through the activation sums, as in the 256-bit kernel.
    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(a->bsums)), 5);
    __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(),
                                    _mm512_inserti64x4(_mm512_setzero_si512(), off, 0));
    const __m512i sc_all = _mm512_inserti64x4(_mm512_castsi256_si512(sc16), sc16, 1);
    for (int half = 0; half < 2; ++half) {
      const __m512i l = _mm512_loadu_si512(w + 64 * half);
      const __m256i hb = load256(w + 128 + 32 * half);
      const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
      const __m512i q01 =
          _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(h, m2), 4));
      const __m512i q23 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 4), m2), 4));
      // Sub-block scales of this half: 8 * half + (0..3) for q01, + (4..7) for q23.
      const __m512i base = _mm512_set1_epi16(static_cast<int16_t>(8 * half));
      const __m512i s01 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, base), sc_all);
      const __m512i s23 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx1, base), sc_all);
      const int8_t* q8 = a->qs + 128 * half;
      const __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8));
      const __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8 + 64));
      sumi = _mm512_add_epi32(
          sumi, _mm512_add_epi32(_mm512_madd_epi16(s01, p01), _mm512_madd_epi16(s23, p23)));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
}  // namespace

DotFn dot_kernel_avx512(DType type) {
  if (type == DType::Q6_K) return dot_q6_k_512;
  return kernel_for(type);
}

float dot_f32_avx512(const float* a, const float* b, int64_t n) {
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

// quantize_act_row's blocks at 512 bits: the same values as the scalar code (max |x| is exact in
// any order, x * (127 / amax) is one rounded product, and vcvtps2dq rounds to nearest even as
// lrintf does in the default mode), 16 values a vector.
namespace {
// 16 values -> int8 codes at q; returns their sum.
inline int32_t quantize16(const float* x, __m512 id, int8_t* q) {
  const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), id));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(v));
  return _mm512_reduce_add_epi32(v);
}
inline float abs_max(const float* x, int n) {
  __m512 m = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  return _mm512_reduce_max_ps(m);
}
}  // namespace

void quantize_act_row_avx512(ActFormat f, const float* x, int64_t in, void* dst) {
  if (f == ActFormat::kQ8K) {
    auto* b = static_cast<BlockQ8K*>(dst);
    for (int64_t i = 0; i < in / 256; ++i, x += 256, ++b) {
      const float amax = abs_max(x, 256);
      const __m512 id = _mm512_set1_ps(amax == 0 ? 0.0f : 127.0f / amax);
      b->d = amax == 0 ? 0.0f : amax / 127.0f;
      for (int j = 0; j < 16; ++j)
        b->bsums[j] = static_cast<int16_t>(quantize16(x + 16 * j, id, b->qs + 16 * j));
    }
  } else {
    auto* b = static_cast<BlockQ8_32*>(dst);
    for (int64_t i = 0; i < in / 32; ++i, x += 32, ++b) {
      const float amax = abs_max(x, 32);
      const __m512 id = _mm512_set1_ps(amax == 0 ? 0.0f : 127.0f / amax);
      b->d = amax == 0 ? 0.0f : amax / 127.0f;
      b->sum = quantize16(x, id, b->qs) + quantize16(x + 16, id, b->qs + 16);
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
DotFn dot_kernel_avx512(DType) {
  return nullptr;
}
float dot_f32_avx512(const float*, const float*, int64_t) {
  return 0;
}
void quantize_act_row_avx512(ActFormat, const float*, int64_t, void*) {}
}  // namespace qwenrt::ops::cpu

#endif
