// Batched matmul for K-quant weights on AVX-512 VNNI (prefill, and MoE experts with several
// tokens): a panel of 16 weight rows is unpacked once per call into int8-ready form and reused
// for every token, 8 tokens at a time.
//
// Panel layout (PanelBlock, one per 256-value super-block): the codes as unsigned bytes,
// q[g][r] = values 4g..4g+3 of row r (so one zmm holds 4 consecutive values of 16 rows and one
// vpdpbusd against a broadcast 4-byte activation group does 64 MACs); per sub-block integer
// scales sc[s][r]; per-16-value offset coefficients c as int16 pairs (the K-quants' mins, Q6_K's
// -32) that multiply the activation block sums; the two fp32 super-block scales. Then
//   y[r, t] += da_t * (dA[r] * sum_s sc[s][r] * (q . a)_s - dB[r] * sum_p c[p][r] . bsums_t[p]).
// All sums are exact in int32 (|q . a| over a sub-block <= 32 * 63 * 128).
#include <cstring>

#include "ops/cpu/matmul_gemm.h"
#include "ops/cpu/quant_dot.h"
#include "quant/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// GCC 12 reports the _mm512_undefined_ps() pass-through inside _mm512_cvtepi32_ps as
// maybe-uninitialized once the tile arrays are unrolled (a false positive in the header).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace qwenrt::ops::cpu {
namespace {

constexpr int kPanelRows = 16;
constexpr int kTileTokens = 8;

struct PanelBlock {
  uint32_t q[64][kPanelRows];  // 4 codes (bytes) per row per group of 4 values
  int32_t sc[16][kPanelRows];  // sub-block scales (8 sub-blocks of 32 or 16 of 16 values)
  int32_t c[8][kPanelRows];    // int16 pairs: offset coefficients of values 32p..32p+31
  float da[kPanelRows];        // scale of the sc terms
  float db[kPanelRows];        // scale of the offset terms
};
static_assert(sizeof(PanelBlock) % 64 == 0);

uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
int32_t pair16(int a, int b) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(b)) << 16));
}

// Row r of a panel from one Q4_K / Q5_K block (scales per 32 values; offset = dmin * m_j).
template <bool kFifthBit>
void unpack_q45_k(const uint8_t* blk, int r, PanelBlock& p) {
  p.da[r] = f16_at(blk);
  p.db[r] = f16_at(blk + 2);
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + (kFifthBit ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, blk + 4, sc, m);
    p.sc[j][r] = sc;
    p.c[j][r] = pair16(m, m);
    for (int g = 0; g < 8; ++g) {
      uint32_t v = (load32(qs + 32 * (j / 2) + 4 * g) >> (4 * (j % 2))) & 0x0F0F0F0Fu;
      if constexpr (kFifthBit) v |= ((load32(qh + 4 * g) >> j) & 0x01010101u) << 4;
      p.q[8 * j + g][r] = v;
    }
  }
}

// Row r from one Q6_K block (scales per 16 values; offset = d * 32 * sc_j).
void unpack_q6_k(const uint8_t* blk, int r, PanelBlock& p) {
  const float d = f16_at(blk + 208);
  p.da[r] = d;
  p.db[r] = d;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  for (int s = 0; s < 16; ++s) p.sc[s][r] = sc[s];
  for (int q = 0; q < 8; ++q) p.c[q][r] = pair16(32 * sc[2 * q], 32 * sc[2 * q + 1]);
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  for (int g = 0; g < 64; ++g) {
    const int k = 4 * g, h = k / 128, quarter = (k % 128) / 32, l = k % 32;
    const uint32_t lo =
        (load32(ql + 64 * h + 32 * (quarter & 1) + l) >> (4 * (quarter >> 1))) & 0x0F0F0F0Fu;
    const uint32_t hi = ((load32(qh + 32 * h + l) >> (2 * quarter)) & 0x03030303u) << 4;
    p.q[g][r] = lo | hi;
  }
}

// Every loop below is fully unrolled (the pragmas), so the T x 3 accumulators live in zmm
// registers rather than on the stack, whatever the -O level.
// y[t * ldy + r] for r < 16 (masked) and t < T from a panel of nb super-blocks and T activation
// rows starting at `act`.
template <int T, int kSubGroups>
void tile_kernel(const PanelBlock* panel, int64_t nb, const uint8_t* act, int64_t act_stride,
                 float* y, int64_t ldy, __mmask16 mask) {
  constexpr int kSubs = 64 / kSubGroups;
  const BlockQ8K* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const BlockQ8K*>(act + t * act_stride);
  __m512 fsum[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) fsum[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock& P = panel[b];
    __m512i isum[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int s = 0; s < kSubs; ++s) {
      __m512i acc[T];
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
      for (int gg = 0; gg < kSubGroups; ++gg) {
        const int g = s * kSubGroups + gg;
        const __m512i wv = _mm512_load_si512(P.q[g]);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          int32_t av;
          std::memcpy(&av, a[t][b].qs + 4 * g, 4);
          acc[t] = _mm512_dpbusd_epi32(acc[t], wv, _mm512_set1_epi32(av));
        }
      }
      const __m512i scv = _mm512_load_si512(P.sc[s]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(acc[t], scv));
    }
    __m512i osum[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) osum[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int p = 0; p < 8; ++p) {
      const __m512i cv = _mm512_load_si512(P.c[p]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        int32_t bs;
        std::memcpy(&bs, a[t][b].bsums + 2 * p, 4);
        osum[t] = _mm512_dpwssd_epi32(osum[t], cv, _mm512_set1_epi32(bs));
      }
    }
    const __m512 dav = _mm512_load_ps(P.da), dbv = _mm512_load_ps(P.db);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 dt = _mm512_set1_ps(a[t][b].d);
      fsum[t] = _mm512_fmadd_ps(_mm512_mul_ps(dav, dt), _mm512_cvtepi32_ps(isum[t]), fsum[t]);
      fsum[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dbv, dt), _mm512_cvtepi32_ps(osum[t]), fsum[t]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, fsum[t]);
}

template <int kSubGroups>
void run_tile(int T, const PanelBlock* panel, int64_t nb, const uint8_t* act, int64_t stride,
              float* y, int64_t ldy, __mmask16 mask) {
  switch (T) {
    case 8:
      return tile_kernel<8, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    case 7:
      return tile_kernel<7, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    case 6:
      return tile_kernel<6, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    case 5:
      return tile_kernel<5, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    case 4:
      return tile_kernel<4, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    case 3:
      return tile_kernel<3, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    case 2:
      return tile_kernel<2, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
    default:
      return tile_kernel<1, kSubGroups>(panel, nb, act, stride, y, ldy, mask);
  }
}

}  // namespace

bool gemm_eligible(DType type, int64_t n_tokens, Isa isa) {
  if (isa < Isa::kAvx512 || n_tokens < kGemmMinTokens) return false;
  return type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K;
}

void gemm_rows(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
               int64_t ldy, ScratchBuffer& tmp) {
  const int64_t nb = w.ne[0] / 256;
  const int64_t block_bytes = traits(w.dtype).block_bytes;
  auto* panel = tmp.get<PanelBlock>(static_cast<size_t>(nb));
  const bool per16 = w.dtype == DType::Q6_K;
  for (int64_t pr = r0; pr < r1; pr += kPanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - pr));
    // Rows past the end repeat the last one (their results are masked off).
    for (int rr = 0; rr < kPanelRows; ++rr) {
      const uint8_t* row = w.row(pr + std::min(rr, rows - 1));
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * block_bytes;
        switch (w.dtype) {
          case DType::Q4_K:
            unpack_q45_k<false>(blk, rr, panel[b]);
            break;
          case DType::Q5_K:
            unpack_q45_k<true>(blk, rr, panel[b]);
            break;
          default:
            unpack_q6_k(blk, rr, panel[b]);
            break;
        }
      }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
    for (int64_t t0 = 0; t0 < act.n; t0 += kTileTokens) {
      const int T = static_cast<int>(std::min<int64_t>(kTileTokens, act.n - t0));
      const uint8_t* a = act.data + t0 * act.stride;
      float* yt = y + t0 * ldy + (pr - r0);
      if (per16) {
        run_tile<4>(T, panel, nb, a, act.stride, yt, ldy, mask);
      } else {
        run_tile<8>(T, panel, nb, a, act.stride, yt, ldy, mask);
      }
    }
  }
}

}  // namespace qwenrt::ops::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86-64

namespace qwenrt::ops::cpu {
bool gemm_eligible(DType, int64_t, Isa) {
  return false;
}
void gemm_rows(const TensorView&, int64_t, int64_t, const PreparedAct&, float*, int64_t,
               ScratchBuffer&) {}
}  // namespace qwenrt::ops::cpu

#endif
