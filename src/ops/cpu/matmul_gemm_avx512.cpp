// Batched matmul on AVX-512 VNNI for Q4_K, Q5_K, Q6_K (against BlockQ8K) and Q8_0, Q4_0
// (against BlockQ8_32): prefill, and MoE experts with several tokens. A panel of 16 weight rows
// is unpacked once per call into int8-ready form and reused for every token, 8 tokens at a time.
//
// Panel layout (PanelBlock, one per 256-value super-block): the codes as unsigned bytes,
// q[g][r] = values 4g..4g+3 of row r (so one zmm holds 4 consecutive values of 16 rows and one
// vpdpbusd against a broadcast 4-byte activation group does 64 MACs); per sub-block integer
// scales sc[s][r]; per-16-value offset coefficients c as int16 pairs (the K-quants' mins, Q6_K's
// -32) that multiply the activation block sums; the two fp32 super-block scales. Then
//   y[r, t] += da_t * (dA[r] * sum_s sc[s][r] * (q . a)_s - dB[r] * sum_p c[p][r] . bsums_t[p]).
// All sums are exact in int32 (|q . a| over a sub-block <= 32 * 63 * 128).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "ops/cpu/matmul_gemm.h"
#include "ops/cpu/quant_dot.h"
#include "ops/cpu/repack.h"
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
// (maybe-)uninitialized once inlined into unrolled loops (a false positive in the header).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace qwenrt::ops::cpu {
namespace {

constexpr int kTileTokens = 8;

struct PanelBlock {
  uint32_t q[64][kPanelRows];  // 4 codes (bytes) per row per group of 4 values
  int32_t sc[16][kPanelRows];  // sub-block scales (8 sub-blocks of 32 or 16 of 16 values)
  int32_t c[8][kPanelRows];    // int16 pairs: offset coefficients of values 32p..32p+31
  float da[kPanelRows];        // scale of the sc terms
  float db[kPanelRows];        // scale of the offset terms
};
static_assert(sizeof(PanelBlock) % 64 == 0);

// One super-block of a panel from 16 rows at once: each gather fetches the same 4 bytes of the
// block from every row (lane r reads base + row_off[r]), which is exactly a zmm of the panel
// layout, so no transposition is needed. (Row-by-row scalar unpacking cost 3x the tile work
// of a 16-token MoE expert.)
inline __m512i gather(const uint8_t* base, __m512i row_off, int offset) {
  return _mm512_i32gather_epi32(_mm512_add_epi32(row_off, _mm512_set1_epi32(offset)), base, 1);
}
inline __m512i bytes_of(__m512i v, int byte) {
  return _mm512_and_si512(_mm512_srli_epi32(v, 8 * byte), _mm512_set1_epi32(0xFF));
}
// Two f16 halves of each dword lane as fp32: the low (hi = false) or high half.
inline __m512 halves_to_f32(__m512i v, bool hi) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hi ? _mm512_srli_epi32(v, 16) : v));
}

// Where the unpacking reads a block of 16 rows from: src.dw(o) is the 4 bytes at byte o of each
// row's block (lane r: row r), src.f16(o) the fp16 at byte o as fp32.
// GGUF rows: gathers, lane r reading base + row_off[r].
struct RowSource {
  const uint8_t* base;
  __m512i off;
  __m512i dw(int o) const { return gather(base, off, o); }
  // The word ending at o + 2 for o > 0 (Q6_K's d is the block's last two bytes).
  __m512 f16(int o) const {
    return o == 0 ? halves_to_f32(gather(base, off, 0), false)
                  : halves_to_f32(gather(base, off, o - 2), true);
  }
};
// A record of the panel layout (repack.h): plain loads.
struct PanelSource {
  const uint8_t* rec;
  PanelFormat f;
  __m512i dw(int o) const { return _mm512_loadu_si512(rec + (o - f.dw_begin) / 4 * 64); }
  __m512 f16(int) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + f.n_dw * 64)));
  }
};

// Q4_K / Q5_K: scales per 32 values (ggml's utmp unpacking, in vectors); offset = dmin * m_j.
template <bool kFifthBit, class Src>
void unpack_q45_k(const Src& src, PanelBlock& p) {
  const __m512i dd = src.dw(0);
  _mm512_store_ps(p.da, halves_to_f32(dd, false));
  _mm512_store_ps(p.db, halves_to_f32(dd, true));
  const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f),
                k3 = _mm512_set1_epi32(0x03030303);
  const __m512i u0 = src.dw(4), u1 = src.dw(8), u2 = src.dw(12);
  const __m512i m47 =
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
  const __m512i m03 = _mm512_and_si512(u1, k1);
  const __m512i s47 =
      _mm512_or_si512(_mm512_and_si512(u2, k2),
                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
  const __m512i s03 = _mm512_and_si512(u0, k1);
  for (int j = 0; j < 8; ++j) {
    _mm512_store_si512(p.sc[j], bytes_of(j < 4 ? s03 : s47, j % 4));
    const __m512i m = bytes_of(j < 4 ? m03 : m47, j % 4);
    _mm512_store_si512(p.c[j], _mm512_or_si512(m, _mm512_slli_epi32(m, 16)));
  }
  const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F), m1 = _mm512_set1_epi32(0x01010101);
  __m512i qh[8];
  if constexpr (kFifthBit)
    for (int g = 0; g < 8; ++g) qh[g] = src.dw(16 + 4 * g);
  const int qs = kFifthBit ? 48 : 16;
  for (int c = 0; c < 4; ++c) {
    for (int g = 0; g < 8; ++g) {
      const __m512i v = src.dw(qs + 32 * c + 4 * g);
      __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
      if constexpr (kFifthBit) {
        lo = _mm512_or_si512(
            lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh[g], 2 * c), m1), 4));
        hi = _mm512_or_si512(
            hi, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh[g], 2 * c + 1), m1), 4));
      }
      _mm512_store_si512(p.q[8 * (2 * c) + g], lo);
      _mm512_store_si512(p.q[8 * (2 * c + 1) + g], hi);
    }
  }
}

// Q6_K: signed scales per 16 values; offset = d * 32 * sc_j.
template <class Src>
void unpack_q6_k(const Src& src, PanelBlock& p) {
  const __m512 d = src.f16(208);
  _mm512_store_ps(p.da, d);
  _mm512_store_ps(p.db, d);
  __m512i sc[16];
  for (int w4 = 0; w4 < 4; ++w4) {
    const __m512i v = src.dw(192 + 4 * w4);
    for (int b = 0; b < 4; ++b)
      sc[4 * w4 + b] = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * b), 24);
  }
  for (int s = 0; s < 16; ++s) _mm512_store_si512(p.sc[s], sc[s]);
  for (int q = 0; q < 8; ++q) {
    const __m512i lo = _mm512_and_si512(_mm512_slli_epi32(sc[2 * q], 5), _mm512_set1_epi32(0xFFFF));
    _mm512_store_si512(p.c[q], _mm512_or_si512(lo, _mm512_slli_epi32(sc[2 * q + 1], 21)));
  }
  const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F), m2 = _mm512_set1_epi32(0x03030303);
  for (int h = 0; h < 2; ++h) {
    for (int lg = 0; lg < 8; ++lg) {
      const __m512i l0 = src.dw(64 * h + 4 * lg);
      const __m512i l1 = src.dw(64 * h + 32 + 4 * lg);
      const __m512i hb = src.dw(128 + 32 * h + 4 * lg);
      const __m512i lows[4] = {_mm512_and_si512(l0, m4), _mm512_and_si512(l1, m4),
                               _mm512_and_si512(_mm512_srli_epi32(l0, 4), m4),
                               _mm512_and_si512(_mm512_srli_epi32(l1, 4), m4)};
      for (int q = 0; q < 4; ++q) {
        const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2 * q), m2), 4);
        _mm512_store_si512(p.q[32 * h + 8 * q + lg], _mm512_or_si512(lows[q], hi));
      }
    }
  }
}

template <class Src>
void unpack_block(DType type, const Src& src, PanelBlock& p) {
  switch (type) {
    case DType::Q4_K:
      return unpack_q45_k<false>(src, p);
    case DType::Q5_K:
      return unpack_q45_k<true>(src, p);
    default:
      return unpack_q6_k(src, p);
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

// Q8_0 / Q4_0: 32-value blocks with one fp16 scale, against BlockQ8_32 activations. The codes
// become unsigned bytes u = q + o (Q8_0: q + 128, a flip of the sign bit; Q4_0: the raw nibble,
// o = 8), so y = d_w * d_a * (u . a - o * sum(a)), the sum coming with the activation block.
struct Panel32 {
  uint32_t q[8][kPanelRows];
  float d[kPanelRows];
};
static_assert(sizeof(Panel32) % 64 == 0);

template <class Src>
void unpack_q8_0(const Src& src, Panel32& p) {
  _mm512_store_ps(p.d, src.f16(0));
  const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
  for (int g = 0; g < 8; ++g) _mm512_store_si512(p.q[g], _mm512_xor_si512(src.dw(2 + 4 * g), flip));
}

template <class Src>
void unpack_q4_0(const Src& src, Panel32& p) {
  _mm512_store_ps(p.d, src.f16(0));
  const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
  for (int g = 0; g < 4; ++g) {
    const __m512i v = src.dw(2 + 4 * g);  // values 4g.. (low), 16 + 4g.. (high)
    _mm512_store_si512(p.q[g], _mm512_and_si512(v, m4));
    _mm512_store_si512(p.q[4 + g], _mm512_and_si512(_mm512_srli_epi32(v, 4), m4));
  }
}

template <int T>
void tile_kernel32(const Panel32* panel, int64_t nb, const uint8_t* act, int64_t act_stride,
                   float* y, int64_t ldy, __mmask16 mask, int code_offset) {
  const BlockQ8_32* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const BlockQ8_32*>(act + t * act_stride);
  __m512 fsum[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) fsum[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Panel32& P = panel[b];
    __m512i acc[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int g = 0; g < 8; ++g) {
      const __m512i wv = _mm512_load_si512(P.q[g]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        int32_t av;
        std::memcpy(&av, a[t][b].qs + 4 * g, 4);
        acc[t] = _mm512_dpbusd_epi32(acc[t], wv, _mm512_set1_epi32(av));
      }
    }
    const __m512 dv = _mm512_load_ps(P.d);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512i v = _mm512_sub_epi32(acc[t], _mm512_set1_epi32(code_offset * a[t][b].sum));
      fsum[t] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(a[t][b].d)), _mm512_cvtepi32_ps(v),
                                fsum[t]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, fsum[t]);
}

void run_tile32(int T, const Panel32* panel, int64_t nb, const uint8_t* act, int64_t stride,
                float* y, int64_t ldy, __mmask16 mask, int o) {
  switch (T) {
    case 8:
      return tile_kernel32<8>(panel, nb, act, stride, y, ldy, mask, o);
    case 7:
      return tile_kernel32<7>(panel, nb, act, stride, y, ldy, mask, o);
    case 6:
      return tile_kernel32<6>(panel, nb, act, stride, y, ldy, mask, o);
    case 5:
      return tile_kernel32<5>(panel, nb, act, stride, y, ldy, mask, o);
    case 4:
      return tile_kernel32<4>(panel, nb, act, stride, y, ldy, mask, o);
    case 3:
      return tile_kernel32<3>(panel, nb, act, stride, y, ldy, mask, o);
    case 2:
      return tile_kernel32<2>(panel, nb, act, stride, y, ldy, mask, o);
    default:
      return tile_kernel32<1>(panel, nb, act, stride, y, ldy, mask, o);
  }
}

// Lane r of the gathers reads row min(r, rows - 1) (rows past the end repeat the last one;
// their results are masked off).
__m512i row_offsets(const TensorView& w, int rows, int32_t* offs) {
  for (int rr = 0; rr < kPanelRows; ++rr)
    offs[rr] = static_cast<int32_t>(std::min(rr, rows - 1) * w.nb[1]);
  return _mm512_loadu_si512(offs);
}

// Prefetch block b + 1 of each of the panel's rows while block b is gathered.
void prefetch_next(const uint8_t* blk, const int32_t* offs, int64_t block_bytes) {
  for (int rr = 0; rr < kPanelRows; ++rr)
    for (int64_t line = 0; line < block_bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(blk + offs[rr] + block_bytes + line), _MM_HINT_T1);
}

void gemm_rows32(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
                 int64_t ldy, ScratchBuffer& tmp) {
  const int64_t nb = w.ne[0] / 32;
  const int64_t block_bytes = traits(w.dtype).block_bytes;
  const bool q8 = w.dtype == DType::Q8_0;
  auto* panel = tmp.get<Panel32>(static_cast<size_t>(nb));
  for (int64_t pr = r0; pr < r1; pr += kPanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - pr));
    alignas(64) int32_t offs[kPanelRows];
    const __m512i off = row_offsets(w, rows, offs);
    const uint8_t* base = w.row(pr);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = base + b * block_bytes;
      if (b + 1 < nb && b % 2 == 0) prefetch_next(blk, offs, 2 * block_bytes);
      const RowSource src{blk, off};
      if (q8) {
        unpack_q8_0(src, panel[b]);
      } else {
        unpack_q4_0(src, panel[b]);
      }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
    for (int64_t t0 = 0; t0 < act.n; t0 += kTileTokens) {
      const int T = static_cast<int>(std::min<int64_t>(kTileTokens, act.n - t0));
      run_tile32(T, panel, nb, act.data + t0 * act.stride, act.stride, y + t0 * ldy + (pr - r0),
                 ldy, mask, q8 ? 128 : 8);
    }
  }
}

// ---- Few tokens on panel-layout Q4_K / Q6_K / Q8_0: decode and multiply in registers ----
// The same sums as unpack + tile_kernel, rounded in the same order (a token's result is the same
// in a batch of any size), without the unpacked panel's round trip through L1:
// each loaded word of 16 rows becomes its int8 codes and meets T <= 4 broadcast activation
// groups at once. Records are read once per pass, prefetched into L2 ahead of use (into L1 they
// would evict the activations).
constexpr int kFusedTokens = 4;
constexpr int64_t kRecordAhead = 8192;

inline void prefetch_record(const uint8_t* rec, int64_t record) {
  for (int64_t line = 0; line < record; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(rec) + kRecordAhead + line, _MM_HINT_T1);
}
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline __m512i load_word(const uint8_t* rec, int w) {
  return _mm512_loadu_si512(rec + 64 * w);
}

template <int T>
void fused_q4_k(const uint8_t* records, int64_t nb, const uint8_t* act, int64_t act_stride,
                float* y, int64_t ldy, __mmask16 mask) {
  constexpr int64_t kRecord = kPanelRows * 144;
  const BlockQ8K* a[T];
  __m512 fsum[T];
  for (int t = 0; t < T; ++t) {
    a[t] = reinterpret_cast<const BlockQ8K*>(act + t * act_stride);
    fsum[t] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
  const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f),
                k3 = _mm512_set1_epi32(0x03030303);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = records + b * kRecord;
    prefetch_record(rec, kRecord);
    const __m512i dd = load_word(rec, 0);
    const __m512i u0 = load_word(rec, 1), u1 = load_word(rec, 2), u2 = load_word(rec, 3);
    const __m512i m47 =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
    const __m512i m03 = _mm512_and_si512(u1, k1);
    const __m512i s47 =
        _mm512_or_si512(_mm512_and_si512(u2, k2),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
    const __m512i s03 = _mm512_and_si512(u0, k1);
    __m512i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512i lo_acc[T], hi_acc[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) lo_acc[t] = hi_acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m512i v = load_word(rec, 4 + 8 * c + g);
        const __m512i lo = _mm512_and_si512(v, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          lo_acc[t] = _mm512_dpbusd_epi32(lo_acc[t], lo, bcast4(a[t][b].qs + 64 * c + 4 * g));
          hi_acc[t] = _mm512_dpbusd_epi32(hi_acc[t], hi, bcast4(a[t][b].qs + 64 * c + 32 + 4 * g));
        }
      }
      const __m512i sc_src = c < 2 ? s03 : s47;
      const __m512i sl = bytes_of(sc_src, (2 * c) % 4), sh = bytes_of(sc_src, (2 * c + 1) % 4);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo_acc[t], sl),
                                                             _mm512_mullo_epi32(hi_acc[t], sh)));
    }
    const __m512 da = halves_to_f32(dd, false), db = halves_to_f32(dd, true);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      __m512i osum = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i m = bytes_of(j < 4 ? m03 : m47, j % 4);
        int32_t bs;
        std::memcpy(&bs, a[t][b].bsums + 2 * j, 4);
        osum = _mm512_dpwssd_epi32(osum, _mm512_or_si512(m, _mm512_slli_epi32(m, 16)),
                                   _mm512_set1_epi32(bs));
      }
      const __m512 dt = _mm512_set1_ps(a[t][b].d);
      fsum[t] = _mm512_fmadd_ps(_mm512_mul_ps(da, dt), _mm512_cvtepi32_ps(isum[t]), fsum[t]);
      fsum[t] = _mm512_fnmadd_ps(_mm512_mul_ps(db, dt), _mm512_cvtepi32_ps(osum), fsum[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, fsum[t]);
}

// Q6_K: group (h, q, lg) holds values 128h + 32q + 4lg .. + 3, sub-block 8h + 2q + lg / 4.
template <int T>
void fused_q6_k(const uint8_t* records, int64_t nb, const uint8_t* act, int64_t act_stride,
                float* y, int64_t ldy, __mmask16 mask) {
  constexpr int64_t kRecord = kPanelRows * 210;
  const BlockQ8K* a[T];
  __m512 fsum[T];
  for (int t = 0; t < T; ++t) {
    a[t] = reinterpret_cast<const BlockQ8K*>(act + t * act_stride);
    fsum[t] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F), m2 = _mm512_set1_epi32(0x03030303);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = records + b * kRecord;
    prefetch_record(rec, kRecord);
    alignas(64) int32_t sc[16][kPanelRows];
    for (int w4 = 0; w4 < 4; ++w4) {
      const __m512i v = load_word(rec, 48 + w4);
      for (int k = 0; k < 4; ++k)
        _mm512_store_si512(sc[4 * w4 + k], _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * k), 24));
    }
    __m512i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m512i acc[4][T];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) acc[q][t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int l = 0; l < 4; ++l) {
          const int lg = 4 * half + l;
          const __m512i l0 = load_word(rec, 16 * h + lg), l1 = load_word(rec, 16 * h + 8 + lg);
          const __m512i hb = load_word(rec, 32 + 8 * h + lg);
          const __m512i lows[4] = {_mm512_and_si512(l0, m4), _mm512_and_si512(l1, m4),
                                   _mm512_and_si512(_mm512_srli_epi32(l0, 4), m4),
                                   _mm512_and_si512(_mm512_srli_epi32(l1, 4), m4)};
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            const __m512i wv = _mm512_or_si512(
                lows[q], _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2 * q), m2), 4));
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t)
              acc[q][t] = _mm512_dpbusd_epi32(acc[q][t], wv,
                                              bcast4(a[t][b].qs + 128 * h + 32 * q + 4 * lg));
          }
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          const __m512i scv = _mm512_load_si512(sc[8 * h + 2 * q + half]);
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t)
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(acc[q][t], scv));
        }
      }
    }
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 52 * 64)));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      // The -32 offset: 32 * sum_s sc_s * bsum_s.
      __m512i osum = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int p = 0; p < 8; ++p) {
        const __m512i lo = _mm512_and_si512(_mm512_slli_epi32(_mm512_load_si512(sc[2 * p]), 5),
                                            _mm512_set1_epi32(0xFFFF));
        const __m512i cv =
            _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_load_si512(sc[2 * p + 1]), 21));
        int32_t bs;
        std::memcpy(&bs, a[t][b].bsums + 2 * p, 4);
        osum = _mm512_dpwssd_epi32(osum, cv, _mm512_set1_epi32(bs));
      }
      // As tile_kernel rounds (so a token's result does not depend on the batch's size).
      const __m512 dt = _mm512_mul_ps(d, _mm512_set1_ps(a[t][b].d));
      fsum[t] = _mm512_fmadd_ps(dt, _mm512_cvtepi32_ps(isum[t]), fsum[t]);
      fsum[t] = _mm512_fnmadd_ps(dt, _mm512_cvtepi32_ps(osum), fsum[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, fsum[t]);
}

// Q8_0: the codes made unsigned (q + 128, a sign-bit flip), the 128 taken off with the block sum.
template <int T>
void fused_q8_0(const uint8_t* records, int64_t nb, const uint8_t* act, int64_t act_stride,
                float* y, int64_t ldy, __mmask16 mask) {
  constexpr int64_t kRecord = kPanelRows * 34;
  const BlockQ8_32* a[T];
  __m512 fsum[T];
  for (int t = 0; t < T; ++t) {
    a[t] = reinterpret_cast<const BlockQ8_32*>(act + t * act_stride);
    fsum[t] = _mm512_setzero_ps();
  }
  const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = records + b * kRecord;
    if (b % 4 == 0) prefetch_record(rec, 4 * kRecord);
    __m512i acc[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i wv = _mm512_xor_si512(load_word(rec, g), flip);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_dpbusd_epi32(acc[t], wv, bcast4(a[t][b].qs + 4 * g));
    }
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 8 * 64)));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m512i v = _mm512_sub_epi32(acc[t], _mm512_set1_epi32(128 * a[t][b].sum));
      fsum[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[t][b].d)), _mm512_cvtepi32_ps(v),
                                fsum[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, fsum[t]);
}

// f(std::integral_constant<int, T>) for a runtime T in 1..kFusedTokens.
template <class F>
void with_tokens(int T, F&& f) {
  switch (T) {
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      return f(std::integral_constant<int, 1>{});
  }
}

// Rows [r0, r1) of a panel-layout weight (repack.h), r0 a multiple of 16. Up to
// kPanelStreamTokens tokens (decode, checks, small expert groups) the fused kernels stream the
// records in passes of 4 tokens; more tokens unpack each panel with plain loads (instead of the
// row layout's gathers) and take it in tiles of 8.
void gemm_panels(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
                 int64_t ldy, ScratchBuffer& tmp) {
  if (r0 % kPanelRows != 0) fail("cpu matmul: panel rows start at {}, not a panel", r0);
  const PanelFormat f = panel_format(w.dtype);
  const auto& tr = traits(w.dtype);
  const int64_t nb = w.ne[0] / tr.block_elems;
  const int64_t record = kPanelRows * tr.block_bytes;
  const bool q8 = w.dtype == DType::Q8_0;
  const bool fused = act.n <= kPanelStreamTokens;
  PanelBlock* panel = fused || q8 ? nullptr : tmp.get<PanelBlock>(static_cast<size_t>(nb));
  Panel32* panel32 = fused || !q8 ? nullptr : tmp.get<Panel32>(static_cast<size_t>(nb));
  for (int64_t pr = r0; pr < r1; pr += kPanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - pr));
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
    const uint8_t* records = static_cast<const uint8_t*>(w.data) + pr * w.nb[1];
    if (fused) {
      for (int64_t t0 = 0; t0 < act.n; t0 += kFusedTokens) {
        const int T = static_cast<int>(std::min<int64_t>(kFusedTokens, act.n - t0));
        const uint8_t* a = act.data + t0 * act.stride;
        float* yt = y + t0 * ldy + (pr - r0);
        with_tokens(T, [&](auto tokens) {
          constexpr int kT = decltype(tokens)::value;
          switch (w.dtype) {
            case DType::Q4_K:
              return fused_q4_k<kT>(records, nb, a, act.stride, yt, ldy, mask);
            case DType::Q6_K:
              return fused_q6_k<kT>(records, nb, a, act.stride, yt, ldy, mask);
            default:
              return fused_q8_0<kT>(records, nb, a, act.stride, yt, ldy, mask);
          }
        });
      }
      continue;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* rec = records + b * record;
      prefetch_record(rec, record);
      if (q8) {
        unpack_q8_0(PanelSource{rec, f}, panel32[b]);
      } else {
        unpack_block(w.dtype, PanelSource{rec, f}, panel[b]);
      }
    }
    for (int64_t t0 = 0; t0 < act.n; t0 += kTileTokens) {
      const int T = static_cast<int>(std::min<int64_t>(kTileTokens, act.n - t0));
      const uint8_t* a = act.data + t0 * act.stride;
      float* yt = y + t0 * ldy + (pr - r0);
      if (q8) {
        run_tile32(T, panel32, nb, a, act.stride, yt, ldy, mask, 128);
      } else if (w.dtype == DType::Q6_K) {
        run_tile<4>(T, panel, nb, a, act.stride, yt, ldy, mask);
      } else {
        run_tile<8>(T, panel, nb, a, act.stride, yt, ldy, mask);
      }
    }
  }
}

}  // namespace

bool gemm_eligible(DType type, int64_t n_tokens, Isa isa) {
  if (isa < Isa::kAvx512 || n_tokens < kGemmMinTokens) return false;
  return type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K || type == DType::Q8_0 ||
         type == DType::Q4_0;
}

void gemm_rows(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
               int64_t ldy, ScratchBuffer& tmp) {
  if (w.layout == Layout::kPanels16) {
    gemm_panels(w, r0, r1, act, y, ldy, tmp);
    return;
  }
  if (w.dtype == DType::Q8_0 || w.dtype == DType::Q4_0) {
    gemm_rows32(w, r0, r1, act, y, ldy, tmp);
    return;
  }
  const int64_t nb = w.ne[0] / 256;
  const int64_t block_bytes = traits(w.dtype).block_bytes;
  auto* panel = tmp.get<PanelBlock>(static_cast<size_t>(nb));
  const bool per16 = w.dtype == DType::Q6_K;
  for (int64_t pr = r0; pr < r1; pr += kPanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - pr));
    alignas(64) int32_t offs[kPanelRows];
    const __m512i off = row_offsets(w, rows, offs);
    const uint8_t* base = w.row(pr);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = base + b * block_bytes;
      // The gathers touch 16 rows' blocks at once: prefetch the next block of each row.
      if (b + 1 < nb) prefetch_next(blk, offs, block_bytes);
      unpack_block(w.dtype, RowSource{blk, off}, panel[b]);
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
