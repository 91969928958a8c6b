// Non-linear 4-bit formats: IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks of
// eight 32-element sub-blocks with 6-bit scales). A nibble indexes kIQ4NLValues.
//
// Dequantisation follows ggml's dequantize_row_iq4_nl / _xs; quantisation follows
// quantize_iq4_nl / quantize_iq4_xs without an importance matrix (both go through
// quantize_row_iq4_nl_impl with x^2 weights and ntry = 7), with ggml's float operation order.
// Two details follow current llama.cpp rather than older ggml: best_index compares midpoints
// exactly (2x >= a + b), and an all-zero group's levels are reset to 0 (older ggml left stale
// levels there; they decode to +-0 either way since the scale is 0).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwenrt::quant {
namespace {

// ggml's kvalues_iq4nl: a sorted, roughly Gaussian-spaced grid.
constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};
constexpr float kGroupMaxEps = 1e-15f;

// Index of the grid value nearest to x (ties go up): binary search on midpoints, compared at
// twice the scale so both sides are exact (ggml's best_index_int8).
int best_index(float x) {
  const float x2 = x + x;
  int idx = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = idx + step;
    if (x2 >= static_cast<float>(kIQ4NLValues[j - 1] + kIQ4NLValues[j])) idx = j;
  }
  return idx;
}

// Weighted least-squares scale for one 32-element group (the per-group part of
// quantize_row_iq4_nl_impl). ntry <= 0: one pass at max / values[0]; ntry > 0: also tries
// 2 * ntry + 1 nearby inverse scales. Writes the levels of the first pass to L.
float fit_group(const float* xb, const float* weight, int ntry, uint8_t* L) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, 32);
    return 0.0f;
  }
  const float values0 = kIQ4NLValues[0];
  float d = ntry > 0 ? -max / values0 : max / values0;
  float id = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int j = 0; j < 32; ++j) {
    const float al = id * xb[j];
    const int l = best_index(al);
    L[j] = static_cast<uint8_t>(l);
    const float q = kIQ4NLValues[l];
    const float wq = weight[j] * q;
    const float wqx = wq * xb[j];
    const float wqq = wq * q;
    sumqx += wqx;
    sumq2 += wqq;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int itry = -ntry; itry <= ntry; ++itry) {
    id = static_cast<float>(itry + kIQ4NLValues[0]) / max;
    sumqx = sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float al = id * xb[j];
      const float q = kIQ4NLValues[best_index(al)];
      const float wq = weight[j] * q;
      const float wqx = wq * xb[j];
      const float wqq = wq * q;
      sumqx += wqx;
      sumq2 += wqq;
    }
    const float gain = sumqx * sumqx;
    const float bound = best * sumq2;
    if (sumq2 > 0 && gain > bound) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// Packs 32 levels as IQ4_NL does: element j < 16 in the low nibble of qs[j], j + 16 in the high.
void pack_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
}

void dequantize_nibbles(float dl, const uint8_t* qs, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * static_cast<float>(kIQ4NLValues[qs[j] & 0x0f]);
    y[j + 16] = dl * static_cast<float>(kIQ4NLValues[qs[j] >> 4]);
  }
}

}  // namespace

void dequantize_block(const BlockIQ4_NL& b, float* y) {
  dequantize_nibbles(fp16_to_fp32(b.d), b.qs, y);
}

void quantize_block(const float* x, BlockIQ4_NL& b) {
  float weight[32];
  for (int j = 0; j < 32; ++j) weight[j] = x[j] * x[j];
  uint8_t L[32];
  // ntry = 7 and re-chosen levels: what ggml_quantize_chunk (llama-quantize without an
  // importance matrix) writes. ggml's quantize_row_iq4_nl_ref differs (ntry = -1, first-pass
  // levels); every other type has one path, so "same bytes as ggml_quantize_chunk" holds for all.
  const float d = fit_group(x, weight, 7, L);
  b.d = fp32_to_fp16(d);
  const float id = d != 0.0f ? 1 / d : 0.0f;
  for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(best_index(id * x[j]));
  pack_nibbles(L, b.qs);
}

void dequantize_block(const BlockIQ4_XS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < kQK_K / 32; ++ib) {
    const int ls =
        ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((b.scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    dequantize_nibbles(dl, b.qs + 16 * ib, y + 32 * ib);
  }
}

void quantize_block(const float* x, BlockIQ4_XS& b) {
  constexpr int kGroups = kQK_K / 32;
  uint8_t L[kQK_K];
  float scales[kGroups];
  float weight[32];

  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < kGroups; ++ib) {
    const float* xb = x + 32 * ib;
    for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    scales[ib] = fit_group(xb, weight, 7, L + 32 * ib);
    const float abs_d = std::fabs(scales[ib]);
    if (abs_d > amax_scale) {
      amax_scale = abs_d;
      max_scale = scales[ib];
    }
  }

  // Sub-block scales become 6-bit multiples of d = -max_scale / 32; levels are then re-chosen
  // against the rounded scale.
  const float d = -max_scale / 32;
  b.d = fp32_to_fp16(d);
  b.scales_h = 0;
  const float id = d != 0.0f ? 1 / d : 0.f;
  for (int ib = 0; ib < kGroups; ++ib) {
    int l = nearest_int(id * scales[ib]);
    l = l < -32 ? -32 : l > 31 ? 31 : l;
    const float dl = d * static_cast<float>(l);
    const float idl = dl != 0.0f ? 1 / dl : 0.f;
    const float* xb = x + 32 * ib;
    for (int j = 0; j < 32; ++j) L[32 * ib + j] = static_cast<uint8_t>(best_index(idl * xb[j]));
    l += 32;
    const auto l_low = static_cast<uint8_t>(l & 0x0f);
    if (ib % 2 == 0) {
      b.scales_l[ib / 2] = l_low;
    } else {
      b.scales_l[ib / 2] = static_cast<uint8_t>(b.scales_l[ib / 2] | (l_low << 4));
    }
    b.scales_h = static_cast<uint16_t>(b.scales_h | ((l >> 4) << (2 * ib)));
  }
  for (int ib = 0; ib < kGroups; ++ib) pack_nibbles(L + 32 * ib, b.qs + 16 * ib);
}

}  // namespace qwenrt::quant
