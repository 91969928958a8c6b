// Device-side decoding of the GGUF weight blocks that have matmul kernels (Q4_K, Q5_K, Q6_K, Q8_0,
// Q4_0, IQ4_XS), as integer dot products against int8-quantised activations. Device code only;
// included by matmul.cu. The block layouts are quant/blocks.h's and the arithmetic is
// quant/'s dequantize_block, reordered into dp4a sums (the definition stays quant/).
//
// Activations (ActQ8): each row of `in` floats becomes `in` int8 values q and in / 32 fp32 scales
// d, x[i] ~ d[i / 32] * q[i] (d = max|x| / 127 over the 32-block). Rows are contiguous: row r's q
// start at r * in, its d at r * in / 32, so every 16-byte run of q used below is 16-byte aligned.
//
// Each type splits a block into `kUnits` units that one thread decodes: a unit is the weight bytes
// of 32 elements (16 for Q8_0), fetched with as few loads as the block's alignment allows, and
// dotted against the matching activation bytes. Consecutive threads take consecutive units, so a
// team's loads of a row are coalesced.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace qwenrt::ops::cuda::qb {

inline constexpr int kActBlock = 32;  // activation elements per fp32 scale

__device__ __forceinline__ float half_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) {
  return __uint_as_float(uint32_t{h} << 16);
}

// Plain (generic-address) loads: the staged GEMV reads blocks from shared memory with the same
// code, so no __ldg (a global-only instruction) here.
__device__ __forceinline__ int4 load16(const uint8_t* p) {  // p 16-byte aligned
  return *reinterpret_cast<const int4*>(p);
}
__device__ __forceinline__ uint2 load8(const uint8_t* p) {  // p 8-byte aligned
  return *reinterpret_cast<const uint2*>(p);
}
__device__ __forceinline__ uint16_t load2(const uint8_t* p) {  // p 2-byte aligned
  return *reinterpret_cast<const unsigned short*>(p);
}
// Four bytes at a 2-byte aligned address (Q6_K, Q8_0 and Q4_0 blocks are only 2-byte aligned).
__device__ __forceinline__ uint32_t load4_a2(const uint8_t* p) {
  return uint32_t{load2(p)} | (uint32_t{load2(p + 2)} << 16);
}

__device__ __forceinline__ int dot4(uint32_t w, int a, int acc) {
  return __dp4a(static_cast<int>(w), a, acc);
}
// Sum of the four int8 lanes of a (the activation sum a min or offset term needs).
__device__ __forceinline__ int sum4(int a, int acc) {
  return __dp4a(0x01010101, a, acc);
}

// The 16 int8 activations at q (16-byte aligned) as four words.
__device__ __forceinline__ int4 act16(const int8_t* q) {
  return *reinterpret_cast<const int4*>(q);
}

// ---- Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales and mins, then the quants --------------
// Byte i of the 12 scale bytes, which sit in words y, z, w of the 16-byte header (no runtime
// indexing into a register array: that would go to local memory).
__device__ __forceinline__ int k4_scale_byte(const int4& hdr, int i) {
  const uint32_t word = static_cast<uint32_t>(i < 4 ? hdr.y : i < 8 ? hdr.z : hdr.w);
  return (word >> (8 * (i & 3))) & 0xff;
}
// Sub-block j's 6-bit scale and min (quant/'s scale_min_k4).
__device__ __forceinline__ void k4_scale_min(const int4& hdr, int j, int& sc, int& m) {
  if (j < 4) {
    sc = k4_scale_byte(hdr, j) & 63;
    m = k4_scale_byte(hdr, j + 4) & 63;
  } else {
    sc = (k4_scale_byte(hdr, j + 4) & 0x0f) | ((k4_scale_byte(hdr, j - 4) >> 6) << 4);
    m = (k4_scale_byte(hdr, j + 4) >> 4) | ((k4_scale_byte(hdr, j) >> 6) << 4);
  }
}

// Sub-blocks 2p and 2p + 1's 6-bit scales and mins as the bytes of one word [sc0, sc1, m0, m1],
// without branches (k4_scale_min's values; p = 0..3 is constant per lane in the resident GEMV, so
// the selectors are computed once). Both sub-blocks sit at byte 2 (p % 2) of their words:
// p < 2: sc = scales[j] & 63 (word y), m = scales[j + 4] & 63 (word z);
// p >= 2, i = j - 4: sc = (w_i & 15) | ((y_i >> 6) << 4), m = (w_i >> 4) | ((z_i >> 6) << 4).
__device__ __forceinline__ uint32_t k4_scales_pair(const int4& hdr, int p) {
  const uint32_t b = 2 * (p & 1);
  const uint32_t sel = b | ((b + 1) << 4) | ((b + 4) << 8) | ((b + 5) << 12);
  const uint32_t y = uint32_t(hdr.y), z = uint32_t(hdr.z), w = uint32_t(hdr.w);
  const uint32_t yz = __byte_perm(y, z, sel);  // [y_b, y_b+1, z_b, z_b+1]
  const uint32_t ww = __byte_perm(w, w >> 4, sel) & 0x0f0f0f0fu;
  return p < 2 ? (yz & 0x3f3f3f3fu) : (ww | ((yz >> 2) & 0x30303030u));
}

// The shared tail of Q4_K and Q5_K: unit u covers elements 16h..16h+15 (h = u % 2) of sub-blocks
// j0 = 2p and j1 = 2p + 1 (p = u / 2); lo / hi hold their levels (0..31) as bytes.
// x = d * sc_j * level - dmin * m_j, so the dot is
// xd_j0 * (d sc0 <lo, a0> - dmin m0 sum(a0)) + the same for j1.
__device__ __forceinline__ float k4_finish(const int4& hdr, int u, const uint32_t (&lo)[4],
                                           const uint32_t (&hi)[4], const int8_t* xq,
                                           const float* xd) {
  const int p = u >> 1, h = u & 1;
  const int j0 = 2 * p, j1 = 2 * p + 1;
  const int4 a0 = act16(xq + 32 * j0 + 16 * h);
  const int4 a1 = act16(xq + 32 * j1 + 16 * h);
  int dot0 = 0, dot1 = 0, sum0 = 0, sum1 = 0;
  dot0 = dot4(lo[0], a0.x, dot0);
  dot0 = dot4(lo[1], a0.y, dot0);
  dot0 = dot4(lo[2], a0.z, dot0);
  dot0 = dot4(lo[3], a0.w, dot0);
  dot1 = dot4(hi[0], a1.x, dot1);
  dot1 = dot4(hi[1], a1.y, dot1);
  dot1 = dot4(hi[2], a1.z, dot1);
  dot1 = dot4(hi[3], a1.w, dot1);
  sum0 = sum4(a0.w, sum4(a0.z, sum4(a0.y, sum4(a0.x, sum0))));
  sum1 = sum4(a1.w, sum4(a1.z, sum4(a1.y, sum4(a1.x, sum1))));
  const uint32_t dd = static_cast<uint32_t>(hdr.x);
  const float d = half_bits_to_float(dd & 0xffff), dmin = half_bits_to_float(dd >> 16);
  int sc0, m0, sc1, m1;
  k4_scale_min(hdr, j0, sc0, m0);
  k4_scale_min(hdr, j1, sc1, m1);
  return xd[j0] * (d * float(sc0 * dot0) - dmin * float(m0 * sum0)) +
         xd[j1] * (d * float(sc1 * dot1) - dmin * float(m1 * sum1));
}

// The resident GEMV's form of k4_finish: the unit's activations in registers (a[k]: the 16
// int8 values of half-block k, xd[k] its scale, xs[k] = xd[k] * sum(a[k]), computed once per
// kernel), so a row costs the eight weight dot products and the scale decode only.
__device__ __forceinline__ float k4_finish_regs(const int4& hdr, int u, const uint32_t (&lo)[4],
                                                const uint32_t (&hi)[4], const int4 (&a)[2],
                                                const float (&xd)[2], const float (&xs)[2]) {
  int dot0 = 0, dot1 = 0;
  dot0 = dot4(lo[0], a[0].x, dot0);
  dot0 = dot4(lo[1], a[0].y, dot0);
  dot0 = dot4(lo[2], a[0].z, dot0);
  dot0 = dot4(lo[3], a[0].w, dot0);
  dot1 = dot4(hi[0], a[1].x, dot1);
  dot1 = dot4(hi[1], a[1].y, dot1);
  dot1 = dot4(hi[2], a[1].z, dot1);
  dot1 = dot4(hi[3], a[1].w, dot1);
  const uint32_t dd = static_cast<uint32_t>(hdr.x);
  const float d = half_bits_to_float(dd & 0xffff), dmin = half_bits_to_float(dd >> 16);
  const uint32_t s = k4_scales_pair(hdr, u >> 1);
  const int sc0 = s & 0xff, sc1 = (s >> 8) & 0xff, m0 = (s >> 16) & 0xff, m1 = s >> 24;
  return d * (xd[0] * float(sc0 * dot0) + xd[1] * float(sc1 * dot1)) -
         dmin * (float(m0) * xs[0] + float(m1) * xs[1]);
}

// ---- Resident-activation form (gemv_resident.cu) -------------------------------------------
// A type with kElems = 256 and kUnits = 8 also gives, for its unit j, the element offsets
// act_offset(j, k) in the block of its two 16-element activation halves k = 0, 1, and
// dot_regs(): its dot product against them held in registers.

// Q4_K (144 bytes, 16-byte aligned in a row of them): header 16 bytes, qs 128 bytes. Element l of
// sub-block j is nibble j % 2 of qs[32 (j / 2) + l].
struct Q4K {
  static constexpr int kElems = 256, kBytes = 144, kUnits = 8;
  struct Unit {
    int4 hdr, q;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int u) {
    return {load16(blk), load16(blk + 16 + 16 * u)};  // qs[32p + 16h ..] = qs + 16u
  }
  // The unit's levels (0..15) as bytes: lo of sub-block 2p, hi of 2p + 1.
  static __device__ __forceinline__ void levels(const Unit& w, uint32_t (&lo)[4],
                                                uint32_t (&hi)[4]) {
    const uint32_t q[4] = {uint32_t(w.q.x), uint32_t(w.q.y), uint32_t(w.q.z), uint32_t(w.q.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = q[i] & 0x0f0f0f0f;
      hi[i] = (q[i] >> 4) & 0x0f0f0f0f;
    }
  }
  static __device__ __forceinline__ float dot(const Unit& w, int u, const int8_t* xq,
                                              const float* xd) {
    uint32_t lo[4], hi[4];
    levels(w, lo, hi);
    return k4_finish(w.hdr, u, lo, hi, xq, xd);
  }
  static __device__ __forceinline__ int act_offset(int u, int k) {
    return 32 * (2 * (u >> 1) + k) + 16 * (u & 1);
  }
  static __device__ __forceinline__ float dot_regs(const Unit& w, int u, const int4 (&a)[2],
                                                   const float (&xd)[2], const float (&xs)[2]) {
    uint32_t lo[4], hi[4];
    levels(w, lo, hi);
    return k4_finish_regs(w.hdr, u, lo, hi, a, xd, xs);
  }
};

// Q4_K read 64 elements a unit (the resident GEMV only): unit p of a block is qs[32p, 32p + 32),
// the levels of sub-blocks 2p (low nibbles) and 2p + 1 (high nibbles), so one scale decode
// serves 64 weights and a lane's two qs loads are contiguous. Its activations a[0..1] are
// sub-block 2p's 32 elements, a[2..3] sub-block 2p + 1's (xd[k] their scales, xs[k] = xd[k] *
// sum(a[k])). Same blocks in memory as Q4K.
struct Q4K64 {
  static constexpr int kElems = 256, kBytes = 144, kUnits = 4;
  struct Unit {
    int4 hdr, q0, q1;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int p) {
    return {load16(blk), load16(blk + 16 + 32 * p), load16(blk + 32 + 32 * p)};
  }
  static __device__ __forceinline__ int act_offset(int p, int k) { return 64 * p + 16 * k; }
  static __device__ __forceinline__ float dot_regs(const Unit& w, int p, const int4 (&a)[4],
                                                   const float (&xd)[4], const float (&xs)[4]) {
    const uint32_t q[8] = {uint32_t(w.q0.x), uint32_t(w.q0.y), uint32_t(w.q0.z), uint32_t(w.q0.w),
                           uint32_t(w.q1.x), uint32_t(w.q1.y), uint32_t(w.q1.z), uint32_t(w.q1.w)};
    const int av[8] = {a[0].x, a[0].y, a[0].z, a[0].w, a[1].x, a[1].y, a[1].z, a[1].w};
    const int bv[8] = {a[2].x, a[2].y, a[2].z, a[2].w, a[3].x, a[3].y, a[3].z, a[3].w};
    int dot0 = 0, dot1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      dot0 = dot4(q[i] & 0x0f0f0f0f, av[i], dot0);
      dot1 = dot4((q[i] >> 4) & 0x0f0f0f0f, bv[i], dot1);
    }
    const uint32_t dd = static_cast<uint32_t>(w.hdr.x);
    const float d = half_bits_to_float(dd & 0xffff), dmin = half_bits_to_float(dd >> 16);
    const uint32_t s = k4_scales_pair(w.hdr, p);
    const int sc0 = s & 0xff, sc1 = (s >> 8) & 0xff, m0 = (s >> 16) & 0xff, m1 = s >> 24;
    return d * (xd[0] * float(sc0 * dot0) + xd[2] * float(sc1 * dot1)) -
           dmin * (float(m0) * (xs[0] + xs[1]) + float(m1) * (xs[2] + xs[3]));
  }
};

// Q5_K (176 bytes, 16-byte aligned): header 16, qh 32 at 16 (bit j of qh[l] is sub-block j's
// fifth bit of element l), qs 128 at 48.
struct Q5K {
  static constexpr int kElems = 256, kBytes = 176, kUnits = 8;
  struct Unit {
    int4 hdr, qh, q;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int u) {
    return {load16(blk), load16(blk + 16 + 16 * (u & 1)), load16(blk + 48 + 16 * u)};
  }
  // The unit's levels (0..31) as bytes: lo of sub-block 2p, hi of 2p + 1 (p = u / 2).
  static __device__ __forceinline__ void levels(const Unit& w, int u, uint32_t (&lo)[4],
                                                uint32_t (&hi)[4]) {
    const int j0 = 2 * (u >> 1), j1 = j0 + 1;
    const uint32_t q[4] = {uint32_t(w.q.x), uint32_t(w.q.y), uint32_t(w.q.z), uint32_t(w.q.w)};
    const uint32_t qh[4] = {uint32_t(w.qh.x), uint32_t(w.qh.y), uint32_t(w.qh.z), uint32_t(w.qh.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = (q[i] & 0x0f0f0f0f) | (((qh[i] >> j0) & 0x01010101) << 4);
      hi[i] = ((q[i] >> 4) & 0x0f0f0f0f) | (((qh[i] >> j1) & 0x01010101) << 4);
    }
  }
  static __device__ __forceinline__ float dot(const Unit& w, int u, const int8_t* xq,
                                              const float* xd) {
    uint32_t lo[4], hi[4];
    levels(w, u, lo, hi);
    return k4_finish(w.hdr, u, lo, hi, xq, xd);
  }
  static __device__ __forceinline__ int act_offset(int u, int k) {
    return Q4K::act_offset(u, k);
  }
  static __device__ __forceinline__ float dot_regs(const Unit& w, int u, const int4 (&a)[2],
                                                   const float (&xd)[2], const float (&xs)[2]) {
    uint32_t lo[4], hi[4];
    levels(w, u, lo, hi);
    return k4_finish_regs(w.hdr, u, lo, hi, a, xd, xs);
  }
};

// Q6_K (210 bytes: only 2-byte aligned): ql 128, qh 64 at 128, 16 int8 scales at 192, d at 208.
// Half n (128 elements) uses ql[64n ..], qh[32n ..]; element l + 32k of it (l < 32) has low bits
// from ql[l + 32 (k % 2)] (nibble k / 2), high bits 2k..2k+1 of qh[l], scale sc[8n + l / 16 + 2k].
// Unit u: n = u / 4, a = (u / 2) % 2, t = u % 2 covers l in [16t, 16t + 16) for k = a (low
// nibbles) and k = a + 2 (high nibbles): one scale each.
struct Q6K {
  static constexpr int kElems = 256, kBytes = 210, kUnits = 8;
  struct Unit {
    uint32_t ql[4], qh[4];
    int sc0, sc1;
    float d;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int u) {
    const int n = u >> 2, a = (u >> 1) & 1, t = u & 1;
    Unit w;
    const uint8_t* ql = blk + 64 * n + 32 * a + 16 * t;
    const uint8_t* qh = blk + 128 + 32 * n + 16 * t;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w.ql[i] = load4_a2(ql + 4 * i);
      w.qh[i] = load4_a2(qh + 4 * i);
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192) + 8 * n + t + 2 * a;
    w.sc0 = *sc;
    w.sc1 = *(sc + 4);
    w.d = half_bits_to_float(load2(blk + 208));
    return w;
  }
  static __device__ __forceinline__ float dot(const Unit& w, int u, const int8_t* xq,
                                              const float* xd) {
    const int n = u >> 2, a = (u >> 1) & 1, t = u & 1;
    const int b0 = 4 * n + a, b1 = b0 + 2;  // the activation 32-blocks of k = a and k = a + 2
    const int4 a0 = act16(xq + 32 * b0 + 16 * t);
    const int4 a1 = act16(xq + 32 * b1 + 16 * t);
    const int av0[4] = {a0.x, a0.y, a0.z, a0.w}, av1[4] = {a1.x, a1.y, a1.z, a1.w};
    int dot0 = 0, dot1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // 6-bit levels 0..63 minus 32 per byte (__vsub4 wraps each byte: the result is the signed
      // int8 level - 32).
      const uint32_t lo = (w.ql[i] & 0x0f0f0f0f) | (((w.qh[i] >> (2 * a)) & 0x03030303) << 4);
      const uint32_t hi =
          ((w.ql[i] >> 4) & 0x0f0f0f0f) | (((w.qh[i] >> (2 * a + 4)) & 0x03030303) << 4);
      dot0 = dot4(__vsub4(lo, 0x20202020), av0[i], dot0);
      dot1 = dot4(__vsub4(hi, 0x20202020), av1[i], dot1);
    }
    return w.d * (xd[b0] * float(w.sc0 * dot0) + xd[b1] * float(w.sc1 * dot1));
  }
};

// Q8_0 (34 bytes, 2-byte aligned): d, then 32 int8. Unit u = half h of the block (16 elements).
struct Q80 {
  static constexpr int kElems = 32, kBytes = 34, kUnits = 2;
  struct Unit {
    uint32_t q[4];
    float d;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int u) {
    Unit w;
#pragma unroll
    for (int i = 0; i < 4; ++i) w.q[i] = load4_a2(blk + 2 + 16 * u + 4 * i);
    w.d = half_bits_to_float(load2(blk));
    return w;
  }
  static __device__ __forceinline__ float dot(const Unit& w, int u, const int8_t* xq,
                                              const float* xd) {
    const int4 a = act16(xq + 16 * u);
    int acc = 0;
    acc = dot4(w.q[0], a.x, acc);
    acc = dot4(w.q[1], a.y, acc);
    acc = dot4(w.q[2], a.z, acc);
    acc = dot4(w.q[3], a.w, acc);
    return w.d * xd[0] * float(acc);
  }
};

// Q8_0 repacked at load (cuda_ops.cpp places every Q8_0 matrix whose rows are whole superblocks
// this way; repack_q8_0_superblocks): each run of eight GGUF blocks (256 elements, 272 bytes)
// becomes their eight fp16 scales (16 bytes), then their eight 32-byte quant arrays, so a row of
// superblocks is 16-byte aligned throughout (GGUF's 34-byte blocks are only 2-byte aligned). The
// same bytes and values, only moved. Unit u = GGUF block u of the superblock.
struct Q80S {
  static constexpr int kElems = 256, kBytes = 272, kUnits = 8;
  struct Unit {
    int4 q0, q1;
    float d;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int u) {
    return {load16(blk + 16 + 32 * u), load16(blk + 32 + 32 * u),
            half_bits_to_float(load2(blk + 2 * u))};
  }
  static __device__ __forceinline__ int block_dot(const Unit& w, const int4& a0, const int4& a1) {
    int acc = 0;
    acc = dot4(uint32_t(w.q0.x), a0.x, acc);
    acc = dot4(uint32_t(w.q0.y), a0.y, acc);
    acc = dot4(uint32_t(w.q0.z), a0.z, acc);
    acc = dot4(uint32_t(w.q0.w), a0.w, acc);
    acc = dot4(uint32_t(w.q1.x), a1.x, acc);
    acc = dot4(uint32_t(w.q1.y), a1.y, acc);
    acc = dot4(uint32_t(w.q1.z), a1.z, acc);
    acc = dot4(uint32_t(w.q1.w), a1.w, acc);
    return acc;
  }
  static __device__ __forceinline__ float dot(const Unit& w, int u, const int8_t* xq,
                                              const float* xd) {
    return w.d * xd[u] * float(block_dot(w, act16(xq + 32 * u), act16(xq + 32 * u + 16)));
  }
  static __device__ __forceinline__ int act_offset(int u, int k) { return 32 * u + 16 * k; }
  static __device__ __forceinline__ float dot_regs(const Unit& w, int, const int4 (&a)[2],
                                                   const float (&xd)[2], const float (&)[2]) {
    return w.d * xd[0] * float(block_dot(w, a[0], a[1]));
  }
};

// Q4_0 (18 bytes, 2-byte aligned): d, 16 bytes; element j < 16 is the low nibble of qs[j],
// j + 16 the high nibble, x = d (level - 8). One unit per block.
struct Q40 {
  static constexpr int kElems = 32, kBytes = 18, kUnits = 1;
  struct Unit {
    uint32_t q[4];
    float d;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int) {
    Unit w;
#pragma unroll
    for (int i = 0; i < 4; ++i) w.q[i] = load4_a2(blk + 2 + 4 * i);
    w.d = half_bits_to_float(load2(blk));
    return w;
  }
  static __device__ __forceinline__ float dot(const Unit& w, int, const int8_t* xq,
                                              const float* xd) {
    const int4 a0 = act16(xq), a1 = act16(xq + 16);
    const int av0[4] = {a0.x, a0.y, a0.z, a0.w}, av1[4] = {a1.x, a1.y, a1.z, a1.w};
    int acc = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = dot4(__vsub4(w.q[i] & 0x0f0f0f0f, 0x08080808), av0[i], acc);
      acc = dot4(__vsub4((w.q[i] >> 4) & 0x0f0f0f0f, 0x08080808), av1[i], acc);
    }
    return w.d * xd[0] * float(acc);
  }
};

// IQ4_XS (136 bytes, 8-byte aligned): d, scales_h (u16), scales_l (4 bytes), then per 32-element
// sub-block 16 bytes laid out as IQ4_NL (nibbles index kIQ4NLValues). Unit u = sub-block u.
constexpr uint32_t pack4(int a, int b, int c, int d) {
  return uint32_t(uint8_t(a)) | (uint32_t(uint8_t(b)) << 8) | (uint32_t(uint8_t(c)) << 16) |
         (uint32_t(uint8_t(d)) << 24);
}
// quant/iquants.cpp's kIQ4NLValues, four per word.
inline constexpr uint32_t kIQ4Table[4] = {pack4(-127, -104, -83, -65), pack4(-49, -35, -22, -10),
                                          pack4(1, 13, 25, 38), pack4(53, 69, 89, 113)};
// Four nibble indices (one per byte, 0..15) to their four int8 table values: __byte_perm picks
// bytes 0..7 by the low 3 bits of each selector nibble, once from the low half of the table and
// once from the high half; bit 3 of each index chooses between them.
__device__ __forceinline__ uint32_t iq4_lookup(uint32_t idx) {
  const uint32_t sel =
      (idx & 7) | ((idx >> 4) & 0x70) | ((idx >> 8) & 0x700) | ((idx >> 12) & 0x7000);
  const uint32_t lo = __byte_perm(kIQ4Table[0], kIQ4Table[1], sel);
  const uint32_t hi = __byte_perm(kIQ4Table[2], kIQ4Table[3], sel);
  const uint32_t high_half = ((idx >> 3) & 0x01010101) * 0xff;
  return (hi & high_half) | (lo & ~high_half);
}
struct IQ4XS {
  static constexpr int kElems = 256, kBytes = 136, kUnits = 8;
  struct Unit {
    uint2 hdr, q0, q1;
  };
  static __device__ __forceinline__ Unit load(const uint8_t* blk, int u) {
    return {load8(blk), load8(blk + 8 + 16 * u), load8(blk + 16 + 16 * u)};
  }
  static __device__ __forceinline__ int act_offset(int u, int k) { return 32 * u + 16 * k; }
  // Both halves of the unit's activations belong to one 32-block: one scale, xd[0].
  static __device__ __forceinline__ float dot_regs(const Unit& w, int u, const int4 (&a)[2],
                                                   const float (&xd)[2], const float (&)[2]) {
    const uint32_t q[4] = {w.q0.x, w.q0.y, w.q1.x, w.q1.y};
    const int av0[4] = {a[0].x, a[0].y, a[0].z, a[0].w}, av1[4] = {a[1].x, a[1].y, a[1].z, a[1].w};
    int acc = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = dot4(iq4_lookup(q[i] & 0x0f0f0f0f), av0[i], acc);
      acc = dot4(iq4_lookup((q[i] >> 4) & 0x0f0f0f0f), av1[i], acc);
    }
    const uint32_t scales_h = w.hdr.x >> 16, scales_l = w.hdr.y;
    const int ls = ((scales_l >> (4 * u)) & 0x0f) | (((scales_h >> (2 * u)) & 3) << 4);
    return half_bits_to_float(w.hdr.x & 0xffff) * float(ls - 32) * xd[0] * float(acc);
  }
  static __device__ __forceinline__ float dot(const Unit& w, int u, const int8_t* xq,
                                              const float* xd) {
    const int4 a[2] = {act16(xq + 32 * u), act16(xq + 32 * u + 16)};
    const float d[2] = {xd[u], xd[u]}, unused[2] = {0.0f, 0.0f};
    return dot_regs(w, u, a, d, unused);
  }
};

// ---- Element-wise dequantisation (embed_rows): element i of a row ---------------------------
template <class T>
__device__ float dequant_element(const uint8_t* row, int64_t i);

template <>
__device__ inline float dequant_element<Q4K>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * Q4K::kBytes;
  const int e = int(i % 256), j = e / 32, l = e % 32;
  const int4 hdr = load16(b);
  int sc, m;
  k4_scale_min(hdr, j, sc, m);
  const int level = (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
  const uint32_t dd = uint32_t(hdr.x);
  return half_bits_to_float(dd & 0xffff) * float(sc) * float(level) -
         half_bits_to_float(dd >> 16) * float(m);
}
template <>
__device__ inline float dequant_element<Q5K>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * Q5K::kBytes;
  const int e = int(i % 256), j = e / 32, l = e % 32;
  const int4 hdr = load16(b);
  int sc, m;
  k4_scale_min(hdr, j, sc, m);
  const int level =
      ((b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f) | (((b[16 + l] >> j) & 1) << 4);
  const uint32_t dd = uint32_t(hdr.x);
  return half_bits_to_float(dd & 0xffff) * float(sc) * float(level) -
         half_bits_to_float(dd >> 16) * float(m);
}
template <>
__device__ inline float dequant_element<Q6K>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * Q6K::kBytes;
  const int e = int(i % 256), n = e / 128, k = (e % 128) / 32, l = e % 32;
  const int low = (b[64 * n + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
  const int high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
  const int sc = reinterpret_cast<const int8_t*>(b + 192)[8 * n + l / 16 + 2 * k];
  return half_bits_to_float(load2(b + 208)) * float(sc) * float((low | (high << 4)) - 32);
}
template <>
__device__ inline float dequant_element<Q80>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 32) * Q80::kBytes;
  return half_bits_to_float(load2(b)) * float(reinterpret_cast<const int8_t*>(b + 2)[i % 32]);
}
template <>
__device__ inline float dequant_element<Q80S>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * Q80S::kBytes;
  const int e = int(i % 256);
  return half_bits_to_float(load2(b + 2 * (e / 32))) *
         float(reinterpret_cast<const int8_t*>(b + 16)[e]);
}
template <>
__device__ inline float dequant_element<Q40>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 32) * Q40::kBytes;
  const int e = int(i % 32);
  const int level = (b[2 + e % 16] >> (4 * (e / 16))) & 0x0f;
  return half_bits_to_float(load2(b)) * float(level - 8);
}
template <>
__device__ inline float dequant_element<IQ4XS>(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + (i / 256) * IQ4XS::kBytes;
  const int e = int(i % 256), ib = e / 32, l = e % 32;
  const uint2 hdr = load8(b);
  const int ls = ((hdr.y >> (4 * ib)) & 0x0f) | ((((hdr.x >> 16) >> (2 * ib)) & 3) << 4);
  const int idx = (b[8 + 16 * ib + l % 16] >> (4 * (l / 16))) & 0x0f;
  const int value = int8_t(iq4_lookup(uint32_t(idx)) & 0xff);
  return half_bits_to_float(hdr.x & 0xffff) * float(ls - 32) * float(value);
}

// ---- Eight consecutive elements i0 .. i0 + 7 of a row (i0 % 8 == 0; the prefill GEMMs expand
// weights this way): dequant_element's arithmetic with the block header decoded once. The eight
// share a block and a scale in every type (runs of 8 never straddle a 16-element half).
template <class T>
__device__ __forceinline__ void dequant8(const uint8_t* row, int64_t i0, float (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = dequant_element<T>(row, i0 + j);
}

// A Q4_K / Q5_K sub-block's scale and min (its elements are d * level - mn).
__device__ __forceinline__ void k4_sub_block_scale(const uint8_t* b, int j, float& d, float& mn) {
  const int4 hdr = load16(b);
  int sc, m;
  k4_scale_min(hdr, j, sc, m);
  const uint32_t dd = uint32_t(hdr.x);
  d = half_bits_to_float(dd & 0xffff) * float(sc);
  mn = half_bits_to_float(dd >> 16) * float(m);
}

template <>
__device__ __forceinline__ void dequant8<Q4K>(const uint8_t* row, int64_t i0, float (&v)[8]) {
  const uint8_t* b = row + (i0 / 256) * Q4K::kBytes;
  const int e = int(i0 % 256), j = e / 32, l = e % 32;
  float d, mn;
  k4_sub_block_scale(b, j, d, mn);
  const uint2 q = load8(b + 16 + 32 * (j / 2) + l);
  const int shift = 4 * (j % 2);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = i < 4 ? q.x : q.y;
    v[i] = d * float((w >> (8 * (i % 4) + shift)) & 0x0f) - mn;
  }
}
template <>
__device__ __forceinline__ void dequant8<Q5K>(const uint8_t* row, int64_t i0, float (&v)[8]) {
  const uint8_t* b = row + (i0 / 256) * Q5K::kBytes;
  const int e = int(i0 % 256), j = e / 32, l = e % 32;
  float d, mn;
  k4_sub_block_scale(b, j, d, mn);
  const uint2 q = load8(b + 48 + 32 * (j / 2) + l), h = load8(b + 16 + l);
  const int shift = 4 * (j % 2);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = i < 4 ? q.x : q.y, hw = i < 4 ? h.x : h.y;
    const int level =
        int((w >> (8 * (i % 4) + shift)) & 0x0f) | int(((hw >> (8 * (i % 4) + j)) & 1) << 4);
    v[i] = d * float(level) - mn;
  }
}
template <>
__device__ __forceinline__ void dequant8<Q6K>(const uint8_t* row, int64_t i0, float (&v)[8]) {
  const uint8_t* b = row + (i0 / 256) * Q6K::kBytes;  // 210-byte blocks: 2-byte aligned
  const int e = int(i0 % 256), n = e / 128, k = (e % 128) / 32, l = e % 32;
  const int sc = reinterpret_cast<const int8_t*>(b + 192)[8 * n + l / 16 + 2 * k];
  const float d = half_bits_to_float(load2(b + 208)) * float(sc);
  const uint8_t* ql = b + 64 * n + l + 32 * (k % 2);
  const uint8_t* qh = b + 128 + 32 * n + l;
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const uint32_t lo2 = load2(ql + i), hi2 = load2(qh + i);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int low = int((lo2 >> (8 * t + 4 * (k / 2))) & 0x0f);
      const int high = int((hi2 >> (8 * t + 2 * k)) & 3);
      v[i + t] = d * float((low | (high << 4)) - 32);
    }
  }
}
template <>
__device__ __forceinline__ void dequant8<Q80>(const uint8_t* row, int64_t i0, float (&v)[8]) {
  const uint8_t* b = row + (i0 / 32) * Q80::kBytes;  // 34-byte blocks: 2-byte aligned
  const float d = half_bits_to_float(load2(b));
  const uint8_t* q = b + 2 + i0 % 32;
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const uint32_t w = load2(q + i);
    v[i] = d * float(int8_t(w & 0xff));
    v[i + 1] = d * float(int8_t(w >> 8));
  }
}
template <>
__device__ __forceinline__ void dequant8<Q80S>(const uint8_t* row, int64_t i0, float (&v)[8]) {
  const uint8_t* b = row + (i0 / 256) * Q80S::kBytes;
  const int e = int(i0 % 256);
  const float d = half_bits_to_float(load2(b + 2 * (e / 32)));
  const uint2 q = load8(b + 16 + e);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = i < 4 ? q.x : q.y;
    v[i] = d * float(int8_t((w >> (8 * (i % 4))) & 0xff));
  }
}
template <>
__device__ __forceinline__ void dequant8<IQ4XS>(const uint8_t* row, int64_t i0, float (&v)[8]) {
  const uint8_t* b = row + (i0 / 256) * IQ4XS::kBytes;
  const int e = int(i0 % 256), ib = e / 32, l = e % 32;
  const uint2 hdr = load8(b);
  const int ls = ((hdr.y >> (4 * ib)) & 0x0f) | ((((hdr.x >> 16) >> (2 * ib)) & 3) << 4);
  const float d = half_bits_to_float(hdr.x & 0xffff) * float(ls - 32);
  const uint2 q = load8(b + 8 + 16 * ib + l % 16);
  const int shift = 4 * (l / 16);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = i < 4 ? q.x : q.y;
    v[i] = d * float(int8_t(iq4_lookup((w >> (8 * (i % 4) + shift)) & 0x0f) & 0xff));
  }
}

}  // namespace qwenrt::ops::cuda::qb
