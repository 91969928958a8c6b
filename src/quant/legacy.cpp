// Legacy 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//
// Arithmetic follows ggml's dequantize_row_* and quantize_row_*_ref operation by operation
// (float, not double; the same association), so quantised bytes match ggml's and the gguf
// package's, and dequantised floats match bit for bit. Where a product meets a sum, the product
// is its own statement: a compiler may fuse a*b+c into an FMA within one expression (clang's
// default with FMA hardware), never across statements, and a fused result rounds differently.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwenrt::quant {
namespace {

constexpr int kHalf = kQK32 / 2;

// ggml's `MIN(hi, (int8_t)(v))` / `(uint8_t)(v)` for v that is >= about -1 in valid use:
// truncation toward zero, clamped so that garbage input (inf, NaN) is still defined.
int trunc_clamped(float v, int hi) {
  if (!(v > 0.0f)) return 0;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// The value of largest magnitude (the first one on ties) with its sign: the scale of the
// symmetric formats is chosen so that this element maps to the most negative level.
float signed_absmax(const float* x) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < kQK32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, float& min, float& max) {
  min = x[0];
  max = x[0];
  for (int j = 1; j < kQK32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

// --- Q4_0: x = d * (q - 8) ------------------------------------------------------------------

void dequantize_block(const BlockQ4_0& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < kHalf; ++j) {
    const int lo = (b.qs[j] & 0x0f) - 8;
    const int hi = (b.qs[j] >> 4) - 8;
    y[j] = static_cast<float>(lo) * d;
    y[j + kHalf] = static_cast<float>(hi) * d;
  }
}

void quantize_block(const float* x, BlockQ4_0& b) {
  const float max = signed_absmax(x);
  const float d = max / -8;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  for (int j = 0; j < kHalf; ++j) {
    const float lo_scaled = x[j] * id;
    const float hi_scaled = x[j + kHalf] * id;
    const int lo = trunc_clamped(lo_scaled + 8.5f, 15);
    const int hi = trunc_clamped(hi_scaled + 8.5f, 15);
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// --- Q4_1: x = d * q + m --------------------------------------------------------------------

void dequantize_block(const BlockQ4_1& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const float m = fp16_to_fp32(b.m);
  for (int j = 0; j < kHalf; ++j) {
    const float lo = static_cast<float>(b.qs[j] & 0x0f) * d;
    const float hi = static_cast<float>(b.qs[j] >> 4) * d;
    y[j] = lo + m;
    y[j + kHalf] = hi + m;
  }
}

void quantize_block(const float* x, BlockQ4_1& b) {
  float min, max;
  min_max(x, min, max);
  const float d = (max - min) / 15;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  b.m = fp32_to_fp16(min);
  for (int j = 0; j < kHalf; ++j) {
    const float lo_scaled = (x[j] - min) * id;
    const float hi_scaled = (x[j + kHalf] - min) * id;
    const int lo = trunc_clamped(lo_scaled + 0.5f, 15);
    const int hi = trunc_clamped(hi_scaled + 0.5f, 15);
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// --- Q5_0: x = d * (q - 16), fifth bits in qh -----------------------------------------------

void dequantize_block(const BlockQ5_0& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < kHalf; ++j) {
    const int lo = ((b.qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - 16;
    const int hi = ((b.qs[j] >> 4) | (((qh >> (j + kHalf)) & 1u) << 4)) - 16;
    y[j] = static_cast<float>(lo) * d;
    y[j + kHalf] = static_cast<float>(hi) * d;
  }
}

void quantize_block(const float* x, BlockQ5_0& b) {
  const float max = signed_absmax(x);
  const float d = max / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    const float lo_scaled = x[j] * id;
    const float hi_scaled = x[j + kHalf] * id;
    const int lo = trunc_clamped(lo_scaled + 16.5f, 31);
    const int hi = trunc_clamped(hi_scaled + 16.5f, 31);
    b.qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + kHalf);
  }
  std::memcpy(b.qh, &qh, sizeof qh);
}

// --- Q5_1: x = d * q + m, fifth bits in qh --------------------------------------------------

void dequantize_block(const BlockQ5_1& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const float m = fp16_to_fp32(b.m);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < kHalf; ++j) {
    const int lo = (b.qs[j] & 0x0f) | (((qh >> j) & 1u) << 4);
    const int hi = (b.qs[j] >> 4) | (((qh >> (j + kHalf)) & 1u) << 4);
    const float lo_scaled = static_cast<float>(lo) * d;
    const float hi_scaled = static_cast<float>(hi) * d;
    y[j] = lo_scaled + m;
    y[j + kHalf] = hi_scaled + m;
  }
}

void quantize_block(const float* x, BlockQ5_1& b) {
  float min, max;
  min_max(x, min, max);
  const float d = (max - min) / 31;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  b.m = fp32_to_fp16(min);
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    // ggml has no MIN(31, ...) here: (x - min) * id <= 31 up to rounding, so + 0.5 stays < 32.
    const float lo_scaled = (x[j] - min) * id;
    const float hi_scaled = (x[j + kHalf] - min) * id;
    const int lo = trunc_clamped(lo_scaled + 0.5f, 31);
    const int hi = trunc_clamped(hi_scaled + 0.5f, 31);
    b.qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + kHalf);
  }
  std::memcpy(b.qh, &qh, sizeof qh);
}

// --- Q8_0: x = d * q ------------------------------------------------------------------------

void dequantize_block(const BlockQ8_0& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < kQK32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void quantize_block(const float* x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK32; ++j) {
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]);
  }
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = fp32_to_fp16(d);
  for (int j = 0; j < kQK32; ++j) {
    // roundf: half away from zero. |x * id| <= 127 up to rounding; the clamp only guards
    // against non-finite input.
    const float q = std::round(x[j] * id);
    const int level = q >= 127.0f ? 127 : q <= -127.0f ? -127 : q == q ? static_cast<int>(q) : 0;
    b.qs[j] = static_cast<int8_t>(level);
  }
}

}  // namespace qwenrt::quant
