// IEEE half <-> float and bfloat16 <-> float, bit-level and portable (no F16C).
//
// NaN policy: f16 NaNs keep their payload in both directions, as numpy does (gguf's F16 path is
// numpy's astype), so f16 -> f32 -> f16 is the identity on all 65536 bit patterns. bf16 follows
// ggml_compute_fp32_to_bf16 (and gguf's BF16 quantizer): a NaN is truncated and forced quiet.
#include <bit>
#include <cstdint>

#include "quant/quant.h"

namespace qwenrt::quant {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, or NaN + payload
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;

  if (magnitude > 0x7f800000u) {
    // NaN: keep the top payload bits; if they are all zero, set one so it stays a NaN.
    const uint32_t payload = (magnitude >> 13) & 0x3ffu;
    return static_cast<uint16_t>(sign | 0x7c00u | (payload ? payload : 1u));
  }
  // 65520 is halfway between 65504 (the largest half, odd mantissa) and 65536: ties go to even,
  // which is infinity.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);

  if (magnitude < 0x38800000u) {
    // Below 2^-14: a half subnormal (or zero). Result = round_half_even(|f| * 2^24).
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero (f32 subnormals included)
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
  }

  // Normal: rebias the exponent, then round the 13 dropped mantissa bits half to even. A carry
  // out of the mantissa correctly bumps the exponent (never to infinity, excluded above).
  uint32_t h = (magnitude >> 13) - ((127u - 15u) << 10);
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_fp32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN: truncate, set the quiet bit
  }
  // Round half to even. Cannot overflow: the largest non-NaN pattern is 0xff800000 (-inf).
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

}  // namespace qwenrt::quant
