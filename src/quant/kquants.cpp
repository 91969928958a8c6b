// k-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks).
//
// Dequantisation follows ggml's dequantize_row_*_K; quantisation follows quantize_row_*_K_ref
// (the variant without an importance matrix) and its helpers make_qkx2_quants, make_qx_quants
// and make_q3_quants, with the same float operations in the same order, so our bytes are the
// ones ggml's reference quantiser writes. Products that feed a sum are kept in named floats so no
// compiler can fuse them into an FMA and change the rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwenrt::quant {

int nearest_int(float v) {
  // Adding 1.5 * 2^23 puts the rounded integer in the low mantissa bits (round half to even,
  // the FPU's default mode), exactly as ggml does.
  if (!(std::fabs(v) <= 4194303.0f)) return std::isnan(v) ? 0 : (v > 0 ? 4194303 : -4194303);
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: below this a group is all zero

int clamp_int(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

// --- scale search helpers (ggml-quants.c) ---------------------------------------------------

// Asymmetric fit x ~ scale * L - the_min with L in [0, nmax], weighted least squares over
// nstep + 1 candidate inverse scales (make_qkx2_quants). Returns the scale; the_min >= 0.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    const float wx = w * x[i];
    sum_w += w;
    sum_x += wx;
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
    const float scaled = scale * L[i];
    float diff = scaled + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    const float term = weights[i] * diff;
    best_error += term;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    const float step = rdelta * is;
    iscale = (rmin + step + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float wl = weights[i] * l;
      const float wll = wl * l;
      const float wlx = wl * x[i];
      sum_l += wl;
      sum_l2 += wll;
      sum_xl += wlx;
    }
    const float w_l2 = sum_w * sum_l2;
    const float l_l = sum_l * sum_l;
    const float D = w_l2 - l_l;
    if (D > 0) {
      const float w_xl = sum_w * sum_xl;
      const float x_l = sum_x * sum_l;
      const float l2_x = sum_l2 * sum_x;
      const float l_xl = sum_l * sum_xl;
      float this_scale = (w_xl - x_l) / D;
      float this_min = (l2_x - l_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float scaled = this_scale * Laux[i];
        float diff = scaled + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        const float term = weights[i] * diff;
        cur_error += term;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// The value of largest magnitude in x[0..n), the first of equals; 0 when every |x| is 0 (NaNs are
// passed over).
float max_by_magnitude(int n, const float* x) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  return max;
}

// sum(w x l) and sum(w l^2) of a symmetric fit, with weights w = x^2.
struct X2Sums {
  float sumlx = 0;
  float suml2 = 0;
};

// Signed levels l = clamp(round(iscale * x), -nmax, nmax - 1) into L, and their X2Sums.
X2Sums fit_levels_x2(int n, int nmax, const float* x, float iscale, int8_t* L) {
  X2Sums sums;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    const float wx = w * x[i];
    const float wxl = wx * l;
    const float wl = w * l;
    const float wll = wl * l;
    sums.sumlx += wxl;
    sums.suml2 += wll;
  }
  return sums;
}

// Where both symmetric fits start: signed levels at iscale = -nmax / max, max being the value of
// largest magnitude. nullopt, with every L 0, for a group ggml treats as all zero.
struct SymmetricStart {
  float max;
  X2Sums sums;
};

std::optional<SymmetricStart> start_symmetric_fit(int n, int nmax, const float* x, int8_t* L) {
  const float max = max_by_magnitude(n, x);
  if (std::fabs(max) < kGroupMaxEps) {
    std::fill_n(L, n, int8_t{0});
    return std::nullopt;
  }
  return SymmetricStart{.max = max, .sums = fit_levels_x2(n, nmax, x, -nmax / max, L)};
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2 nmax - 1], weights x^2 (make_qx_quants with
// rmse_type 1 and no importance weights): 18 trial scales around nmax / max. n <= 32.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  const std::optional<SymmetricStart> start = start_symmetric_fit(n, nmax, x, L);
  if (!start) return 0.0f;
  const X2Sums& first = start->sums;
  float scale = first.suml2 != 0 ? first.sumlx / first.suml2 : 0.0f;
  float best = scale * first.sumlx;
  int8_t trial[32];
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float step = 0.1f * is;
    const float iscale = -(nmax + step) / start->max;
    const X2Sums sums = fit_levels_x2(n, nmax, x, iscale, trial);
    const float gain = sums.sumlx * sums.sumlx;
    const float bound = best * sums.suml2;
    if (sums.suml2 > 0 && gain > bound) {
      std::copy_n(trial, n, L);
      scale = sums.sumlx / sums.suml2;
      best = scale * sums.sumlx;
    }
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return scale;
}

// Symmetric 3-bit fit with x^2 weights and up to 5 rounds of per-element level refinement
// (make_q3_quants with do_rmse). L in [0, 2 nmax - 1].
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  const std::optional<SymmetricStart> start = start_symmetric_fit(n, nmax, x, L);
  if (!start) return 0.0f;
  float sumlx = start->sums.sumlx;
  float suml2 = start->sums.suml2;
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float wx = w * x[i];
      float slx = sumlx - wx * L[i];
      if (slx > 0) {
        const float wl = w * L[i];
        float sl2 = suml2 - wl * L[i];
        const float x_sl2 = x[i] * sl2;
        const int new_l = clamp_int(nearest_int(x_sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          const float wx_new = wx * new_l;
          const float w_new = w * new_l;
          const float w_new2 = w_new * new_l;
          slx += wx_new;
          sl2 += w_new2;
          const float slx2 = slx * slx;
          const float sumlx2 = sumlx * sumlx;
          if (sl2 > 0 && slx2 * suml2 > sumlx2 * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Q4_K / Q5_K sub-block j (32 elements): x = scale * q - min, from the block's d and dmin and
// the j-th of the eight 6-bit scale / min pairs packed in q (ggml's get_scale_min_k4).
struct ScaleMin {
  float scale;
  float min;
};

ScaleMin scale_min_k4(int j, const uint8_t* q, float d, float dmin) {
  int sc, m;
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
  return {.scale = d * static_cast<float>(sc), .min = dmin * static_cast<float>(m)};
}

// The inverse of scale_min_k4's unpacking for j = 0..7 in order (j >= 4 ORs into bytes j < 4
// wrote).
void set_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* q) {
  if (j < 4) {
    q[j] = ls;
    q[j + 4] = lm;
  } else {
    q[j + 4] = static_cast<uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
    q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((ls >> 4) << 6));
    q[j] = static_cast<uint8_t>(q[j] | ((lm >> 4) << 6));
  }
}

// Q3_K: sub-block j's signed scale (16 six-bit values, +32 bias, packed in 12 bytes).
int q3k_scale(const uint8_t* scales, int j) {
  const int low = j < 8 ? scales[j] & 0x0f : scales[j - 8] >> 4;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Packs 2-bit levels L[0..255] as Q2_K/Q3_K do: byte 32*g + l holds elements
// 128*g + l + {0, 32, 64, 96} at bit offsets {0, 2, 4, 6}.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                           (L[j + l + 96] << 6));
    }
  }
}

// Q4_K / Q5_K share everything but the level count: sub-block scales/mins by make_qkx2_quants,
// quantised to 6 bits against the largest, then every element re-quantised with the stored
// (rounded) scales. Returns levels in L; writes d, dmin and scales.
void quantize_scales_mins_k(const float* x, int nmax, float rmin, int nstep, uint8_t* L,
                            uint16_t& d_out, uint16_t& dmin_out, uint8_t* scales_out) {
  uint8_t Laux[32];
  float weights[32];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  float max_scale = 0;  // as we are deducting the min, scales are always positive
  float max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    const float* xb = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) {
      const float sq = xb[l] * xb[l];
      sum_x2 += sq;
    }
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xb[l]);
    scales[j] = make_qkx2_quants(32, nmax, xb, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                 nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQK_K / 32; ++j) {
    // ggml stores nearest_int into a uint8_t before MIN(63, .); the value is in [0, 63] anyway.
    const auto ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    const auto lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    set_scale_min_k4(j, ls < 63 ? ls : 63, lm < 63 ? lm : 63, scales_out);
  }
  d_out = fp32_to_fp16(max_scale / 63.f);
  dmin_out = fp32_to_fp16(max_min / 63.f);

  const float d = fp16_to_fp32(d_out);
  const float dmin = fp16_to_fp32(dmin_out);
  for (int j = 0; j < kQK_K / 32; ++j) {
    const auto [scale, min] = scale_min_k4(j, scales_out, d, dmin);
    if (scale == 0.0f) continue;  // keep the levels make_qkx2_quants chose
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + min) / scale);
      L[32 * j + ii] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
    }
  }
}

// Q4_K and Q5_K: sub-block j's level of element l is nibble j % 2 of qs[32 * (j / 2) + l], plus
// 16 for bit j of qh[l] in Q5_K.
template <class Block>
void dequantize_k4(const Block& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const float dmin = fp16_to_fp32(b.dmin);
  for (int j = 0; j < kQK_K / 32; ++j) {
    const auto [scale, min] = scale_min_k4(j, b.scales, d, dmin);
    const uint8_t* q = b.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      int level = (q[l] >> shift) & 0x0f;
      if constexpr (std::is_same_v<Block, BlockQ5_K>) level += ((b.qh[l] >> j) & 1) << 4;
      const float scaled = scale * static_cast<float>(level);
      *y++ = scaled - min;
    }
  }
}

}  // namespace

// --- Q2_K: x = d * scale_j * q - dmin * min_j, q in 0..3 -------------------------------------

void dequantize_block(const BlockQ2_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const float dmin = fp16_to_fp32(b.dmin);
  for (int n = 0; n < kQK_K; n += 128) {
    const uint8_t* q = b.qs + n / 4;
    for (int j = 0; j < 4; ++j) {
      const int shift = 2 * j;
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = b.scales[n / 16 + 2 * j + half];
        const float dl = d * static_cast<float>(sc & 0x0f);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          const float scaled = dl * static_cast<float>((q[16 * half + l] >> shift) & 3);
          *y++ = scaled - ml;
        }
      }
    }
  }
}

void quantize_block(const float* x, BlockQ2_K& b) {
  uint8_t L[kQK_K];
  uint8_t Laux[16];
  float weights[16];
  float mins[kQK_K / 16];
  float scales[kQK_K / 16];
  const float q4scale = 15.f;

  float max_scale = 0;  // as we are deducting the min, scales are always positive
  float max_min = 0;
  for (int j = 0; j < kQK_K / 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                 0.1f, 15, true);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  if (max_scale > 0) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
    }
    b.d = fp32_to_fp16(max_scale / q4scale);
  } else {
    for (int j = 0; j < kQK_K / 16; ++j) b.scales[j] = 0;
    b.d = fp32_to_fp16(0.f);
  }
  if (max_min > 0) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const int l = nearest_int(iscale * mins[j]);
      b.scales[j] = static_cast<uint8_t>(b.scales[j] | (l << 4));
    }
    b.dmin = fp32_to_fp16(max_min / q4scale);
  } else {
    b.dmin = fp32_to_fp16(0.f);
  }
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j] & 0x0f);
    if (d == 0.0f) continue;
    const float dm = fp16_to_fp32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int((x[16 * j + ii] + dm) / d);
      L[16 * j + ii] = static_cast<uint8_t>(clamp_int(l, 0, 3));
    }
  }
  pack_2bit(L, b.qs);
}

// --- Q3_K: x = d * scale_j * (q - 4 * !hbit), q in 0..3 --------------------------------------

void dequantize_block(const BlockQ3_K& b, float* y) {
  const float d_all = fp16_to_fp32(b.d);
  for (int n = 0; n < kQK_K; n += 128) {
    const uint8_t* q = b.qs + n / 4;
    for (int j = 0; j < 4; ++j) {
      const int shift = 2 * j;
      const auto hbit = static_cast<uint8_t>(1u << (n / 32 + j));
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(q3k_scale(b.scales, n / 16 + 2 * j + half));
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const int level = ((q[l] >> shift) & 3) - ((b.hmask[l] & hbit) ? 0 : 4);
          *y++ = dl * static_cast<float>(level);
        }
      }
    }
  }
}

void quantize_block(const float* x, BlockQ3_K& b) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];

  for (int j = 0; j < kQK_K / 16; ++j) scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
  const float max_scale = max_by_magnitude(kQK_K / 16, scales);

  std::memset(b.scales, 0, sizeof b.scales);
  if (max_scale != 0.0f) {
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      // ggml truncates nearest_int to int8_t first; |iscale * scale| <= 32, so no change.
      const int l = clamp_int(static_cast<int8_t>(nearest_int(iscale * scales[j])), -32, 31) + 32;
      if (j < 8) {
        b.scales[j] = static_cast<uint8_t>(l & 0x0f);
      } else {
        b.scales[j - 8] = static_cast<uint8_t>(b.scales[j - 8] | ((l & 0x0f) << 4));
      }
      b.scales[j % 4 + 8] = static_cast<uint8_t>(b.scales[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
    }
    b.d = fp32_to_fp16(1 / iscale);
  } else {
    b.d = fp32_to_fp16(0.f);
  }

  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = fp16_to_fp32(b.d) * static_cast<float>(q3k_scale(b.scales, j));
    if (d == 0.0f) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(clamp_int(l, -4, 3) + 4);
    }
  }

  // The high bit of element j goes to hmask[j % 32], bit j / 32.
  std::memset(b.hmask, 0, sizeof b.hmask);
  uint8_t low[kQK_K];
  for (int j = 0; j < kQK_K; ++j) {
    int level = L[j];
    if (level > 3) {
      b.hmask[j % 32] = static_cast<uint8_t>(b.hmask[j % 32] | (1u << (j / 32)));
      level -= 4;
    }
    low[j] = static_cast<uint8_t>(level);
  }
  pack_2bit(low, b.qs);
}

// --- Q4_K: x = d * scale_j * q - dmin * min_j, q in 0..15 ------------------------------------

void dequantize_block(const BlockQ4_K& b, float* y) {
  dequantize_k4(b, y);
}

void quantize_block(const float* x, BlockQ4_K& b) {
  uint8_t L[kQK_K];
  quantize_scales_mins_k(x, 15, -1.f, 20, L, b.d, b.dmin, b.scales);
  for (int p = 0; p < kQK_K / 64; ++p) {
    for (int l = 0; l < 32; ++l) {
      b.qs[32 * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + l + 32] << 4));
    }
  }
}

// --- Q5_K: as Q4_K with a fifth bit per element in qh ----------------------------------------

void dequantize_block(const BlockQ5_K& b, float* y) {
  dequantize_k4(b, y);
}

void quantize_block(const float* x, BlockQ5_K& b) {
  uint8_t L[kQK_K];
  quantize_scales_mins_k(x, 31, -0.5f, 15, L, b.d, b.dmin, b.scales);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int p = 0; p < kQK_K / 64; ++p) {
    for (int l = 0; l < 32; ++l) {
      int lo = L[64 * p + l];
      int hi = L[64 * p + l + 32];
      if (lo > 15) {
        lo -= 16;
        b.qh[l] = static_cast<uint8_t>(b.qh[l] | (1u << (2 * p)));
      }
      if (hi > 15) {
        hi -= 16;
        b.qh[l] = static_cast<uint8_t>(b.qh[l] | (1u << (2 * p + 1)));
      }
      b.qs[32 * p + l] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// --- Q6_K: x = d * scale_j * (q - 32), q in 0..63 --------------------------------------------

void dequantize_block(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int n = 0; n < kQK_K / 128; ++n) {
    const uint8_t* ql = b.ql + 64 * n;
    const uint8_t* qh = b.qh + 32 * n;
    const int8_t* sc = b.scales + 8 * n;
    float* yn = y + 128 * n;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      // Quarter k of this half: low nibble of ql[l] / ql[l + 32], then the high nibbles.
      const int q[4] = {
          ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32,
          ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32,
          ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32,
          ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32,
      };
      for (int k = 0; k < 4; ++k) {
        const float dl = d * static_cast<float>(sc[is + 2 * k]);
        yn[l + 32 * k] = dl * static_cast<float>(q[k]);
      }
    }
  }
}

void quantize_block(const float* x, BlockQ6_K& b) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];

  for (int j = 0; j < kQK_K / 16; ++j) scales[j] = make_qx_quants(16, 32, x + 16 * j, L + 16 * j);
  const float max_scale = max_by_magnitude(kQK_K / 16, scales);
  if (std::fabs(max_scale) < kGroupMaxEps) {
    std::memset(&b, 0, sizeof b);  // d = 0: every element decodes to 0
    return;
  }

  const float iscale = -128.f / max_scale;
  b.d = fp32_to_fp16(1 / iscale);
  for (int ib = 0; ib < kQK_K / 16; ++ib) {
    const int l = nearest_int(iscale * scales[ib]);
    b.scales[ib] = static_cast<int8_t>(l < 127 ? l : 127);
  }

  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j]);
    if (d == 0.0f) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(clamp_int(l, -32, 31) + 32);
    }
  }

  for (int n = 0; n < kQK_K / 128; ++n) {
    const int8_t* Ln = L + 128 * n;
    uint8_t* ql = b.ql + 64 * n;
    uint8_t* qh = b.qh + 32 * n;
    for (int l = 0; l < 32; ++l) {
      const int q1 = Ln[l + 0], q2 = Ln[l + 32], q3 = Ln[l + 64], q4 = Ln[l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
      qh[l] =
          static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
}

}  // namespace qwenrt::quant
