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
#endif

namespace qwenrt::ops::cpu {
namespace {
#define QWENRT_VNNI 1
#include "ops/cpu/quant_dot_x86.inc"
}  // namespace

DotFn dot_kernel_avx512(DType type) {
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
}  // namespace qwenrt::ops::cpu

#endif
