// Portable dot kernels: the same integer arithmetic as the SIMD ones (int32 sums of int8 x code
// products per sub-block, scaled once per super-block), written plainly.
#include <cstring>

#include "ops/cpu/quant_dot.h"
#include "quant/quant.h"

namespace qwenrt::ops::cpu {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return quant::fp16_to_fp32(h);
}

// Q4_K: x = d * sc_j * q - dmin * m_j over eight 32-value sub-blocks.
float dot_q4_k(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 144, ++a) {
    const uint8_t* scales = w + 4;
    const uint8_t* qs = w + 16;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      scale_min_k4(j, scales, sc, m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) s += ((q[l] >> shift) & 0xF) * a->qs[32 * j + l];
      isum += sc * s;
      msum += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    sum += a->d * (f16_at(w) * isum - f16_at(w + 2) * msum);
  }
  return sum;
}

// Q5_K: as Q4_K with a fifth bit from qh (bit j of qh[l] for sub-block j).
float dot_q5_k(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 176, ++a) {
    const uint8_t* scales = w + 4;
    const uint8_t* qh = w + 16;
    const uint8_t* qs = w + 48;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      scale_min_k4(j, scales, sc, m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
        s += v * a->qs[32 * j + l];
      }
      isum += sc * s;
      msum += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    sum += a->d * (f16_at(w) * isum - f16_at(w + 2) * msum);
  }
  return sum;
}

// Q6_K: x = d * sc_j * (q - 32) over sixteen 16-value sub-blocks; the -32 is folded in through
// the activation block sums.
float dot_q6_k(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 210, ++a) {
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    int32_t sub[16] = {};
    for (int half = 0; half < 2; ++half) {
      const uint8_t* l4 = ql + 64 * half;
      const uint8_t* h2 = qh + 32 * half;
      const int8_t* aq = a->qs + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int q1 = (l4[l] & 0xF) | (((h2[l] >> 0) & 3) << 4);
        const int q2 = (l4[l + 32] & 0xF) | (((h2[l] >> 2) & 3) << 4);
        const int q3 = (l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4);
        const int q4 = (l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4);
        const int is = 8 * half + l / 16;
        sub[is + 0] += q1 * aq[l];
        sub[is + 2] += q2 * aq[l + 32];
        sub[is + 4] += q3 * aq[l + 64];
        sub[is + 6] += q4 * aq[l + 96];
      }
    }
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) isum += sc[j] * (sub[j] - 32 * a->bsums[j]);
    sum += a->d * f16_at(w + 208) * isum;
  }
  return sum;
}

// IQ4_XS: x = d * (ls_j - 32) * kIQ4Values[code] over eight 32-value sub-blocks.
float dot_iq4_xs(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8K*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 136, ++a) {
    uint16_t scales_h;
    std::memcpy(&scales_h, w + 2, 2);
    const uint8_t* scales_l = w + 4;
    const uint8_t* qs = w + 8;
    int32_t isum = 0;
    for (int j = 0; j < 8; ++j) {
      const int ls =
          ((scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((scales_h >> (2 * j)) & 3) << 4);
      const uint8_t* q = qs + 16 * j;
      const int8_t* aq = a->qs + 32 * j;
      int32_t s = 0;
      for (int l = 0; l < 16; ++l)
        s += kIQ4Values[q[l] & 0xF] * aq[l] + kIQ4Values[q[l] >> 4] * aq[l + 16];
      isum += (ls - 32) * s;
    }
    sum += a->d * f16_at(w) * isum;
  }
  return sum;
}

float dot_q8_0(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8_32*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 34, ++a) {
    const auto* q = reinterpret_cast<const int8_t*>(w + 2);
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += q[l] * a->qs[l];
    sum += f16_at(w) * a->d * s;
  }
  return sum;
}

// Q4_0: x = d * (q - 8); the -8 comes out through the activation block sum.
float dot_q4_0(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8_32*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 18, ++a) {
    const uint8_t* q = w + 2;
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += (q[l] & 0xF) * a->qs[l] + (q[l] >> 4) * a->qs[l + 16];
    sum += f16_at(w) * a->d * (s - 8 * a->sum);
  }
  return sum;
}

// Q5_0: x = d * (q - 16), q = nibble | fifth bit << 4 (bit j of the u32 qh for element j).
float dot_q5_0(int64_t nb, const uint8_t* w, const void* act) {
  const auto* a = static_cast<const BlockQ8_32*>(act);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i, w += 22, ++a) {
    uint32_t qh;
    std::memcpy(&qh, w + 2, 4);
    const uint8_t* q = w + 6;
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) {
      const int lo = (q[l] & 0xF) | ((qh >> l) & 1) << 4;
      const int hi = (q[l] >> 4) | ((qh >> (l + 16)) & 1) << 4;
      s += lo * a->qs[l] + hi * a->qs[l + 16];
    }
    sum += f16_at(w) * a->d * (s - 16 * a->sum);
  }
  return sum;
}

}  // namespace

DotFn dot_kernel_scalar(DType type) {
  switch (type) {
    case DType::Q4_K:
      return dot_q4_k;
    case DType::Q5_K:
      return dot_q5_k;
    case DType::Q6_K:
      return dot_q6_k;
    case DType::IQ4_XS:
      return dot_iq4_xs;
    case DType::Q8_0:
      return dot_q8_0;
    case DType::Q4_0:
      return dot_q4_0;
    case DType::Q5_0:
      return dot_q5_0;
    default:
      return nullptr;
  }
}

}  // namespace qwenrt::ops::cpu
