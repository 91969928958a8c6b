// The tensor-core GEMV (matmul_args.cuh, "gemv_mma.cu"): quantised weights against 3..32
// activation rows already quantised to int8, for batched decode and speculative checks.
//
// The staged GEMV dots every activation row against each weight unit with dp4a, so each row
// beyond the first costs about a third of a one-row pass (measured: 8 rows cost 3.0-3.4 one-row
// steps on the H200). Here the integer dot products run as mma.sync int8 (m16n8k32, and m16n8k16
// for Q6_K's 16-element scales): 16 weight rows x 8 activation rows x one 32-element block per
// instruction, so the cost per activation row is small and the pass stays a stream over the
// weights.
// - A block owns 16 weight rows (of one matrix, or a gate and up pair) and all activation rows (n
//   up to 8 * NT); its W warps split the row's 256-element superblocks (warp w takes w, w + W,
//   ...) and sum their partial tiles through shared memory in warp order (deterministic).
// - Lane (g, t) = (lane / 4, lane % 4) loads its fragments straight from global memory: rows g and
//   g + 8 of the tile, bytes 8t..8t+7 of each 32-element run, and the same bytes of activation row
//   g. The mma's k slots t*4..t*4+3 and 16+t*4..16+t*4+3 thus hold elements 8t..8t+7: one
//   permutation of k, the same for weights and activations, which leaves the dot product as it
//   is. (Q6_K's k16 form keeps the natural order.)
// - The int32 dot of each 32-element block (16 for Q6_K) is scaled in fp32 as the dp4a kernels do:
//   x = d sc level - dmin m, so a block adds xd (d sc <level, q>) - dmin m xs with xs = xd sum(q)
//   (the activation sums quantize_q8_kernel writes). The same integer dots as the staged GEMV;
//   only the fp32 summation order differs.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "ops/cuda/check.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

constexpr int kTileRows = 16;            // weight rows per block (the mma's M)
constexpr int kMaxWarps = 8;             // warps splitting a row's superblocks
constexpr int kReduceBytes = 48 * 1024;  // shared memory for the warps' partial tiles (at most)
constexpr int kSuperElems = 256;         // elements per superblock (every type here)

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
  template <int NT>
  static __device__ __forceinline__ void compute(const Raw& r, int64_t sb, int t, const ActLane& al,
                                                 float (&acc)[NT][4]) {
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
    apply<NT, true>(f, al, sb, t, acc);
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
  template <int NT>
  static __device__ __forceinline__ void compute(const Raw& r, int64_t sb, int t, const ActLane& al,
                                                 float (&acc)[NT][4]) {
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
    apply<NT, false>(f, al, sb, t, acc);
  }
};

// Q6_K (210 bytes, 2-byte aligned): ql 128, qh 64, 16 int8 scales, d. Element 128n + 32k + l has
// low bits nibble k / 2 of ql[64n + 32 (k % 2) + l], high bits 2k..2k+1 of qh[32n + l], scale
// sc[8n + 2k + l / 16]; level - 32. One k16 step per 16 elements (n, k, h = l / 16): lane t holds
// l = 16h + 4t..4t+3.
struct MmaQ6K {
  static constexpr int kBytes = 210;
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
    apply<NT>(f, al, sb, t, acc);
  }
};

// ---- The kernel -----------------------------------------------------------------------------
// NM = 1: a group of matrices (blockIdx.x over every job's row tiles, jobs of one type);
// NM = 2: job 0 is gate, job 1 up, y = silu(gate) * up into job 0's y.
template <class T, int NT, int NM>
__global__ void __launch_bounds__(kMaxWarps * 32)
    mma_gemv_kernel(const __grid_constant__ Group g, int n, Acts a) {
  pdl_launch_dependents();
  extern __shared__ float red[];  // NM * NT * 4 * 32 floats per warp
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane / 4, t = lane % 4;
  int j = 0;
  if constexpr (NM == 1) {
    while (j + 1 < g.n_jobs && int64_t{blockIdx.x} >= g.job[j + 1].first_block) ++j;
  }
  const int64_t row0 = (int64_t{blockIdx.x} - g.job[j].first_block) * kTileRows;
  const int64_t out = g.job[j].m.out;
  const int64_t n_sb = a.in / kSuperElems;
  const ActLane al = act_lane(a, gq, t);
  float acc[NM][NT][4] = {};
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const MatArg& w = g.job[j + m].m;
    // Rows past the end read the last row (their outputs are not written).
    const uint8_t* w0 = w.data + min(row0 + gq, out - 1) * w.row_bytes;
    const uint8_t* w1 = w.data + min(row0 + gq + 8, out - 1) * w.row_bytes;
    // (Loading the next superblock before computing this one measured slower: 515 -> 478 tok/s
    // on the 27B at 8 rows; the registers cost more warps than the loads in flight gain.)
    for (int64_t sb = warp; sb < n_sb; sb += warps) {
      const typename T::Raw r = T::load(w0 + sb * T::kBytes, w1 + sb * T::kBytes, t);
      T::template compute<NT>(r, sb, t, al, acc[m]);
    }
  }
  // The warps' partial tiles: red[((m * NT + nt) * 4 + i) * warps * 32 + warp * 32 + lane].
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        red[((m * NT + nt) * 4 + i) * warps * 32 + threadIdx.x] = acc[m][nt][i];
  __syncthreads();
  for (int e = threadIdx.x; e < NT * 4 * 32; e += blockDim.x) {
    const int l = e % 32, v = e / 32;  // v = nt * 4 + i
    const int nt = v / 4, i = v % 4;
    const int64_t row = row0 + l / 4 + 8 * (i / 2);
    const int col = 8 * nt + 2 * (l % 4) + (i % 2);
    float sum[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      sum[m] = 0.0f;
      for (int w = 0; w < warps; ++w) sum[m] += red[(m * NT * 4 + v) * warps * 32 + w * 32 + l];
    }
    if (row >= out || col >= n) continue;
    const float r = NM == 2 ? silu(sum[0]) * sum[NM - 1] : sum[0];
    g.job[j].y[int64_t{col} * g.job[j].y_stride + row] = r;
  }
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atoi(v);
}
// The most warps a block splits a row over (a measurement knob; default: warps_for's rule).
int max_warps() {
  static const int w = std::clamp(env_int("QWENRT_CUDA_MMA_WARPS", 0), 0, kMaxWarps);
  return w;
}

int max_rows_from_env() {
  const char* v = std::getenv("QWENRT_CUDA_MMA_ROWS");
  if (v == nullptr || *v == '\0') return 32;
  const long long r = std::atoll(v);
  return r <= 1 ? 0 : static_cast<int>(std::min<long long>(r, 64));
}

// Calls f.template operator()<T>() for the matrix's type, or returns false.
template <class F>
bool with_mma_type(const MatArg& m, F&& f) {
  switch (m.dtype) {
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
      if (!m.q8s) return false;
      f.template operator()<MmaQ80S>();
      return true;
    default:
      return false;
  }
}

// Whether a matrix of type t (q8s: Q8_0 in superblocks) has a kernel here.
bool mma_dtype(DType t, bool q8s) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || (t == DType::Q8_0 && q8s);
}
bool mma_type_ok(const MatArg& m) {
  return mma_dtype(m.dtype, m.q8s);
}

template <class F>
void with_nt(int64_t n, F&& f) {
  if (n <= 8) {
    f.template operator()<1>();
  } else if (n <= 16) {
    f.template operator()<2>();
  } else if (n <= 32) {
    f.template operator()<4>();
  } else {
    f.template operator()<8>();
  }
}

// Warps per block: up to one per superblock of a row, no more than the partial tiles' shared
// memory holds; 4 for up to 16 rows and 8 above (27B on the H200, rows 8 / 16 / 32: 496 / 722 /
// 835 tok/s with 4 warps, 478 / 659 / 862 with 8).
int warps_for(int64_t n_sb, int nm, int nt) {
  const int by_smem = kReduceBytes / (nm * nt * 4 * 32 * 4);
  const int64_t by_row = std::max<int64_t>(1, n_sb);
  const int most = max_warps() > 0 ? max_warps() : nt <= 2 ? 4 : kMaxWarps;
  return static_cast<int>(std::min<int64_t>({most, by_smem, by_row}));
}

bool mma_fits(const MatArg& m, const Acts& a) {
  if (!mma_type_ok(m) || m.n_expert != 1 || a.in % kSuperElems != 0 || a.s == nullptr) return false;
  const int64_t need = m.dtype == DType::Q6_K ? 2 : 16;
  return aligned(m.data, need) && m.row_bytes % need == 0;
}

template <int NM>
bool launch_mma(const Group& g, int64_t n, const Acts& a, int64_t blocks, cudaStream_t stream) {
  return with_mma_type(g.job[0].m, [&]<class T>() {
    with_nt(n, [&]<int NT>() {
      const int warps = warps_for(a.in / kSuperElems, NM, NT);
      const size_t smem = size_t{NM} * NT * 4 * 32 * 4 * warps;
      mma_gemv_kernel<T, NT, NM>
          <<<static_cast<unsigned>(blocks), warps * 32, smem, stream>>>(g, static_cast<int>(n), a);
    });
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

bool mma_rows(int64_t n) {
  static const int max_rows = max_rows_from_env();
  // From 3 rows: at 2 the staged GEMV measured faster (27B, 2-row checks: 79.9 against 61.0
  // checks/s; every micro-benchmark shape 0.5-0.8x), from 4 rows (Q4_K) and 5 (end to end) slower.
  static const int min_rows = std::max(2, env_int("QWENRT_CUDA_MMA_MIN_ROWS", 3));
  return n >= min_rows && n <= max_rows;
}

bool mma_kind(const Matrix& w) {
  return mma_dtype(w.dtype, w.q8_superblocks) && w.n_expert == 1 && w.in % kSuperElems == 0;
}

bool mma_group(const Group& g, int64_t n, const Acts& a, cudaStream_t stream) {
  if (!mma_rows(n)) return false;
  for (int i = 0; i < g.n_jobs; ++i)
    if (!mma_fits(g.job[i].m, a)) return false;
  // One launch per run of jobs of one type (a group may mix types: Q4_K q / k with a Q6_K v).
  for (int i = 0; i < g.n_jobs;) {
    Group sg{};
    sg.n_jobs = 0;
    int64_t blocks = 0;
    int e = i;
    while (e < g.n_jobs && g.job[e].m.dtype == g.job[i].m.dtype) {
      sg.job[sg.n_jobs] = g.job[e];
      sg.job[sg.n_jobs].first_block = blocks;
      blocks += (g.job[e].m.out + kTileRows - 1) / kTileRows;
      ++sg.n_jobs;
      ++e;
    }
    launch_mma<1>(sg, n, a, blocks, stream);
    i = e;
  }
  return true;
}

bool mma_swiglu(const MatArg& gate, const MatArg& up, float* y, int64_t n, const Acts& a,
                cudaStream_t stream) {
  if (!mma_rows(n) || gate.dtype != up.dtype || gate.q8s != up.q8s || !mma_fits(gate, a) ||
      !mma_fits(up, a) || gate.out != up.out)
    return false;
  Group sg{};
  sg.n_jobs = 2;
  sg.job[0] = {.m = gate, .y = y, .y_stride = gate.out, .first_block = 0};
  sg.job[1] = {.m = up, .y = y, .y_stride = gate.out, .first_block = 0};
  return launch_mma<2>(sg, n, a, (gate.out + kTileRows - 1) / kTileRows, stream);
}

}  // namespace qwenrt::ops::cuda::mm
