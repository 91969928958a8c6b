// Ops::attention's prefill shape on tensor cores (ref::attention_spans is the definition;
// attention.cu's launcher calls this for the spans too long for its split shape).
//
// The unit of work is a query vector, as in attention.cu: one (query row, q head) pair, and the
// vectors of a span that share KV head g are its rows x the G = n_head / n_head_kv q heads of g's
// group, row-major. They are cut into tiles of kTileVectors = 64. One block of 4 warps takes one
// tile and one KV head (grid: tiles x spans x KV heads; the later, longer tiles start first) and
// streams the keys its rows see, kKeys = 32 at a time, through shared memory; every key tile
// serves the 64 vectors, so the q heads of a group share each load (GQA). Warp w owns vectors
// [16 w, 16 w + 16) as the M rows of mma.sync.m16n8k16 (f16 inputs, fp32 accumulators):
//   S [16, 32] = Q K^T over D (q pre-scaled by scale * log2 e, so the softmax runs on exp2f),
//   online softmax on the S accumulators in fp32 (running max and sum per row in registers),
//   O [16, D] = O * alpha + P V, with P rounded to f16 as the A operand straight from S's
//   registers. O stays in registers (D / 2 floats a thread) until the output.
// A warp skips the key tiles past its last row's position; only a tile that crosses a warp's
// first position is masked. Rows past the span have position -1: every key is masked, their
// softmax stays at zero, and they write nothing.
//
// Staging: the keys are fp32 (pages below n_past, the step's own rows args.k / args.v from n_past
// on), so cp.async copies a tile's K and V rows into one fp32 buffer, and the block converts it
// to f16 into one of two f16 buffers; the next tile's copy is in flight during the math of the
// current one. Shared memory for D = 256: Q 33,792 + K/V f16 2 x 33,792 + fp32 staging 65,536 =
// 166,912 bytes, exactly sm_80's opt-in limit (one block per SM on an H200 as well).
//
// The KV append follows attention.cu's rules: the tile holding a row's first vector writes it
// into its page, and no block reads a page row at a position >= n_past (those keys come from
// args.k / args.v). Grids come from host-known bounds (step.max_span_count); a block reads its
// span on the device and exits when the span takes the split shape or its tile lies beyond the
// span, so the launch replays correctly in a captured graph.
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/paged_kv.cuh"
#include "ops/cuda/pdl.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kThreads = 128;                  // 4 warps
constexpr int kWarpRows = 16;                  // the M of one mma: vectors per warp
constexpr int kTileVectors = kWarpRows * 4;    // vectors per block
constexpr int kKeys = 32;                      // keys per tile: S is 4 mma n-tiles wide
constexpr float kLog2e = 1.4426950408889634f;  // softmax by exp2f: e^x = 2^(x log2 e)

// Shared memory of the kernel. f16 rows are padded by 8 halves (16 bytes): the 8 row addresses
// of an ldmatrix then fall in distinct banks.
template <int D>
struct Smem {
  static constexpr int kStride = D + 8;                              // halves per f16 row
  static constexpr int kQ = 0;                                       // halves: [vector][kStride]
  static constexpr int kKV = kQ + kTileVectors * kStride;            // [2][K, V][key][kStride]
  static constexpr int kKVBuffer = 2 * kKeys * kStride;              // one buffer's K and V
  static constexpr size_t kStage = size_t{kKV + 2 * kKVBuffer} * 2;  // bytes: fp32 [K, V][key][D]
  static constexpr size_t kBytes = kStage + size_t{2} * kKeys * D * 4;
};
static_assert(Smem<256>::kBytes <= 163 * 1024, "prefill tiles must fit sm_80's shared memory");

// The kernel's arguments: plain pointers and sizes.
struct PrefillArgs {
  const Span* spans;
  const int32_t* page_tables;  // [n_slots, page_table_stride]
  int64_t page_table_stride;
  const float* q;  // [n, n_head, D], rows q_stride apart
  int64_t q_stride;
  const float* k;  // [n, kv_dim]: the step's new rows
  const float* v;
  float* k_pages;  // [n_pages, page_size, kv_dim]
  float* v_pages;
  int page_size;
  int64_t kv_dim;
  float* out;  // [n, n_head, D]
  int n_head, group;
  float q_scale;       // scale * log2 e
  int split_vectors;   // spans of count * group <= this take attention.cu's split shape
  int tiles_per_span;  // the grid's tile bound
};

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8x8 f16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i,
// and lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each (of its transpose
// with .trans). The memory clobber keeps the loads after the barriers that publish the tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c [16, 8] += a [16, 16] b [16, 8]: f16 inputs, fp32 accumulators. Lane l (row g = l / 4,
// column pair 2 (l % 4)) holds a = {(g, k0), (g + 8, k0), (g, k0 + 8), (g + 8, k0 + 8)},
// b = {(k0, g), (k0 + 8, g)} and c = {(g, n0), (g, n0 + 1), (g + 8, n0), (g + 8, n0 + 1)},
// with k0 = n0 = 2 (l % 4) (each a / b register a pair along k).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as an f16 pair, lo in the low half (the element of the lower index).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// One block: (tile blockIdx.x, counted from the span's end; span blockIdx.y; KV head blockIdx.z).
template <int D>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(const PrefillArgs a) {
  pdl_launch_dependents();
  using S = Smem<D>;
  static_assert(S::kStage % 16 == 0, "the fp32 staging must be 16-byte aligned");
  constexpr int kStride = S::kStride;
  // D <= 128: the warp's Q fragments fit registers next to O (D / 2 floats); D = 256 reads them
  // from shared memory every key tile (O is already 128 registers).
  constexpr bool kQInRegisters = D <= 128;
  extern __shared__ float4 smem_f4[];
  __half* smem_h = reinterpret_cast<__half*>(smem_f4);
  __half* q_s = smem_h + S::kQ;
  __half* kv_s = smem_h + S::kKV;
  float* k_stage = reinterpret_cast<float*>(reinterpret_cast<char*>(smem_f4) + S::kStage);
  float* v_stage = k_stage + kKeys * D;

  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int s = blockIdx.y, g = blockIdx.z, G = a.group;
  const Span sp = a.spans[s];
  const int n_vectors = sp.count * G;
  if (sp.count == 0 || n_vectors <= a.split_vectors) return;  // empty, or the split shape's
  const int vec0 = (a.tiles_per_span - 1 - blockIdx.x) * kTileVectors;
  if (vec0 >= n_vectors) return;  // a tile beyond this span
  const int n_vec = min(kTileVectors, n_vectors - vec0);
  const int key_end = sp.n_past + (vec0 + n_vec - 1) / G + 1;  // the last row sees up to itself

  // KV append of the rows this block owns: those whose first vector r * G lies in its range.
  {
    const int r_begin = (vec0 + G - 1) / G;
    const int r_end = min(sp.count, (vec0 + n_vec + G - 1) / G);
    const int32_t* table = a.page_tables + sp.slot * a.page_table_stride;
    for (int idx = t; idx < (r_end - r_begin) * (D / 4); idx += kThreads) {
      const int r = r_begin + idx / (D / 4), c = idx % (D / 4);
      const int pos = sp.n_past + r;
      const int32_t page = table[pos / a.page_size];
      if (page < 0) continue;
      const int64_t dst =
          (int64_t{page} * a.page_size + pos % a.page_size) * a.kv_dim + int64_t{g} * D + 4 * c;
      const int64_t src = (int64_t{sp.begin} + r) * a.kv_dim + int64_t{g} * D + 4 * c;
      *reinterpret_cast<float4*>(a.k_pages + dst) = *reinterpret_cast<const float4*>(a.k + src);
      *reinterpret_cast<float4*>(a.v_pages + dst) = *reinterpret_cast<const float4*>(a.v + src);
    }
  }

  // Queries as f16, pre-scaled (zero past the tile's vectors). q rows need not be 16-byte
  // aligned (q_stride is any float count), so they are read a float at a time: once per block.
  for (int idx = t; idx < kTileVectors * (D / 2); idx += kThreads) {
    const int v = idx / (D / 2), d = 2 * (idx % (D / 2));
    float x0 = 0.0f, x1 = 0.0f;
    if (v < n_vec) {
      const int vg = vec0 + v, r = vg / G, h = g * G + vg % G;
      const float* src = a.q + (int64_t{sp.begin} + r) * a.q_stride + int64_t{h} * D + d;
      x0 = src[0] * a.q_scale;
      x1 = src[1] * a.q_scale;
    }
    *reinterpret_cast<uint32_t*>(q_s + v * kStride + d) = pack_half2(x0, x1);
  }

  // Copy key tile `it` (keys it * kKeys..) into the fp32 staging; keys at or past key_end are
  // zero-filled (their V rows then add 0 * 0, never a stale or NaN row).
  auto stage = [&](int it) {
    const int kt = it * kKeys;
    for (int idx = t; idx < kKeys * (D / 4); idx += kThreads) {
      const int j = idx / (D / 4), c = idx % (D / 4);
      const int pos = kt + j;
      KeyAt at{-1, false};
      if (pos < key_end) at = key_at(a, sp, pos);
      const bool valid = at.offset >= 0;
      const int64_t off = valid ? at.offset + int64_t{g} * D + 4 * c : 0;
      const float* ksrc = valid ? (at.fresh ? a.k : a.k_pages) + off : a.k;
      const float* vsrc = valid ? (at.fresh ? a.v : a.v_pages) + off : a.v;
      cp_async16(k_stage + j * D + 4 * c, ksrc, valid);
      cp_async16(v_stage + j * D + 4 * c, vsrc, valid);
    }
    cp_async_commit();
  };
  // The staged fp32 tile to f16 buffer `buf`.
  auto convert = [&](int buf) {
    __half* kd = kv_s + buf * S::kKVBuffer;
    __half* vd = kd + kKeys * kStride;
    for (int idx = t; idx < kKeys * (D / 4); idx += kThreads) {
      const int j = idx / (D / 4), c = idx % (D / 4);
      const float4 kk = *reinterpret_cast<const float4*>(k_stage + j * D + 4 * c);
      const float4 vv = *reinterpret_cast<const float4*>(v_stage + j * D + 4 * c);
      *reinterpret_cast<uint2*>(kd + j * kStride + 4 * c) =
          make_uint2(pack_half2(kk.x, kk.y), pack_half2(kk.z, kk.w));
      *reinterpret_cast<uint2*>(vd + j * kStride + 4 * c) =
          make_uint2(pack_half2(vv.x, vv.y), pack_half2(vv.z, vv.w));
    }
  };

  const int n_key_tiles = (key_end + kKeys - 1) / kKeys;
  stage(0);
  cp_async_wait_all();
  __syncthreads();  // tile 0 staged, q_s written
  convert(0);
  __syncthreads();  // tile 0 in f16, the staging free again
  if (n_key_tiles > 1) stage(1);

  // This thread's rows: vectors wv0 + lane / 4 and wv0 + lane / 4 + 8 of the span, at positions
  // pos0 / pos1 (-1 past the span). Positions grow with the vector index, so the warp's first
  // and last valid vectors bound them.
  const int wv0 = vec0 + warp * kWarpRows;
  auto position = [&](int vg) { return vg < n_vectors ? sp.n_past + vg / G : -1; };
  const int pos0 = position(wv0 + lane / 4), pos1 = position(wv0 + lane / 4 + 8);
  const int warp_min_pos = position(wv0 + kWarpRows - 1) < 0 ? -1 : position(wv0);
  const int warp_max_pos = wv0 < n_vectors ? position(min(wv0 + kWarpRows, n_vectors) - 1) : -1;

  // Q fragments of this warp's 16 vectors for the D / 16 k-steps of S = Q K^T.
  const __half* q_warp = q_s + (warp * kWarpRows + (lane & 15)) * kStride + (lane >> 4) * 8;
  uint32_t q_frag[kQInRegisters ? D / 16 : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(q_frag[kk], q_warp + kk * 16);
  }

  float o[D / 8][4];  // O: n-tile nt holds dims [8 nt, 8 nt + 8) in the c layout of mma_f16
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  // Running max (log2 units) and this thread's part of the running sum, rows lane / 4 and + 8.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  // ldmatrix row offsets (see ldmatrix_x4): K as S's B operand (keys x dims, not transposed):
  // matrices {keys 0-7, 8-15} x {dims 0-7, 8-15} in the order b0 b1 of n-tile 0, b0 b1 of 1;
  // V as P V's B operand (transposed): {dims 0-7, 8-15} x {keys 0-7, 8-15}.
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;

  for (int it = 0; it < n_key_tiles; ++it) {
    const int kt = it * kKeys;
    const __half* kb = kv_s + (it & 1) * S::kKVBuffer;
    const __half* vb = kb + kKeys * kStride;
    if (kt <= warp_max_pos) {  // warp-uniform: some row of this warp sees a key of the tile
      float sc[kKeys / 8][4];
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[4];
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[i] = q_frag[kk][i];
        } else {
          ldmatrix_x4(qa, q_warp + kk * 16);
        }
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t kf[4];
          ldmatrix_x4(kf, kb + (np * 16 + k_row) * kStride + kk * 16 + k_col);
          mma_f16(sc[2 * np], qa, kf[0], kf[1]);
          mma_f16(sc[2 * np + 1], qa, kf[2], kf[3]);
        }
      }
      // Causal mask, only where the tile crosses the warp's first row (or the warp has rows past
      // the span); keys past key_end lie past every row, so this masks them too.
      if (kt + kKeys - 1 > warp_min_pos) {
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; ++nt) {
          const int key = kt + nt * 8 + 2 * (lane & 3);
          if (key > pos0) sc[nt][0] = -INFINITY;
          if (key + 1 > pos0) sc[nt][1] = -INFINITY;
          if (key > pos1) sc[nt][2] = -INFINITY;
          if (key + 1 > pos1) sc[nt][3] = -INFINITY;
        }
      }
      // Online softmax: the row max over the quad of lanes that share a row.
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // A row that has seen no key yet (max -inf) subtracts 0 instead: exp2f(-inf - -inf) would
      // be NaN, exp2f(-inf - 0) is the 0 it needs.
      const float base0 = mx0 == -INFINITY ? 0.0f : mx0;
      const float base1 = mx1 == -INFINITY ? 0.0f : mx1;
      const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
      m0 = mx0;
      m1 = mx1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        sc[nt][0] = exp2f(sc[nt][0] - base0);
        sc[nt][1] = exp2f(sc[nt][1] - base0);
        sc[nt][2] = exp2f(sc[nt][2] - base1);
        sc[nt][3] = exp2f(sc[nt][3] - base1);
        sum0 += sc[nt][0] + sc[nt][1];
        sum1 += sc[nt][2] + sc[nt][3];
      }
      l0 = l0 * alpha0 + sum0;  // the quad's parts are summed once, at the end
      l1 = l1 * alpha1 + sum1;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        o[nt][0] *= alpha0;
        o[nt][1] *= alpha0;
        o[nt][2] *= alpha1;
        o[nt][3] *= alpha1;
      }
      // O += P V: S's accumulators of n-tiles 2 kk and 2 kk + 1 are P's A operand for keys
      // [16 kk, 16 kk + 16).
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t pa[4] = {pack_half2(sc[2 * kk][0], sc[2 * kk][1]),
                                pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                                pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vf[4];
          ldmatrix_x4_trans(vf, vb + (kk * 16 + v_row) * kStride + dp * 16 + v_col);
          mma_f16(o[2 * dp], pa, vf[0], vf[1]);
          mma_f16(o[2 * dp + 1], pa, vf[2], vf[3]);
        }
      }
    }
    if (it + 1 < n_key_tiles) {
      cp_async_wait_all();
      __syncthreads();  // tile it + 1 staged; every warp done with f16 buffer (it + 1) % 2
      convert((it + 1) & 1);
      __syncthreads();                          // tile it + 1 in f16, the staging free again
      if (it + 2 < n_key_tiles) stage(it + 2);  // in flight during tile it + 1's math
    }
  }

  // Output: O / l for the thread's rows inside the span (l > 0: every row sees its own key).
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {  // rows lane / 4 and lane / 4 + 8
    const int vg = wv0 + lane / 4 + 8 * hi;
    if (vg >= n_vectors) continue;
    const int r = vg / G, h = g * G + vg % G;
    const float inv = 1.0f / (hi == 0 ? l0 : l1);
    float* dst = a.out + ((int64_t{sp.begin} + r) * a.n_head + h) * D + 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<float2*>(dst + nt * 8) =
          make_float2(o[nt][2 * hi] * inv, o[nt][2 * hi + 1] * inv);
    }
  }
}

template <int D>
void launch(const DeviceStep& step, const AttentionArgs& args, int split_vectors,
            cudaStream_t stream) {
  const int group = args.n_head / args.n_head_kv;
  // Tile bound: the vectors of the longest possible span.
  const int64_t tiles = (step.max_span_count * group + kTileVectors - 1) / kTileVectors;
  const PrefillArgs pa{.spans = step.spans,
                       .page_tables = step.page_tables,
                       .page_table_stride = step.page_table_stride,
                       .q = args.q,
                       .q_stride = args.q_stride,
                       .k = args.k,
                       .v = args.v,
                       .k_pages = args.kv.k,
                       .v_pages = args.kv.v,
                       .page_size = args.kv.page_size,
                       .kv_dim = args.kv.kv_dim,
                       .out = args.out,
                       .n_head = args.n_head,
                       .group = group,
                       .q_scale = args.scale * kLog2e,
                       .split_vectors = split_vectors,
                       .tiles_per_span = static_cast<int>(tiles)};
  constexpr size_t smem = Smem<D>::kBytes;
  // A function attribute, not a stream operation: allowed while a graph is captured.
  QWENRT_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  attention_prefill_kernel<D>
      <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(step.n_spans),
              static_cast<unsigned>(args.n_head_kv)),
         kThreads, smem, stream>>>(pa);
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_prefill(const DeviceStep& step, const AttentionArgs& args, int split_vectors,
                       cudaStream_t stream) {
  // attention() checked the shapes, the alignment and the step's bounds.
  switch (args.head_dim) {
    case 64:
      launch<64>(step, args, split_vectors, stream);
      break;
    case 128:
      launch<128>(step, args, split_vectors, stream);
      break;
    default:
      launch<256>(step, args, split_vectors, stream);
      break;
  }
}

}  // namespace qwenrt::ops::cuda
