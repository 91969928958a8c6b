// The int8 tensor-core building blocks of the quantised-weight kernels: mma.sync wrappers, the
// lane's activation fragments, and per weight type the load of one 256-element superblock of two
// rows and its decode into mma fragments applied against NT n-tiles of 8 activation rows.
// gemv_mma.cu (3..32 rows against a matrix) and moe_mmq.cu (grouped experts) use them; the
// layout of the fragments and the k permutation are described at the top of gemv_mma.cu.
// Activations are read through an ActLane, from global or shared memory alike.
#pragma once

#include <cstdint>

#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm::mmaq {

constexpr int kSuperElems = 256;  // elements per superblock (every type here)

// c = a (16 x 32, s8) b (32 x 8, s8), from zero.
__device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
// c = a (16 x 16, s8) b (16 x 8, s8), from zero.
__device__ __forceinline__ void mma_k16(int (&c)[4], const uint32_t (&a)[2], uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%7,%7,%7,%7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b0), "r"(0));
}

// The activations a lane reads. The caller pads them to whole 8-row tiles with zero rows, so
// n-tile nt's fragment row 8 nt + g and output columns 8 nt + 2t (+1) always exist.
struct ActLane {
  const int8_t* q;  // row g's int8 values; n-tile nt at + nt * q_step
  const float* d;   // column 2t's block scales; column 2t + 1 at + nb, n-tile nt at + nt * 8 nb
  const float* s;   // the same for the block sums (xd sum(q))
  int64_t q_step, nb;
};
__device__ __forceinline__ ActLane act_lane(const Acts& a, int g, int t) {
  const int64_t nb = a.in / qb::kActBlock;
  return {a.q + g * a.in, a.d + 2 * t * nb, a.s + 2 * t * nb, 8 * a.in, nb};
}
// Eight consecutive block values (32-byte aligned: a row's blocks are whole superblocks).
__device__ __forceinline__ void load8f(const float* p, float (&v)[8]) {
  const float4 lo = *reinterpret_cast<const float4*>(p);
  const float4 hi = *reinterpret_cast<const float4*>(p + 4);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z,
  v[7] = hi.w;
}

// acc[0..3] (rows g, g, g+8, g+8 x columns c0, c1, c0, c1) += the block's int32 dots c scaled:
// ws_r * xd_c * c - mm_r * xs_c.
__device__ __forceinline__ void scale_add(float (&acc)[4], const int (&c)[4], float ws0, float ws1,
                                          float xd0, float xd1) {
  acc[0] += float(c[0]) * (ws0 * xd0);
  acc[1] += float(c[1]) * (ws0 * xd1);
  acc[2] += float(c[2]) * (ws1 * xd0);
  acc[3] += float(c[3]) * (ws1 * xd1);
}
__device__ __forceinline__ void min_add(float (&acc)[4], float mm0, float mm1, float xs0,
                                        float xs1) {
  acc[0] -= mm0 * xs0;
  acc[1] -= mm0 * xs1;
  acc[2] -= mm1 * xs0;
  acc[3] -= mm1 * xs1;
}

// One superblock of the lane's two rows (g, g + 8) decoded into mma fragments: eight k32 steps
// (one per 32-element block, with the rows' scales ws and, for Q4_K / Q5_K, mins mm), or sixteen
// k16 steps for Q6_K (step i: block i / 2, half i % 2).
struct FragK32 {
  uint32_t a[8][4];
  float ws0[8], ws1[8], mm0[8], mm1[8];
};
struct FragK16 {
  uint32_t a[16][2];
  float ws0[16], ws1[16];
};

// N-tile nt's activation block scales over superblock sb: columns 2t (xd0) and 2t + 1 (xd1);
// returns their offset in a row's scales.
__device__ __forceinline__ int64_t tile_scales(const ActLane& al, int nt, int64_t sb,
                                               float (&xd0)[8], float (&xd1)[8]) {
  const int64_t ds = nt * 8 * al.nb + sb * 8;
  load8f(al.d + ds, xd0);
  load8f(al.d + ds + al.nb, xd1);
  return ds;
}

// The fragments against every n-tile: acc[nt] += the superblock sb's dot products.
template <int NT, bool MIN>
__device__ __forceinline__ void apply(const FragK32& f, const ActLane& al, int64_t sb, int t,
                                      float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int8_t* q = al.q + nt * al.q_step + sb * 256 + 8 * t;
    float xd0[8], xd1[8];
    const int64_t ds = tile_scales(al, nt, sb, xd0, xd1);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint2 b = qb::load8(reinterpret_cast<const uint8_t*>(q + 32 * j));
      int c[4];
      mma_k32(c, f.a[j], b.x, b.y);
      scale_add(acc[nt], c, f.ws0[j], f.ws1[j], xd0[j], xd1[j]);
    }
    if constexpr (MIN) {
      float xs0[8], xs1[8];
      load8f(al.s + ds, xs0);
      load8f(al.s + ds + al.nb, xs1);
#pragma unroll
      for (int j = 0; j < 8; ++j) min_add(acc[nt], f.mm0[j], f.mm1[j], xs0[j], xs1[j]);
    }
  }
}
template <int NT>
__device__ __forceinline__ void apply(const FragK16& f, const ActLane& al, int64_t sb, int t,
                                      float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int8_t* q = al.q + nt * al.q_step + sb * 256 + 4 * t;
    float xd0[8], xd1[8];
    tile_scales(al, nt, sb, xd0, xd1);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t b = *reinterpret_cast<const uint32_t*>(q + 16 * i);
      int c[4];
      mma_k16(c, f.a[i], b);
      scale_add(acc[nt], c, f.ws0[i], f.ws1[i], xd0[i / 2], xd1[i / 2]);
    }
  }
}

// The activations in the tile order (Acts::tq, td, ts; act_quant.cu): lane (g, t)'s values of a
// superblock are four 16-byte runs 512 bytes apart (blocks 2 jp and 2 jp + 1, elements
// 8t..8t+7 of each), and the scales of activation rows 2t and 2t + 1 are 16 consecutive floats:
// a warp's loads are contiguous, where the row-major form has each load touch 8 rows' cache lines.
struct ActTiles {
  const int8_t* q;
  const int8_t* q16;  // (k16 steps: Q6_K)
  const float* d;
  const float* s;
  int64_t n_sb;  // superblocks a row
  int g, t;
  // The lane's four 16-byte runs of tile `tile` (n-tile nt's superblock sb: nt * n_sb + sb) in
  // one of the orders (q or q16).
  __device__ __forceinline__ void runs(const int8_t* order, int64_t tile, int4 (&v)[4]) const {
    const int8_t* p = order + tile * 2048 + g * 64 + t * 16;
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = *reinterpret_cast<const int4*>(p + 512 * c);
  }
  // Its block scales (or sums: from = s) of activation rows 2t and 2t + 1.
  __device__ __forceinline__ void pair(const float* from, int64_t tile, float (&v0)[8],
                                       float (&v1)[8]) const;
};
__device__ __forceinline__ void ActTiles::pair(const float* from, int64_t tile, float (&v0)[8],
                                               float (&v1)[8]) const {
  load8f(from + tile * 64 + 16 * t, v0);
  load8f(from + tile * 64 + 16 * t + 8, v1);
}
__device__ __forceinline__ ActTiles act_tiles(const Acts& a, int g, int t) {
  return {a.tq, a.tq16, a.td, a.ts, a.in / kSuperElems, g, t};
}

// One superblock's activation fragments for NT n-tiles, loaded once and applied to several weight
// tiles (gemv_mma.cu's blocks of 16 MT rows): the same values apply() above reads per tile.
template <int NT, bool MIN>
struct ActK32 {
  uint2 q[NT][8];
  float xd0[NT][8], xd1[NT][8];
  float xs0[MIN ? NT : 1][8], xs1[MIN ? NT : 1][8];
  __device__ __forceinline__ void load(const ActLane& al, int64_t sb, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int8_t* p = al.q + nt * al.q_step + sb * 256 + 8 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        q[nt][j] = qb::load8(reinterpret_cast<const uint8_t*>(p + 32 * j));
      const int64_t ds = tile_scales(al, nt, sb, xd0[nt], xd1[nt]);
      if constexpr (MIN) {
        load8f(al.s + ds, xs0[nt]);
        load8f(al.s + ds + al.nb, xs1[nt]);
      }
    }
  }
  // The same values from the tile order.
  __device__ __forceinline__ void load(const ActTiles& at, int64_t sb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t tile = nt * at.n_sb + sb;
      int4 v[4];
      at.runs(at.q, tile, v);
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        q[nt][2 * jp] = uint2{uint32_t(v[jp].x), uint32_t(v[jp].y)};
        q[nt][2 * jp + 1] = uint2{uint32_t(v[jp].z), uint32_t(v[jp].w)};
      }
      at.pair(at.d, tile, xd0[nt], xd1[nt]);
      if constexpr (MIN) at.pair(at.s, tile, xs0[nt], xs1[nt]);
    }
  }
};
template <int NT, bool MIN>
__device__ __forceinline__ void apply(const FragK32& f, const ActK32<NT, MIN>& x,
                                      float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int c[4];
      mma_k32(c, f.a[j], x.q[nt][j].x, x.q[nt][j].y);
      scale_add(acc[nt], c, f.ws0[j], f.ws1[j], x.xd0[nt][j], x.xd1[nt][j]);
    }
    if constexpr (MIN) {
#pragma unroll
      for (int j = 0; j < 8; ++j) min_add(acc[nt], f.mm0[j], f.mm1[j], x.xs0[nt][j], x.xs1[nt][j]);
    }
  }
}

// The same for k16 fragments (Q6_K), from the k16 tile order: step i's value at q[nt][i].
template <int NT>
struct ActK16 {
  uint32_t q[NT][16];
  float xd0[NT][8], xd1[NT][8];
  __device__ __forceinline__ void load(const ActTiles& at, int64_t sb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t tile = nt * at.n_sb + sb;
      int4 v[4];
      at.runs(at.q16, tile, v);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        q[nt][4 * c] = uint32_t(v[c].x);
        q[nt][4 * c + 1] = uint32_t(v[c].y);
        q[nt][4 * c + 2] = uint32_t(v[c].z);
        q[nt][4 * c + 3] = uint32_t(v[c].w);
      }
      at.pair(at.d, tile, xd0[nt], xd1[nt]);
    }
  }
};
template <int NT>
__device__ __forceinline__ void apply(const FragK16& f, const ActK16<NT>& x, float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      int c[4];
      mma_k16(c, f.a[i], x.q[nt][i]);
      scale_add(acc[nt], c, f.ws0[i], f.ws1[i], x.xd0[nt][i / 2], x.xd1[nt][i / 2]);
    }
  }
}

// ---- Per type: load one superblock of rows g and g + 8 (r0, r1: its bytes in each), then decode
// it into fragments and apply them (compute) ----

// Q4_K / Q5_K: header (d, dmin, 12 scale bytes), [Q5_K: qh 32], qs 128. Element l of sub-block j
// is nibble j % 2 of qs[32 (j / 2) + l] (+ 16 * bit j of qh[l] for Q5_K).
template <bool Q5>
struct MmaK4 {
  static constexpr int kBytes = Q5 ? 176 : 144;
  static constexpr int kQs = Q5 ? 48 : 16;
  struct Raw {
    int4 h0, h1;
    uint2 q0[4], q1[4], qh0, qh1;
  };
  static __device__ __forceinline__ Raw load(const uint8_t* r0, const uint8_t* r1, int t) {
    Raw r;
    r.h0 = qb::load16(r0);
    r.h1 = qb::load16(r1);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      r.q0[p] = qb::load8(r0 + kQs + 32 * p + 8 * t);
      r.q1[p] = qb::load8(r1 + kQs + 32 * p + 8 * t);
    }
    r.qh0 = r.qh1 = uint2{};
    if constexpr (Q5) {
      r.qh0 = qb::load8(r0 + 16 + 8 * t);
      r.qh1 = qb::load8(r1 + 16 + 8 * t);
    }
    return r;
  }
  static constexpr bool kMin = true;  // the min term (block sums of the activations)
  // decode() + ActK32: several weight tiles per activation load (gemv_mma.cu's two m-tiles).
  static constexpr bool kCached = true;
  static constexpr bool kK32 = true;    // decode() gives k32 fragments
  static constexpr bool kTiles = true;  // reads tile-ordered activations (measured faster)
  template <int NT>
  static __device__ __forceinline__ void compute(const Raw& r, int64_t sb, int t, const ActLane& al,
                                                 float (&acc)[NT][4]) {
    apply<NT, true>(decode(r), al, sb, t, acc);
  }
  static __device__ __forceinline__ FragK32 decode(const Raw& r) {
    const int4 h0 = r.h0, h1 = r.h1;
    const uint2 qh0 = r.qh0, qh1 = r.qh1;
    const float d0 = qb::half_bits_to_float(uint32_t(h0.x) & 0xffff);
    const float dm0 = qb::half_bits_to_float(uint32_t(h0.x) >> 16);
    const float d1 = qb::half_bits_to_float(uint32_t(h1.x) & 0xffff);
    const float dm1 = qb::half_bits_to_float(uint32_t(h1.x) >> 16);
    FragK32 f;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t s0 = qb::k4_scales_pair(h0, p), s1 = qb::k4_scales_pair(h1, p);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * p + h;
        auto lv = [&](uint32_t w, uint32_t qh) {
          uint32_t v = (w >> (4 * h)) & 0x0f0f0f0fu;
          if constexpr (Q5) v |= ((qh >> j) & 0x01010101u) << 4;
          return v;
        };
        f.a[j][0] = lv(r.q0[p].x, qh0.x);
        f.a[j][1] = lv(r.q1[p].x, qh1.x);
        f.a[j][2] = lv(r.q0[p].y, qh0.y);
        f.a[j][3] = lv(r.q1[p].y, qh1.y);
        f.ws0[j] = d0 * float((s0 >> (8 * h)) & 0xff);
        f.ws1[j] = d1 * float((s1 >> (8 * h)) & 0xff);
        f.mm0[j] = dm0 * float((s0 >> (16 + 8 * h)) & 0xff);
        f.mm1[j] = dm1 * float((s1 >> (16 + 8 * h)) & 0xff);
      }
    }
    return f;
  }
};

// Q8_0 in superblocks (qb::Q80S): eight fp16 scales, then eight 32-byte quant arrays.
struct MmaQ80S {
  static constexpr int kBytes = 272;
  struct Raw {
    int4 h0, h1;
    uint2 q0[8], q1[8];
  };
  static __device__ __forceinline__ Raw load(const uint8_t* r0, const uint8_t* r1, int t) {
    Raw r;
    r.h0 = qb::load16(r0);
    r.h1 = qb::load16(r1);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      r.q0[u] = qb::load8(r0 + 16 + 32 * u + 8 * t);
      r.q1[u] = qb::load8(r1 + 16 + 32 * u + 8 * t);
    }
    return r;
  }
  // Two m-tiles measured slower for Q8_0 (5120 x 17408 at 8 rows: 38.9% of the bandwidth against
  // 46.2%, 35B-A3B x8 decode 957.9 against 982.6 tok/s): its weight loads outweigh the activation
  // loads a second tile saves, and the registers cost a block an SM.
  static constexpr bool kCached = false;
  static constexpr bool kK32 = true;
  // Row-major activations: the tile order measured slower for Q8_0 on 5120-wide rows (8 rows
  // 42.8% -> 39.8% of the bandwidth, 16 rows 40.7% -> 36.9%) and the 35B-A3B's batched decode
  // 0.6-1% slower (bench/results/h200-mma-gemv-2026-12-04.md).
  static constexpr bool kTiles = false;
  static constexpr bool kMin = false;
  template <int NT>
  static __device__ __forceinline__ void compute(const Raw& r, int64_t sb, int t, const ActLane& al,
                                                 float (&acc)[NT][4]) {
    apply<NT, false>(decode(r), al, sb, t, acc);
  }
  static __device__ __forceinline__ FragK32 decode(const Raw& r) {
    const int4 h0 = r.h0, h1 = r.h1;
    FragK32 f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      f.a[u][0] = r.q0[u].x;
      f.a[u][1] = r.q1[u].x;
      f.a[u][2] = r.q0[u].y;
      f.a[u][3] = r.q1[u].y;
    }
    const uint32_t hw0[4] = {uint32_t(h0.x), uint32_t(h0.y), uint32_t(h0.z), uint32_t(h0.w)};
    const uint32_t hw1[4] = {uint32_t(h1.x), uint32_t(h1.y), uint32_t(h1.z), uint32_t(h1.w)};
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      f.ws0[u] = qb::half_bits_to_float((hw0[u / 2] >> (16 * (u % 2))) & 0xffff);
      f.ws1[u] = qb::half_bits_to_float((hw1[u / 2] >> (16 * (u % 2))) & 0xffff);
    }
    return f;
  }
};

// Q6_K (210 bytes, 2-byte aligned): ql 128, qh 64, 16 int8 scales, d. Element 128n + 32k + l has
// low bits nibble k / 2 of ql[64n + 32 (k % 2) + l], high bits 2k..2k+1 of qh[32n + l], scale
// sc[8n + 2k + l / 16]; level - 32. One k16 step per 16 elements (n, k, h = l / 16): lane t holds
// l = 16h + 4t..4t+3.
struct MmaQ6K {
  static constexpr int kBytes = 210;
  static constexpr bool kCached = false;  // (k16 steps: one weight tile per activation load)
  static constexpr bool kK32 = false;     // (k16 steps: ActK16)
  static constexpr bool kTiles = true;
  static constexpr bool kMin = false;
  struct Raw {
    uint32_t ql0[8], ql1[8], qh0[4], qh1[4], sc0[4], sc1[4];
    uint16_t d0, d1;
  };
  static __device__ __forceinline__ Raw load(const uint8_t* r0, const uint8_t* r1, int t) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // i = 4n + 2 (k % 2) + h
      const int off = 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t;
      r.ql0[i] = qb::load4_a2(r0 + off);
      r.ql1[i] = qb::load4_a2(r1 + off);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // i = 2n + h
      const int off = 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t;
      r.qh0[i] = qb::load4_a2(r0 + off);
      r.qh1[i] = qb::load4_a2(r1 + off);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.sc0[i] = qb::load4_a2(r0 + 192 + 4 * i);
      r.sc1[i] = qb::load4_a2(r1 + 192 + 4 * i);
    }
    r.d0 = qb::load2(r0 + 208);
    r.d1 = qb::load2(r1 + 208);
    return r;
  }
  template <int NT>
  static __device__ __forceinline__ void compute(const Raw& r, int64_t sb, int t, const ActLane& al,
                                                 float (&acc)[NT][4]) {
    apply<NT>(decode(r), al, sb, t, acc);
  }
  static __device__ __forceinline__ FragK16 decode(const Raw& r) {
    const float d0 = qb::half_bits_to_float(r.d0), d1 = qb::half_bits_to_float(r.d1);
    FragK16 f;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int il = 4 * n + 2 * (k & 1) + h, ih = 2 * n + h, sh = 4 * (k >> 1);
          auto lv = [&](uint32_t ql, uint32_t qh) {
            const uint32_t v = ((ql >> sh) & 0x0f0f0f0fu) | (((qh >> (2 * k)) & 0x03030303u) << 4);
            return __vsub4(v, 0x20202020u);
          };
          const int i = 2 * (4 * n + k) + h;  // step: block 4n + k, half h
          f.a[i][0] = lv(r.ql0[il], r.qh0[ih]);
          f.a[i][1] = lv(r.ql1[il], r.qh1[ih]);
          const int si = 8 * n + 2 * k + h;  // scale index
          f.ws0[i] = d0 * float(int8_t((r.sc0[si / 4] >> (8 * (si % 4))) & 0xff));
          f.ws1[i] = d1 * float(int8_t((r.sc1[si / 4] >> (8 * (si % 4))) & 0xff));
        }
      }
    }
    return f;
  }
};

// Calls f.template operator()<T>() for a weight type with fragments here (q8s: Q8_0 in
// superblocks), or returns false.
template <class F>
bool with_type(DType dtype, bool q8s, F&& f) {
  switch (dtype) {
    case DType::Q4_K:
      f.template operator()<MmaK4<false>>();
      return true;
    case DType::Q5_K:
      f.template operator()<MmaK4<true>>();
      return true;
    case DType::Q6_K:
      f.template operator()<MmaQ6K>();
      return true;
    case DType::Q8_0:
      if (!q8s) return false;
      f.template operator()<MmaQ80S>();
      return true;
    default:
      return false;
  }
}
inline bool has_type(DType t, bool q8s) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || (t == DType::Q8_0 && q8s);
}

}  // namespace qwenrt::ops::cuda::mm::mmaq
