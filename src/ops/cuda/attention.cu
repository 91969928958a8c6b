// Ops::attention on the GPU (ref::attention_spans is the definition): every span's new K/V rows go
// into its slot's pages, then causal GQA attention of every query row over the slot's keys.
//
// The unit of work is a query vector: one (query row, q head) pair. The vectors of a span that
// share KV head g (its rows x the G = n_head / n_head_kv q heads of g's group, row-major) are cut
// into tiles of kTileVectors. A block takes one tile, one KV head and a range of keys, and streams
// those keys through shared memory kKeyTile at a time (cp.async, double buffered): every K/V row
// loaded serves all vectors of the tile, so the q heads of a group share each load (GQA).
//
// One kernel, two launch shapes:
//  - split: spans whose vectors fit one tile (count * G <= kTileVectors: decode rows, and the few
//    rows of a speculative / MTP check). Flash-decoding: the span's keys are cut into chunks, one
//    block each, that write unnormalised partials (acc, running max, running sum) to the
//    workspace; the last chunk of a (span, KV head) to finish merges them into out (a completion
//    counter each; without counters, or with QWENRT_CUDA_ATTN_FOLD=0, a combine launch does),
//    times sigmoid(gate) where the caller gives the attention's output gate.
//  - tiles: longer (prefill) spans. One block per tile over all the keys its rows see (causal),
//    writing out directly. By default these spans go to attention_prefill.cu's tensor-core
//    kernel instead (the same rules, tiles of 64 vectors); QWENRT_CUDA_FLASH_PREFILL=0 keeps
//    them here.
// Both launches cover every span with grids from host-known bounds (n_spans, max_span_count,
// max_tokens); a block whose span belongs to the other shape, or whose tile / chunk lies beyond
// the span's real size (read on the device), exits at once. So the launches replay correctly in
// a captured graph with new n_past, spans and page tables.
//
// The KV append is fused: keys at positions >= n_past (the step's own rows) are read from args.k /
// args.v, never from the pages, and the one block that owns a row (chunk 0 of a split span; the
// tile holding the row's first vector otherwise) writes it into the pages. No block reads a page
// row that a block of the same launch writes. (Pages shared between slots are never written: the
// state store copies a shared last page before a step writes into it.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/paged_kv.cuh"
#include "ops/cuda/pdl.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kThreads = 256;     // 8 warps per block, all three kernels
constexpr int kTileVectors = 16;  // query vectors per block (a decode row of 16 heads / 2 KV = 8)
constexpr int kKeyTile = 32;      // keys per shared-memory tile: one key per lane for the scores
// split: the fewest keys one chunk takes (one key tile; min_chunk()). 32 against 64: 35B-A3B
// decode after a 512-token prompt 367.7 -> 375.3 tok/s on an H100 (twice the blocks for a short
// context; bench/results/h100-decode-fusions-2026-12-06.md).
constexpr int kMinChunk = 32;
constexpr int kMaxSplits = 128;  // split: chunks per span at most (a combine thread each)
static_assert(kMaxSplits % 32 == 0, "the merge gives each lane of a warp whole chunks");
// split: chunks are counted so that a step of few decode rows still has ~2 blocks per SM of an
// H200 (132 SMs) per KV head; batches of many rows need fewer chunks to fill the GPU.
constexpr int kSplitBlocksTarget = 256;
constexpr int kMaxGridYZ = 65535;  // the hardware limit of gridDim.y and gridDim.z

constexpr int kThreadsPerKey = kThreads / kKeyTile;  // staging: threads sharing a key's row
constexpr int kWarps = kThreads / 32;
constexpr int kSoftThreads = kThreads / kTileVectors;  // softmax: threads a vector
constexpr int kSoftKeys = kKeyTile / kSoftThreads;     // softmax: keys a thread
static_assert(kSoftKeys == 2 && kSoftThreads <= 32,
              "the softmax step: two keys a thread, in a warp");
static_assert(kThreads % kKeyTile == 0 && 64 / 4 % kThreadsPerKey == 0,
              "staging: whole keys per thread group, whole float4s per thread at D = 64");
static_assert(kTileVectors * 64 / 4 % kThreads == 0, "the query load: whole float4s per thread");
constexpr int kScoreVectors = kTileVectors / kWarps;  // score: vectors a warp, at most
static_assert(kScoreVectors == 2, "the score step gives each warp two vectors");
// PV: a thread accumulates kVpt vectors of one float4 of dims; the threads left over split the
// tile's keys (partial sums added at the end).
constexpr int kVpt = 4;

// Shared memory of the attention kernel, in floats (every array starts 16-byte aligned).
template <int D>
struct Smem {
  static constexpr int kKStride = D + 4;  // K rows padded: lanes reading different keys' float4s
                                          // hit distinct banks
  static constexpr int kPStride = kTileVectors + 4;        // probabilities [key][vector], padded
  static constexpr int kQ = 0;                             // [vector][D], pre-scaled
  static constexpr int kK = kQ + kTileVectors * D;         // [2][key][kKStride]
  static constexpr int kV = kK + 2 * kKeyTile * kKStride;  // [2][key][D]
  static constexpr int kScores = kV + 2 * kKeyTile * D;    // [vector][key]
  static constexpr int kProbs = kScores + kTileVectors * kKeyTile;  // [key][kPStride]
  static constexpr int kMax = kProbs + kKeyTile * kPStride;         // [vector] running max
  static constexpr int kSum = kMax + kTileVectors;                  // [vector] running sum
  static constexpr int kAlpha = kSum + kTileVectors;                // [vector] this tile's rescale
  static constexpr int kQPos = kAlpha + kTileVectors;               // [vector] position (int)
  static constexpr int kFloats = kQPos + kTileVectors;
  static constexpr size_t kBytes = size_t{kFloats} * 4;
};
// D = 256: 153,344 bytes, under sm_80's 163 KiB opt-in limit (one block per SM on an H200).
static_assert(Smem<256>::kBytes <= 163 * 1024, "attention tiles must fit sm_80's shared memory");
// The merge's weights in the K buffers (combine_span's scratch in the attention launch).
static_assert(kTileVectors * kMaxSplits <= 2 * kKeyTile * Smem<64>::kKStride,
              "the merge's weights fit the K buffers");

// The kernels' arguments: plain pointers and sizes.
struct KernelArgs {
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
  float scale;
  // Split partials: part_acc [n_spans, n_splits, part_rows * n_head, D] and part_ml (max, sum)
  // [n_spans, n_splits, part_rows * n_head, 2]; slot r * n_head + h for row r, q head h.
  float* part_acc;
  float* part_ml;
  int n_splits;
  int min_chunk;  // split: the fewest keys a chunk takes (whole key tiles)
  int part_rows;
  int tiles_per_span;  // tiles launch: the grid's tile bound
  // split: out times sigmoid(gate) (the gated attention's output gate; rows gate_stride floats
  // apart), or null; zeroed completion counters [n_spans, n_kv_heads] (the last chunk merges),
  // or null (the combine launch merges).
  const float* gate;
  int64_t gate_stride;
  unsigned* counters;
};

// Whether a span takes the split shape: all its vectors of one KV head fit one tile.
__device__ __forceinline__ bool is_split_span(int count, int group) {
  return count > 0 && count <= kTileVectors / group;
}

// Keys per chunk of a split span with n_kv keys: balanced over the n_splits blocks, whole key
// tiles, at least min_chunk (a short context leaves the chunks beyond it idle).
__device__ __forceinline__ int split_chunk(int n_kv, int n_splits, int min_chunk) {
  int chunk = (n_kv + n_splits - 1) / n_splits;
  chunk = (chunk + kKeyTile - 1) / kKeyTile * kKeyTile;
  return max(chunk, min_chunk);
}

// Waits until at most n of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// dot[i] = q_s[w + kWarps i] . k_row for this lane's key, i < NV (two accumulators per vector
// keep the FMA chains in flight).
template <int D, int NV>
__device__ __forceinline__ void score_dots(const float* q_s, const float* k_row, int w,
                                           float* dot) {
  float acc0[NV], acc1[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) acc0[i] = acc1[i] = 0.0f;
#pragma unroll 4
  for (int c = 0; c < D / 4; ++c) {
    const float4 kk = reinterpret_cast<const float4*>(k_row)[c];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const float4 qq = reinterpret_cast<const float4*>(q_s + (w + kWarps * i) * D)[c];
      acc0[i] = fmaf(qq.x, kk.x, acc0[i]);
      acc1[i] = fmaf(qq.y, kk.y, acc1[i]);
      acc0[i] = fmaf(qq.z, kk.z, acc0[i]);
      acc1[i] = fmaf(qq.w, kk.w, acc1[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < NV; ++i) dot[i] = acc0[i] + acc1[i];
}

// Merges the chunks of split span s for KV head g into out, all count * G vectors of the span
// by the whole block: out = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p over the span's
// active chunks p (in chunk order), times sigmoid(gate) where a gate is given. First a warp a
// vector forms the chunks' weights e^(m_p - M) / L into weight_s [kTileVectors][kMaxSplits],
// then each thread sums its float4s of the outputs over the chunks. Chunk 0 holds key 0, which
// every row sees, so M is finite; a chunk whose keys a row cannot see has m = -inf and weight 0.
// The partials are read from L2 (__ldcg): other blocks of the same launch may have written them.
template <int D>
__device__ __forceinline__ void combine_span(const KernelArgs& a, int s, int g, float* weight_s) {
  constexpr int kPerLane = kMaxSplits / 32;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, G = a.group;
  const Span sp = a.spans[s];
  const int n_vec = sp.count * G, n_kv = sp.n_past + sp.count;
  const int chunk = split_chunk(n_kv, a.n_splits, a.min_chunk);
  const int n_active = (n_kv + chunk - 1) / chunk;
  const int64_t split_stride = int64_t{a.part_rows} * a.n_head;
  const int64_t base = int64_t{s} * a.n_splits * split_stride;
  for (int v = warp; v < n_vec; v += kWarps) {
    const int64_t slot = base + int64_t{v / G} * a.n_head + g * G + v % G;
    float m[kPerLane], l[kPerLane];
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int p = lane + 32 * i;
      m[i] = -INFINITY;
      l[i] = 0.0f;
      if (p < n_active) {
        const float2 ml =
            __ldcg(reinterpret_cast<const float2*>(a.part_ml) + slot + p * split_stride);
        m[i] = ml.x;
        l[i] = ml.y;
      }
      M = fmaxf(M, m[i]);
    }
    for (int o = 16; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float e[kPerLane], L = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      e[i] = lane + 32 * i < n_active ? expf(m[i] - M) : 0.0f;
      L = fmaf(l[i], e[i], L);
    }
    for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int p = lane + 32 * i;
      if (p < n_active) weight_s[v * kMaxSplits + p] = e[i] / L;
    }
  }
  __syncthreads();
  constexpr int kDimGroups = D / 4;
  for (int idx = t; idx < n_vec * kDimGroups; idx += kThreads) {
    const int v = idx / kDimGroups, c = idx % kDimGroups;
    const int r = v / G, h = g * G + v % G;
    const int64_t slot = base + int64_t{r} * a.n_head + h;
    const float* w = weight_s + v * kMaxSplits;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int p = 0; p < n_active; ++p) {
      const float4 x =
          __ldcg(reinterpret_cast<const float4*>(a.part_acc + (slot + p * split_stride) * D) + c);
      o.x = fmaf(w[p], x.x, o.x);
      o.y = fmaf(w[p], x.y, o.y);
      o.z = fmaf(w[p], x.z, o.z);
      o.w = fmaf(w[p], x.w, o.w);
    }
    if (a.gate) {  // as sigmoid_mul computes it on the stored output
      const float4 gv = reinterpret_cast<const float4*>(
          a.gate + (int64_t{sp.begin} + r) * a.gate_stride + int64_t{h} * D)[c];
      o = make_float4(o.x * sigmoid(gv.x), o.y * sigmoid(gv.y), o.z * sigmoid(gv.z),
                      o.w * sigmoid(gv.w));
    }
    reinterpret_cast<float4*>(a.out + ((int64_t{sp.begin} + r) * a.n_head + h) * D)[c] = o;
  }
}

// One block: (tile or chunk blockIdx.x, span blockIdx.y, KV head blockIdx.z).
template <int D, bool kSplit>
__global__ void __launch_bounds__(kThreads) attention_kernel(const KernelArgs a) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  using S = Smem<D>;
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  float* q_s = smem + S::kQ;
  float* k_s = smem + S::kK;
  float* v_s = smem + S::kV;
  float* sc_s = smem + S::kScores;
  float* p_s = smem + S::kProbs;
  float* m_s = smem + S::kMax;
  float* l_s = smem + S::kSum;
  float* alpha_s = smem + S::kAlpha;
  int* qpos_s = reinterpret_cast<int*>(smem + S::kQPos);

  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int s = blockIdx.y, g = blockIdx.z, G = a.group;
  const Span sp = a.spans[s];
  const int n_kv = sp.n_past + sp.count;

  // This block's vectors [vec0, vec0 + n_vec) of the span's count * G and keys [key_begin,
  // key_end).
  int vec0, n_vec, key_begin, key_end;
  int n_chunks = 0;  // split: the span's active chunks
  bool writes_kv;
  if constexpr (kSplit) {
    if (!is_split_span(sp.count, G)) return;
    const int chunk = split_chunk(n_kv, a.n_splits, a.min_chunk);
    n_chunks = (n_kv + chunk - 1) / chunk;
    key_begin = blockIdx.x * chunk;
    if (key_begin >= n_kv) return;  // a chunk beyond this context
    key_end = min(n_kv, key_begin + chunk);
    vec0 = 0;
    n_vec = sp.count * G;
    writes_kv = blockIdx.x == 0;
  } else {
    if (sp.count == 0 || is_split_span(sp.count, G)) return;
    const int tile = a.tiles_per_span - 1 - blockIdx.x;  // the later (longer) tiles start first
    vec0 = tile * kTileVectors;
    if (vec0 >= sp.count * G) return;  // a tile beyond this span
    n_vec = min(kTileVectors, sp.count * G - vec0);
    key_begin = 0;
    key_end = sp.n_past + (vec0 + n_vec - 1) / G + 1;  // the tile's last row sees up to itself
    writes_kv = true;
  }

  // KV append of the rows this block owns: those whose first vector r * G lies in its range.
  if (writes_kv) {
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

  // Queries, pre-scaled (zero past the tile's vectors), and each vector's position. All of a
  // thread's loads are independent (float4; q rows are 16-byte aligned, attention() checks).
#pragma unroll
  for (int i = 0; i < kTileVectors * (D / 4) / kThreads; ++i) {
    const int idx = t + i * kThreads, v = idx / (D / 4), c = idx % (D / 4);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (v < n_vec) {
      const int vg = vec0 + v, r = vg / G, h = g * G + vg % G;
      x = reinterpret_cast<const float4*>(a.q + (int64_t{sp.begin} + r) * a.q_stride +
                                          int64_t{h} * D)[c];
      x = make_float4(a.scale * x.x, a.scale * x.y, a.scale * x.z, a.scale * x.w);
    }
    reinterpret_cast<float4*>(q_s)[idx] = x;
  }
  if (t < kTileVectors) {
    // -1 for a vector past the tile: every key is masked, its softmax stays at zero.
    qpos_s[t] = t < n_vec ? sp.n_past + (vec0 + t) / G : -1;
    m_s[t] = -INFINITY;
    l_s[t] = 0.0f;
  }

  // Stage key tile `it` (kKeyTile keys from key_begin + it * kKeyTile) into buffer it % 2.
  // kThreadsPerKey threads share a key: one page-table read a thread, then its share of the row's
  // float4s (a warp's copy reads 8 rows, 64 contiguous bytes each). The page-table read comes
  // first because the copies' "memory" clobber keeps loads from moving across them.
  auto stage = [&](int it) {
    const int kt = key_begin + it * kKeyTile;
    float* kd = k_s + (it & 1) * kKeyTile * S::kKStride;
    float* vd = v_s + (it & 1) * kKeyTile * D;
    const int j = t / kThreadsPerKey, pos = kt + j;
    KeyAt at{-1, false};
    if (pos < key_end) at = key_at(a, sp, pos);
    const bool valid = at.offset >= 0;
    const int64_t off = valid ? at.offset + int64_t{g} * D : 0;
    const float* ksrc = valid ? (at.fresh ? a.k : a.k_pages) + off : a.k;
    const float* vsrc = valid ? (at.fresh ? a.v : a.v_pages) + off : a.v;
#pragma unroll
    for (int i = 0; i < D / 4 / kThreadsPerKey; ++i) {
      const int c = i * kThreadsPerKey + t % kThreadsPerKey;
      cp_async16(kd + j * S::kKStride + 4 * c, valid ? ksrc + 4 * c : ksrc, valid);
      cp_async16(vd + j * D + 4 * c, valid ? vsrc + 4 * c : vsrc, valid);
    }
    cp_async_commit();
  };

  // PV accumulators: thread t keeps dims [4 dg, 4 dg + 4) of vectors [vbase, vbase + kVpt) over
  // the keys j = ks (mod n_ks) of each tile: the kRest threads of a dim group cover the tile's
  // n_vg vector groups n_ks times over (a decode row of 8 vectors at D = 256: 2 groups x 2).
  constexpr int kDimGroups = D / 4;
  constexpr int kRest = kThreads / kDimGroups;
  static_assert(kRest * kVpt >= kTileVectors, "PV: every vector has a thread of each dim group");
  const int dg = t % kDimGroups, rest = t / kDimGroups;
  const int n_vg = (n_vec + kVpt - 1) / kVpt, n_ks = kRest / n_vg;
  const int vbase = rest / n_ks * kVpt, ks = rest % n_ks;
  const bool pv = rest < n_vg * n_ks;  // this thread has vectors
  float4 acc[kVpt];
#pragma unroll
  for (int i = 0; i < kVpt; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  static_assert(kVpt * kThreads * 4 <= 2 * kKeyTile * S::kKStride,
                "the key splits' sums fit the K buffers");

  const int n_key_tiles = (key_end - key_begin + kKeyTile - 1) / kKeyTile;
  stage(0);
  for (int it = 0; it < n_key_tiles; ++it) {
    if (it + 1 < n_key_tiles) {
      stage(it + 1);  // overlaps this tile's math; its buffer was last read before the
                      // previous iteration's closing barrier
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile `it` (and, the first time, q_s / qpos_s / m_s) visible to all
    const float* kb = k_s + (it & 1) * kKeyTile * S::kKStride;
    const float* vb = v_s + (it & 1) * kKeyTile * D;
    const int kt = key_begin + it * kKeyTile;

    // Scores: lane = key, warp w takes vectors w, w + kWarps (those below n_vec).
    {
      const int mine = n_vec > warp ? (n_vec - warp + kWarps - 1) / kWarps : 0;
      float dot[kScoreVectors] = {0.0f, 0.0f};
      const float* k_row = kb + lane * S::kKStride;
      if (mine == 2) {
        score_dots<D, 2>(q_s, k_row, warp, dot);
      } else if (mine == 1) {
        score_dots<D, 1>(q_s, k_row, warp, dot);
      }
      const int pos = kt + lane;
#pragma unroll
      for (int i = 0; i < kScoreVectors; ++i) {
        const int v = warp + kWarps * i;
        if (i < mine) {
          const bool visible = pos < key_end && pos <= qpos_s[v];  // causal
          sc_s[v * kKeyTile + lane] = visible ? dot[i] : -INFINITY;
        }
      }
    }
    __syncthreads();

    // Online softmax: kSoftThreads threads per vector, kSoftKeys (2) keys each.
    {
      const int v = t / kSoftThreads, qs = t % kSoftThreads;
      const float m_old = m_s[v];
      float2 sv = make_float2(-INFINITY, -INFINITY);
      if (v < n_vec) sv = *reinterpret_cast<const float2*>(sc_s + v * kKeyTile + 2 * qs);
      float mx = fmaxf(sv.x, sv.y);
      for (int o = 1; o < kSoftThreads; o *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_old, mx);
      // No key visible yet (m_new = -inf): exp(-inf - -inf) would be NaN, so keep all at zero.
      const bool none = m_new == -INFINITY;
      const float alpha = none ? 1.0f : expf(m_old - m_new);
      const float p0 = none ? 0.0f : expf(sv.x - m_new);
      const float p1 = none ? 0.0f : expf(sv.y - m_new);
      float sum = p0 + p1;
      for (int o = 1; o < kSoftThreads; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      p_s[(2 * qs + 0) * S::kPStride + v] = p0;
      p_s[(2 * qs + 1) * S::kPStride + v] = p1;
      __syncwarp();  // the group's reads of m_s[v] above precede the write below
      if (qs == 0) {
        m_s[v] = m_new;
        l_s[v] = l_s[v] * alpha + sum;
        alpha_s[v] = alpha;
      }
    }
    __syncthreads();

    // acc = acc * alpha + P V over this thread's keys of the tile (zero-filled rows past key_end
    // have p = 0).
    if (pv) {
#pragma unroll
      for (int i = 0; i < kVpt; ++i) {
        const float al = alpha_s[vbase + i];
        acc[i].x *= al;
        acc[i].y *= al;
        acc[i].z *= al;
        acc[i].w *= al;
      }
#pragma unroll 4
      for (int j = ks; j < kKeyTile; j += n_ks) {
        const float4 vv = reinterpret_cast<const float4*>(vb + j * D)[dg];
        const float4 p4 = *reinterpret_cast<const float4*>(p_s + j * S::kPStride + vbase);
        const float p[kVpt] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int i = 0; i < kVpt; ++i) {
          acc[i].x = fmaf(p[i], vv.x, acc[i].x);
          acc[i].y = fmaf(p[i], vv.y, acc[i].y);
          acc[i].z = fmaf(p[i], vv.z, acc[i].z);
          acc[i].w = fmaf(p[i], vv.w, acc[i].w);
        }
      }
    }
    __syncthreads();  // buffers and p_s are rewritten next iteration
  }

  // The key splits' partial sums, into the ks = 0 thread of each (dim group, vector group), in
  // split order; through the K buffers, free after the last barrier.
  if (n_ks > 1) {
    float4* red = reinterpret_cast<float4*>(k_s);
    if (pv && ks > 0) {
#pragma unroll
      for (int i = 0; i < kVpt; ++i) red[(i * kRest + rest) * kDimGroups + dg] = acc[i];
    }
    __syncthreads();
    if (pv && ks == 0) {
      for (int k2 = 1; k2 < n_ks; ++k2) {
#pragma unroll
        for (int i = 0; i < kVpt; ++i) {
          const float4 x = red[(i * kRest + rest + k2) * kDimGroups + dg];
          acc[i].x += x.x;
          acc[i].y += x.y;
          acc[i].z += x.z;
          acc[i].w += x.w;
        }
      }
    }
  }
  // Results of the tile's vectors (m_s / l_s final after the last barrier).
  if (pv && ks == 0) {
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int v = vbase + i;
      if (v >= n_vec) break;
      const int vg = vec0 + v, r = vg / G, h = g * G + vg % G;
      if constexpr (kSplit) {
        const int64_t slot = (int64_t{s} * a.n_splits + blockIdx.x) * a.part_rows * a.n_head +
                             int64_t{r} * a.n_head + h;
        reinterpret_cast<float4*>(a.part_acc + slot * D)[dg] = acc[i];
        if (dg == 0) {
          a.part_ml[slot * 2] = m_s[v];
          a.part_ml[slot * 2 + 1] = l_s[v];
        }
      } else {
        const float inv = 1.0f / l_s[v];  // > 0: every row sees at least its own key
        const float4 o =
            make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
        reinterpret_cast<float4*>(a.out + ((int64_t{sp.begin} + r) * a.n_head + h) * D)[dg] = o;
      }
    }
  }
  if constexpr (kSplit) {
    if (a.counters == nullptr) return;  // the combine launch merges
    // The span's last active chunk for this KV head merges them all (its partials in L2 after
    // the fence; the K buffers are free scratch after the barrier).
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    unsigned* counter = a.counters + int64_t{s} * gridDim.z + g;
    if (t == 0) s_last = atomicAdd(counter, 1u) == static_cast<unsigned>(n_chunks - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    combine_span<D>(a, s, g, k_s);
    if (t == 0) *counter = 0;  // ready for the next launch (graph replays too)
  }
}

// The merge as its own launch (no counters, or QWENRT_CUDA_ATTN_FOLD=0): one block per (split
// span blockIdx.x, KV head blockIdx.y), combine_span's arithmetic.
template <int D>
__global__ void __launch_bounds__(kThreads) combine_kernel(const KernelArgs a) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  __shared__ float weight_s[kTileVectors * kMaxSplits];
  if (!is_split_span(a.spans[blockIdx.x].count, a.group)) return;
  combine_span<D>(a, blockIdx.x, blockIdx.y, weight_s);
}

// The fewest keys a split chunk takes: kMinChunk, or QWENRT_CUDA_ATTN_MIN_CHUNK (rounded up to
// whole key tiles).
int min_chunk() {
  static const int chunk = [] {
    const char* v = std::getenv("QWENRT_CUDA_ATTN_MIN_CHUNK");
    const int c = v && *v ? std::atoi(v) : kMinChunk;
    return std::clamp((c + kKeyTile - 1) / kKeyTile * kKeyTile, kKeyTile, 1 << 20);
  }();
  return chunk;
}

// Chunks per split span: enough blocks to fill the GPU for a few decode rows, never more than a
// min_chunk()-key chunk of the longest context the slots can hold. Host-known bounds only.
int split_count(const DeviceStep& step) {
  const int64_t by_length = std::max<int64_t>(1, (step.max_tokens + min_chunk() - 1) / min_chunk());
  const int64_t by_occupancy =
      (kSplitBlocksTarget + std::max(step.n_spans, 1) - 1) / std::max(step.n_spans, 1);
  return static_cast<int>(std::clamp<int64_t>(std::min(by_length, by_occupancy), 1, kMaxSplits));
}

// Rows of a split span, at most (the partials' row slots).
int partial_rows(const DeviceStep& step) {
  return static_cast<int>(std::clamp<int64_t>(step.max_span_count, 1, kTileVectors));
}

// Whether prefill spans take the tensor-core kernel (the default) or the fp32 tiles below
// (QWENRT_CUDA_FLASH_PREFILL=0: the f16 path is new; read per call, tests switch it).
bool flash_prefill() {
  const char* v = std::getenv("QWENRT_CUDA_FLASH_PREFILL");
  return !(v && std::string(v) == "0");
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether the last chunk merges the split spans' chunks (the default) or a combine launch does
// (QWENRT_CUDA_ATTN_FOLD=0; read per call, tests switch it).
bool fold_combine() {
  const char* v = std::getenv("QWENRT_CUDA_ATTN_FOLD");
  return !(v && std::string(v) == "0");
}

template <int D>
void launch(const DeviceStep& step, const AttentionArgs& args, void* workspace,
            const AttentionOutput& output, cudaStream_t stream) {
  const bool fold = output.counters != nullptr && fold_combine();
  const int group = args.n_head / args.n_head_kv;
  const int n_splits = split_count(step);
  const int part_rows = partial_rows(step);
  float* part_acc = static_cast<float*>(workspace);
  float* part_ml = part_acc + int64_t{step.n_spans} * n_splits * part_rows * args.n_head * D;
  // Tile bound of the tiles launch: the vectors of the longest possible span.
  const int64_t tiles = (step.max_span_count * group + kTileVectors - 1) / kTileVectors;
  const KernelArgs ka{.spans = step.spans,
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
                      .scale = args.scale,
                      .part_acc = part_acc,
                      .part_ml = part_ml,
                      .n_splits = n_splits,
                      .min_chunk = min_chunk(),
                      .part_rows = part_rows,
                      .tiles_per_span = static_cast<int>(tiles),
                      .gate = output.gate,
                      .gate_stride = output.gate_stride,
                      .counters = fold ? output.counters : nullptr};
  constexpr size_t smem = Smem<D>::kBytes;
  // The opt-in above 48 KiB is a function attribute, not a stream operation (no synchronisation,
  // allowed while a graph is captured); setting it every call keeps it right on every device.
  QWENRT_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<D, true>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const unsigned n_spans = static_cast<unsigned>(step.n_spans);
  const unsigned n_kv_heads = static_cast<unsigned>(args.n_head_kv);
  launch_dependent(attention_kernel<D, true>,
                   dim3(static_cast<unsigned>(n_splits), n_spans, n_kv_heads), kThreads, smem,
                   stream, ka);
  QWENRT_CUDA_CHECK_LAUNCH();
  if (!fold) {
    launch_dependent(combine_kernel<D>, dim3(n_spans, n_kv_heads), kThreads, 0, stream, ka);
    QWENRT_CUDA_CHECK_LAUNCH();
  }
  // Only when a span may be too long for the split shape: on tensor cores (attention_prefill.cu),
  // or this file's fp32 tiles with QWENRT_CUDA_FLASH_PREFILL=0.
  if (step.max_span_count > kTileVectors / group) {
    if (flash_prefill()) {
      attention_prefill(step, args, kTileVectors, stream);
    } else {
      QWENRT_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<D, false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      attention_kernel<D, false>
          <<<dim3(static_cast<unsigned>(tiles), n_spans, n_kv_heads), kThreads, smem, stream>>>(ka);
      QWENRT_CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace

int64_t attention_workspace_bytes(const DeviceStep& step, int n_head, int head_dim) {
  if (step.n == 0 || step.n_spans == 0) return 0;
  return int64_t{step.n_spans} * split_count(step) * partial_rows(step) * n_head * (head_dim + 2) *
         4;
}

bool attention_gate_fits(const DeviceStep& step, const AttentionArgs& args, const float* gate,
                         int64_t gate_stride) {
  return args.n_head_kv > 0 && args.n_head % args.n_head_kv == 0 &&
         step.max_span_count <= kTileVectors / (args.n_head / args.n_head_kv) && aligned16(gate) &&
         gate_stride % 4 == 0;
}

int64_t attention_counters(const DeviceStep& step, const AttentionArgs& args) {
  return int64_t{step.n_spans} * args.n_head_kv;
}

void attention(const DeviceStep& step, const AttentionArgs& args, void* workspace,
               cudaStream_t stream, const AttentionOutput& output) {
  const std::string where = "cuda attention: ";
  if (output.gate && !attention_gate_fits(step, args, output.gate, output.gate_stride)) {
    cuda_fail(where +
              "an output gate needs every span in the split shape, a 16-byte aligned "
              "gate and a gate stride of whole float4s");
  }
  if (args.n_head_kv <= 0 || args.n_head <= 0 || args.n_head % args.n_head_kv != 0) {
    cuda_fail(where + "n_head " + std::to_string(args.n_head) + " is not a multiple of n_head_kv " +
              std::to_string(args.n_head_kv));
  }
  if (args.head_dim != 64 && args.head_dim != 128 && args.head_dim != 256) {
    cuda_fail(where + "head_dim " + std::to_string(args.head_dim) +
              " is not supported (64, 128 or 256)");
  }
  if (args.kv.kv_dim != int64_t{args.n_head_kv} * args.head_dim) {
    cuda_fail(where + "the KV pool rows hold " + std::to_string(args.kv.kv_dim) +
              " floats, expected n_head_kv * head_dim = " +
              std::to_string(int64_t{args.n_head_kv} * args.head_dim));
  }
  if (args.kv.page_size <= 0) {
    cuda_fail(where + "page_size " + std::to_string(args.kv.page_size) + " must be positive");
  }
  if (step.n == 0 || step.n_spans == 0) return;
  if (step.n_spans > kMaxGridYZ || args.n_head_kv > kMaxGridYZ) {
    cuda_fail(where + std::to_string(step.n_spans) + " spans or " + std::to_string(args.n_head_kv) +
              " KV heads exceed the grid limit of " + std::to_string(kMaxGridYZ));
  }
  if (step.max_span_count <= 0 || step.max_tokens <= 0) {
    cuda_fail(where + "the step's bounds max_span_count " + std::to_string(step.max_span_count) +
              " and max_tokens " + std::to_string(step.max_tokens) + " must be positive");
  }
  // float4 and cp.async access: 16-byte aligned rows (head_dim is a multiple of 4 floats).
  if (!aligned16(args.q) || args.q_stride % 4 != 0 || !aligned16(args.k) || !aligned16(args.v) ||
      !aligned16(args.kv.k) || !aligned16(args.kv.v) || !aligned16(args.out) ||
      !aligned16(workspace)) {
    cuda_fail(where +
              "q (and its row stride), k, v, the KV pools, out and the workspace must be 16-byte "
              "aligned");
  }
  switch (args.head_dim) {
    case 64:
      launch<64>(step, args, workspace, output, stream);
      break;
    case 128:
      launch<128>(step, args, workspace, output, stream);
      break;
    default:
      launch<256>(step, args, workspace, output, stream);
      break;
  }
}

}  // namespace qwenrt::ops::cuda
