// Qwen Sparse Attention (qwen4exp) on the GPU: ref::qsa_attention_spans for every span of a step,
// with no host round trip. Kernels, in stream order:
//   1. append: the step's k, v and raw indexer keys into their pages (the dense path, which runs
//      attention.cu's kernels and lets them append k and v, writes only the indexer keys);
//   2. pool: per span, every block of `ratio` positions complete at the span's end gets its
//      pooled key: the mean of its raw keys, rmsnorm(k_norm), NeoX rotation at the block's first
//      position (ref::qsa_append_and_pool); spans whose queries all keep every key skip it;
//   then per pass over at most kRowsPerPass query rows:
//   3. score: per query and complete block b < n_kv / ratio, the sum over indexer heads of
//      relu(q_h . pooled_b) / sqrt(dim) (one warp per block);
//   4. select: per query, the keep = budget / ratio best blocks, ties to the lower block
//      (ref::qsa_select's stable sort), by a radix select of the keep-th score over its float
//      bits, then a block-wide compaction in block order;
//   5. attend: per (query, head) causal GQA attention over the kept positions (the selected
//      blocks in order, then the incomplete tail; every position up to the query's while
//      n_kv / ratio <= keep), online softmax per warp, the warps merged in a fixed order.
// Simple rather than fast: one block per (query, head) walks its kept positions (at most
// budget + ratio - 1 of them once blocks are dropped). Scores are summed in double as ref's and
// kept as fp32: two blocks whose scores agree to ~1e-7 relative may be ordered differently than
// ref orders them.
// Grids depend on host-known bounds only (n, n_spans, the slot capacity in blocks).
#include <cstdint>
#include <string>

#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/spans.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kMaxHeadDim = 256;   // attention and indexer head dims
constexpr int kMaxIndexQ = 4096;   // index_heads * index_dim (the score kernel's shared q)
constexpr int kRowsPerPass = 256;  // query rows per score / select / attend pass
constexpr int kPoolWarps = 4;      // blocks pooled per thread block (a warp each)
constexpr int kScoreWarps = 8;     // blocks scored per thread block (a warp each)
constexpr int kSelectThreads = 256;
constexpr int kAttendWarps = 4;

struct QsaKernelArgs {
  const Span* spans;
  int n_spans;
  const int32_t* page_tables;
  int64_t page_table_stride;
  int page_size;
  const float* q;  // [n, n_head, head_dim], rows q_stride apart
  int64_t q_stride;
  const float* k;  // the step's rows [n, kv_dim]
  const float* v;
  float* kv_k;  // the pools [n_pages, page_size, kv_dim]
  float* kv_v;
  float* kv_idx;  // [n_pages, page_size, idx_dim]
  int64_t kv_dim;
  int idx_dim;
  const float* index_q;  // [n, index_heads, idx_dim]
  const float* index_k;  // [n, idx_dim]
  const float* k_norm;   // [idx_dim]
  float* out;            // [n, n_head, head_dim]
  int n_head, n_head_kv, head_dim;
  float scale;
  int index_heads, ratio, keep, n_rot;
  double theta;
  float eps;
  int64_t max_blocks;  // complete blocks a slot can hold: the pooled and score rows' length
  float* pooled;       // [n_spans, max_blocks, idx_dim]
  float* scores;       // [kRowsPerPass, max_blocks]
  int32_t* selected;   // [kRowsPerPass, keep]
};

// Row of position pos of slot `slot` in the pools, or -1 when its page is missing (the host
// reserves every page before the step; this only keeps a bad table from reading out of bounds).
__device__ __forceinline__ int64_t page_row(const QsaKernelArgs& a, int slot, int64_t pos) {
  const int32_t page = a.page_tables[slot * a.page_table_stride + pos / a.page_size];
  return page < 0 ? -1 : int64_t{page} * a.page_size + pos % a.page_size;
}

// An order-preserving map of fp32 scores to unsigned keys (larger score, larger key).
__device__ __forceinline__ unsigned key_of(float x) {
  const unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// 1. The step's rows into their pages; thread block = row (grid-stride).
__global__ void qsa_append_kernel(const QsaKernelArgs a, int64_t n, bool write_kv) {
  pdl_launch_dependents();
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const Span sp = a.spans[span_index(a.spans, a.n_spans, r)];
    const int64_t row = page_row(a, sp.slot, int64_t{sp.n_past} + (r - sp.begin));
    if (row < 0) continue;
    if (write_kv) {
      for (int64_t d = threadIdx.x; d < a.kv_dim; d += blockDim.x) {
        a.kv_k[row * a.kv_dim + d] = a.k[r * a.kv_dim + d];
        a.kv_v[row * a.kv_dim + d] = a.v[r * a.kv_dim + d];
      }
    }
    for (int d = threadIdx.x; d < a.idx_dim; d += blockDim.x)
      a.kv_idx[row * a.idx_dim + d] = a.index_k[r * a.idx_dim + d];
  }
}

// 2. Pooled keys: grid (block tiles, spans), a warp per block b. Lane l holds dims l + 32 t.
__global__ void __launch_bounds__(kPoolWarps * 32) qsa_pool_kernel(const QsaKernelArgs a) {
  pdl_launch_dependents();
  __shared__ float s_vec[kPoolWarps][kMaxHeadDim];
  const int s = blockIdx.y;
  const Span sp = a.spans[s];
  const int64_t nb = (int64_t{sp.n_past} + sp.count) / a.ratio;
  if (nb <= a.keep) return;  // every query of the span keeps every key: no scores
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = int64_t{blockIdx.x} * kPoolWarps + warp;
  if (b >= nb) return;  // whole warps; no block barrier below
  const int dim = a.idx_dim;
  float v[kMaxHeadDim / 32];
  float ss = 0;
#pragma unroll
  for (int t = 0; t < kMaxHeadDim / 32; ++t) {
    const int d = lane + 32 * t;
    v[t] = 0;
    if (d < dim) {
      double sum = 0;
      for (int j = 0; j < a.ratio; ++j) {
        const int64_t row = page_row(a, sp.slot, b * a.ratio + j);
        if (row >= 0) sum += a.kv_idx[row * dim + d];
      }
      v[t] = static_cast<float>(sum / a.ratio);
      ss += v[t] * v[t];
    }
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + a.eps);
  float* normed = s_vec[warp];
#pragma unroll
  for (int t = 0; t < kMaxHeadDim / 32; ++t) {
    const int d = lane + 32 * t;
    if (d < dim) normed[d] = v[t] * inv * a.k_norm[d];
  }
  __syncwarp();
  // NeoX rotation of the first n_rot dims at position b * ratio; the angle in double as
  // ref::rope_neox (and elementwise.cu's rope) forms it.
  const int half = a.n_rot / 2;
  const double pos = static_cast<double>(b * a.ratio);
  float* out = a.pooled + (int64_t{s} * a.max_blocks + b) * dim;
#pragma unroll
  for (int t = 0; t < kMaxHeadDim / 32; ++t) {
    const int d = lane + 32 * t;
    if (d >= dim) continue;
    if (d >= a.n_rot) {
      out[d] = normed[d];
      continue;
    }
    const int i = d < half ? d : d - half;
    const double freq = pow(a.theta, -2.0 * i / a.n_rot);
    double sn, cs;
    sincos(pos * freq, &sn, &cs);
    const double x0 = normed[i], x1 = normed[i + half];
    out[d] = static_cast<float>(d < half ? x0 * cs - x1 * sn : x0 * sn + x1 * cs);
  }
}

// 3. Scores: grid (block tiles, rows of the pass), a warp per block b.
__global__ void __launch_bounds__(kScoreWarps * 32)
    qsa_score_kernel(const QsaKernelArgs a, int64_t row0) {
  pdl_launch_dependents();
  __shared__ float s_q[kMaxIndexQ];
  const int64_t r = row0 + blockIdx.y;
  const int s = span_index(a.spans, a.n_spans, r);
  const Span sp = a.spans[s];
  const int64_t n_kv = int64_t{sp.n_past} + (r - sp.begin) + 1, nb = n_kv / a.ratio;
  const int64_t b0 = int64_t{blockIdx.x} * kScoreWarps;
  if (nb <= a.keep || b0 >= nb) return;  // the whole block: before the barrier
  const int dim = a.idx_dim, heads = a.index_heads;
  for (int e = threadIdx.x; e < heads * dim; e += blockDim.x)
    s_q[e] = a.index_q[r * heads * dim + e];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = b0 + warp;
  if (b >= nb) return;
  const float* p = a.pooled + (int64_t{s} * a.max_blocks + b) * dim;
  float pv[kMaxHeadDim / 32];
#pragma unroll
  for (int t = 0; t < kMaxHeadDim / 32; ++t) {
    const int d = lane + 32 * t;
    pv[t] = d < dim ? p[d] : 0.0f;
  }
  // In double, as ref: a head's dot near zero keeps its sign (relu), so near-zero blocks order
  // as ref orders them.
  double total = 0;
  for (int h = 0; h < heads; ++h) {
    double dot = 0;
#pragma unroll
    for (int t = 0; t < kMaxHeadDim / 32; ++t) {
      const int d = lane + 32 * t;
      if (d < dim) dot = fma(double(pv[t]), double(s_q[h * dim + d]), dot);
    }
    total += fmax(warp_sum(dot), 0.0);
  }
  float score = static_cast<float>(total / sqrt(static_cast<double>(dim)));
  if (score == 0.0f) score = 0.0f;  // -0 and +0 tie in ref's comparison: one key for both
  if (lane == 0) a.scores[int64_t{blockIdx.y} * a.max_blocks + b] = score;
}

// The number of set flags in threads before this one, and (total) in the whole block. Every
// thread of the block calls it; s_counts holds a count per warp.
__device__ int block_exclusive_count(bool flag, int* s_counts, int& total) {
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  if (lane == 0) s_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < n_warps; ++w) {
    if (w < warp) before += s_counts[w];
    total += s_counts[w];
  }
  __syncthreads();  // s_counts read by all before the next call writes it
  return before;
}

// 4. Selection: one thread block per query row of the pass. selected [row, keep] gets the kept
// blocks in ascending order.
__global__ void __launch_bounds__(kSelectThreads)
    qsa_select_kernel(const QsaKernelArgs a, int64_t row0) {
  pdl_launch_dependents();
  __shared__ unsigned s_hist[256];
  __shared__ unsigned s_prefix;
  __shared__ int s_want;
  __shared__ int s_counts[kSelectThreads / 32];
  const int64_t r = row0 + blockIdx.x;
  const Span sp = a.spans[span_index(a.spans, a.n_spans, r)];
  const int64_t n_kv = int64_t{sp.n_past} + (r - sp.begin) + 1, nb = n_kv / a.ratio;
  if (nb <= a.keep || a.keep == 0) return;  // the whole block
  const float* sc = a.scores + int64_t{blockIdx.x} * a.max_blocks;
  int32_t* sel = a.selected + int64_t{blockIdx.x} * a.keep;
  // The keep-th largest key T, most significant byte first; `want`: how many of the keys equal
  // to T are kept (the others above T all are).
  unsigned prefix = 0, mask = 0;
  int want = a.keep;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_hist[i] = 0;
    __syncthreads();
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
      const unsigned key = key_of(sc[b]);
      if ((key & mask) == prefix) atomicAdd(&s_hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned above = 0;
      int digit = 0;
      for (int bin = 255; bin >= 0; --bin) {
        if (above + s_hist[bin] >= static_cast<unsigned>(want)) {
          digit = bin;
          break;
        }
        above += s_hist[bin];
      }
      s_prefix = prefix | (static_cast<unsigned>(digit) << shift);
      s_want = want - static_cast<int>(above);
    }
    __syncthreads();
    prefix = s_prefix;
    want = s_want;
    mask |= 255u << shift;
    __syncthreads();  // s_prefix and s_want read before thread 0 writes them again
  }
  // Keys above T, then the first `want` keys equal to T in block order (ties to the lower block).
  int eq_seen = 0, kept = 0;
  for (int64_t base = 0; base < nb; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const unsigned key = b < nb ? key_of(sc[b]) : 0u;
    const bool gt = b < nb && key > prefix, eq = b < nb && key == prefix;
    int eq_total = 0, take_total = 0;
    const int eq_before = block_exclusive_count(eq, s_counts, eq_total);
    const bool take = gt || (eq && eq_seen + eq_before < want);
    const int take_before = block_exclusive_count(take, s_counts, take_total);
    if (take && kept + take_before < a.keep) sel[kept + take_before] = static_cast<int32_t>(b);
    eq_seen += eq_total;
    kept += take_total;
  }
}

// 5. Attention: grid (q heads, rows of the pass). Warp w takes kept positions w, w + kAttendWarps,
// ..., with an online softmax; lane l holds dims l + 32 t of q and of its output.
__global__ void __launch_bounds__(kAttendWarps * 32)
    qsa_attend_kernel(const QsaKernelArgs a, int64_t row0) {
  pdl_launch_dependents();
  __shared__ float s_m[kAttendWarps], s_l[kAttendWarps];
  __shared__ float s_acc[kAttendWarps][kMaxHeadDim];
  const int64_t r = row0 + blockIdx.y;
  const Span sp = a.spans[span_index(a.spans, a.n_spans, r)];
  const int64_t n_kv = int64_t{sp.n_past} + (r - sp.begin) + 1, nb = n_kv / a.ratio;
  const bool every_key = nb <= a.keep;
  const int64_t in_blocks = int64_t{a.keep} * a.ratio;
  const int64_t m = every_key ? n_kv : in_blocks + (n_kv - nb * a.ratio);
  const int32_t* sel = a.selected + int64_t{blockIdx.y} * a.keep;
  const int h = blockIdx.x, hd = a.head_dim;
  const int64_t kv_off = int64_t{h / (a.n_head / a.n_head_kv)} * hd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kT = kMaxHeadDim / 32;
  float qv[kT], acc[kT];
  const float* qh = a.q + r * a.q_stride + int64_t{h} * hd;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const int d = lane + 32 * t;
    qv[t] = d < hd ? qh[d] : 0.0f;
    acc[t] = 0;
  }
  float m_run = -INFINITY, l_run = 0;
  for (int64_t j = warp; j < m; j += kAttendWarps) {
    int64_t pos;
    if (every_key) {
      pos = j;
    } else if (j < in_blocks) {
      pos = int64_t{sel[j / a.ratio]} * a.ratio + j % a.ratio;
    } else {
      pos = nb * a.ratio + (j - in_blocks);
    }
    const int64_t row = page_row(a, sp.slot, pos);
    if (row < 0) continue;  // the whole warp
    const float* kp = a.kv_k + row * a.kv_dim + kv_off;
    const float* vp = a.kv_v + row * a.kv_dim + kv_off;
    float dot = 0;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int d = lane + 32 * t;
      if (d < hd) dot = fmaf(qv[t], kp[d], dot);
    }
    const float score = warp_sum(dot) * a.scale;
    const float m_new = fmaxf(m_run, score);
    const float correction = expf(m_run - m_new), p = expf(score - m_new);
    l_run = l_run * correction + p;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int d = lane + 32 * t;
      acc[t] = acc[t] * correction + (d < hd ? p * vp[d] : 0.0f);
    }
    m_run = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m_run;
    s_l[warp] = l_run;
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const int d = lane + 32 * t;
    if (d < hd) s_acc[warp][d] = acc[t];
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kAttendWarps; ++w) m_all = fmaxf(m_all, s_m[w]);
  float l_all = 0;
  float weight[kAttendWarps];
  for (int w = 0; w < kAttendWarps; ++w) {
    // A warp that saw no position has m = -inf and l = 0: weight 0.
    weight[w] = s_l[w] > 0 ? expf(s_m[w] - m_all) : 0.0f;
    l_all += s_l[w] * weight[w];
  }
  float* oh = a.out + (r * a.n_head + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0;
    for (int w = 0; w < kAttendWarps; ++w) o += s_acc[w][d] * weight[w];
    oh[d] = o / l_all;
  }
}

unsigned grid_rows(int64_t n) {
  return static_cast<unsigned>(n < (1 << 30) ? n : (1 << 30));
}

void check_args(const QsaArgs& a) {
  const AttentionArgs& at = a.attn;
  if (!at.kv.idx || at.kv.idx_dim != a.index_dim)
    cuda_fail("qsa_attention: the layer's KV pool holds no indexer keys of width {}", a.index_dim);
  if (a.ratio < 1 || a.budget < 0)
    cuda_fail("qsa_attention: compress ratio {} and budget {}", a.ratio, a.budget);
  if (at.head_dim < 1 || at.head_dim > kMaxHeadDim || a.index_dim < 1 ||
      a.index_dim > kMaxHeadDim) {
    cuda_fail("qsa_attention: head_dim {} and index_dim {} must be in [1, {}]", at.head_dim,
              a.index_dim, kMaxHeadDim);
  }
  if (int64_t{a.index_heads} * a.index_dim > kMaxIndexQ || a.index_heads < 1)
    cuda_fail("qsa_attention: {} indexer heads of {} exceed {} floats", a.index_heads, a.index_dim,
              kMaxIndexQ);
  if (at.n_head_kv < 1 || at.n_head % at.n_head_kv != 0)
    cuda_fail("qsa_attention: {} heads over {} KV heads", at.n_head, at.n_head_kv);
  if (a.n_rot % 2 != 0 || a.n_rot > a.index_dim || a.n_rot < 0)
    cuda_fail("qsa_attention: n_rot {} must be even and at most index_dim {}", a.n_rot,
              a.index_dim);
  if (a.k_norm.view.dtype != DType::F32 || a.k_norm.view.n_elements() != a.index_dim)
    cuda_fail("qsa_attention: tensor '{}' must be F32 with {} elements", a.k_norm.name,
              a.index_dim);
}

int64_t max_blocks_of(const DeviceStep& step, const QsaArgs& a) {
  return a.ratio > 0 ? step.max_tokens / a.ratio : 0;
}

struct WorkspaceLayout {
  int64_t pooled, scores, selected, total;
};

WorkspaceLayout layout_of(const DeviceStep& step, const QsaArgs& a) {
  auto up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t max_blocks = max_blocks_of(step, a);
  const int64_t rows = step.n < kRowsPerPass ? step.n : kRowsPerPass;
  const int64_t keep = a.ratio > 0 ? a.budget / a.ratio : 0;
  WorkspaceLayout l{};
  l.pooled = 0;
  l.scores = up(int64_t{step.n_spans} * max_blocks * a.index_dim * 4);
  l.selected = l.scores + up(rows * max_blocks * 4);
  l.total = l.selected + up(rows * keep * 4);
  return l;
}

QsaKernelArgs kernel_args(const DeviceStep& step, const QsaArgs& a) {
  const AttentionArgs& at = a.attn;
  return {.spans = step.spans,
          .n_spans = step.n_spans,
          .page_tables = step.page_tables,
          .page_table_stride = step.page_table_stride,
          .page_size = at.kv.page_size,
          .q = at.q,
          .q_stride = at.q_stride,
          .k = at.k,
          .v = at.v,
          .kv_k = at.kv.k,
          .kv_v = at.kv.v,
          .kv_idx = at.kv.idx,
          .kv_dim = at.kv.kv_dim,
          .idx_dim = static_cast<int>(at.kv.idx_dim),
          .index_q = a.index_q,
          .index_k = a.index_k,
          .k_norm = static_cast<const float*>(a.k_norm.view.data),
          .out = at.out,
          .n_head = at.n_head,
          .n_head_kv = at.n_head_kv,
          .head_dim = at.head_dim,
          .scale = at.scale,
          .index_heads = a.index_heads,
          .ratio = a.ratio,
          .keep = a.ratio > 0 ? a.budget / a.ratio : 0,
          .n_rot = a.n_rot,
          .theta = static_cast<double>(a.rope_theta),
          .eps = a.eps,
          .max_blocks = max_blocks_of(step, a),
          .pooled = nullptr,
          .scores = nullptr,
          .selected = nullptr};
}

}  // namespace

void qsa_write_index_keys(const DeviceStep& step, const QsaArgs& args, cudaStream_t stream) {
  check_args(args);
  if (step.n == 0) return;
  qsa_append_kernel<<<grid_rows(step.n), 128, 0, stream>>>(kernel_args(step, args), step.n, false);
  QWENRT_CUDA_CHECK_LAUNCH();
}

int64_t qsa_workspace_bytes(const DeviceStep& step, const QsaArgs& args) {
  return layout_of(step, args).total;
}

void qsa_attention(const DeviceStep& step, const QsaArgs& args, void* workspace,
                   cudaStream_t stream) {
  check_args(args);
  if (step.n == 0 || step.n_spans == 0) return;
  QsaKernelArgs a = kernel_args(step, args);
  const WorkspaceLayout l = layout_of(step, args);
  auto* base = static_cast<uint8_t*>(workspace);
  a.pooled = reinterpret_cast<float*>(base + l.pooled);
  a.scores = reinterpret_cast<float*>(base + l.scores);
  a.selected = reinterpret_cast<int32_t*>(base + l.selected);
  qsa_append_kernel<<<grid_rows(step.n), 128, 0, stream>>>(a, step.n, true);
  QWENRT_CUDA_CHECK_LAUNCH();
  // Blocks past a span's (or a query's) own count exit at once: the grids cover the slot
  // capacity, which stays fixed while a captured step replays over a growing context.
  const unsigned block_tiles_pool =
      static_cast<unsigned>(a.max_blocks > 0 ? (a.max_blocks + kPoolWarps - 1) / kPoolWarps : 1);
  const unsigned block_tiles_score =
      static_cast<unsigned>(a.max_blocks > 0 ? (a.max_blocks + kScoreWarps - 1) / kScoreWarps : 1);
  if (a.max_blocks > 0) {
    qsa_pool_kernel<<<dim3(block_tiles_pool, static_cast<unsigned>(step.n_spans)), kPoolWarps * 32,
                      0, stream>>>(a);
    QWENRT_CUDA_CHECK_LAUNCH();
  }
  for (int64_t row0 = 0; row0 < step.n; row0 += kRowsPerPass) {
    const int64_t rows = step.n - row0 < kRowsPerPass ? step.n - row0 : kRowsPerPass;
    if (a.max_blocks > 0) {
      qsa_score_kernel<<<dim3(block_tiles_score, static_cast<unsigned>(rows)), kScoreWarps * 32, 0,
                         stream>>>(a, row0);
      QWENRT_CUDA_CHECK_LAUNCH();
      qsa_select_kernel<<<static_cast<unsigned>(rows), kSelectThreads, 0, stream>>>(a, row0);
      QWENRT_CUDA_CHECK_LAUNCH();
    }
    qsa_attend_kernel<<<dim3(static_cast<unsigned>(args.attn.n_head), static_cast<unsigned>(rows)),
                        kAttendWarps * 32, 0, stream>>>(a, row0);
    QWENRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace qwenrt::ops::cuda
