// The Gated DeltaNet core on the GPU (ref::deltanet_spans; SPEC: Gated DeltaNet steps 2-6) for
// every span of a step, decode rows and prefill spans alike, in two launches:
//
//   1. conv_silu_kernel: the causal depthwise conv1d + SiLU of every channel of every row, with
//      the slot's conv state (read, then shifted), into the workspace `mixed` [n, C].
//   2. delta_rule_kernel: one block per (span, V head) runs the recurrence over the span's tokens
//      with the head's [D, D] state in registers: L2 norms of q and k, the gates, the delta rule,
//      and the gated RMSNorm, straight into out.
//
// Why two launches and not one: the q and k channels of K head hk feed every V head h with
// h % Hk == hk, so in one launch Hv/Hk blocks would read those channels' conv state while one of
// them shifts it, and a launch has no ordering between blocks (a cooperative or cluster launch
// would, at the price of an sm_90-only path). The alternative, one block per K head with all of
// its V heads, leaves 16 blocks (of 132 SMs) moving 128-192 KiB each for a single decode row.
// The extra kernel boundary costs about 1 us per layer (NOTES-gpu.md); the conv launch itself
// moves n * C * 8 bytes.
//
// Both kernels are exact (no chunking): they run the recurrence token by token. Spans of 64 tokens
// or more take the chunked form instead (deltanet_chunked.cu; QWENRT_CUDA_CHUNKED=0 turns it
// off), except in a step that keeps states for a speculative check.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/deltanet_chunked.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {
namespace {

using chunked::output_gate;  // the gated norm's silu(z), or sigmoid(z) for qwen4exp

// One output of the causal conv + SiLU: taps w against the window win (oldest input first).
// Both the conv launch and the delta rule with the conv folded in use it: the same values.
template <int K>
__device__ __forceinline__ float conv_silu(const float (&w)[K], const float (&win)[K]) {
  float acc = 0;
#pragma unroll
  for (int j = 0; j < K; ++j) acc = fmaf(w[j], win[j], acc);
  return silu(acc);
}

// ---- 1. conv1d + SiLU ----
// Thread = channel, block = 128 channels x a tile of kConvRows consecutive rows (the rows of any
// spans: a tile of decode rows covers up to 16 spans, a prefill span covers many tiles). The grid
// depends on n and C only; a block finds its spans from the device span array.
//
// Conv state ownership, the one subtle point: token t of a span reads the old state when t < K-1,
// and the new state is the last K-1 inputs. So the tile where a span starts processes that span's
// tokens 0 .. max(tile end, K-1) (past its tile end if need be), and then writes the new state;
// other tiles skip the span's first K-1 tokens. The old state is thus read and replaced by one
// thread, with nobody else touching it.
constexpr int kConvThreads = 128;
constexpr int kConvRows = 16;
constexpr int kMaxConvK = 8;

template <int K>
__global__ void __launch_bounds__(kConvThreads, 4)  // 4: ptxas spills at its own default
    conv_silu_kernel(const Span* __restrict__ spans, int n_spans, int64_t n,
                     const float* __restrict__ x, const float* __restrict__ kernel,
                     float* __restrict__ conv_state, float* __restrict__ mixed, int64_t C) {
  pdl_launch_dependents();
  pdl_wait();  // launched dependent (pdl.cuh): before any read
  __shared__ int s_first;
  __shared__ Span s_spans[kConvRows];  // the spans intersecting this tile; count 0 ends the list
  const int64_t r0 = int64_t{blockIdx.y} * kConvRows;
  const int64_t r1 = r0 + kConvRows < n ? r0 + kConvRows : n;
  // The span holding row r0: spans cover [0, n) in order, so exactly one thread finds it (the
  // default only guards against a malformed layout: the tile then processes nothing).
  if (threadIdx.x == 0) s_first = n_spans;
  __syncthreads();
  for (int s = threadIdx.x; s < n_spans; s += blockDim.x) {
    const Span sp = spans[s];
    if (sp.begin <= r0 && r0 < int64_t{sp.begin} + sp.count) s_first = s;
  }
  __syncthreads();
  if (threadIdx.x < kConvRows) {
    const int s = s_first + threadIdx.x;
    Span sp{};
    if (s < n_spans) sp = spans[s];
    if (s >= n_spans || sp.begin >= r1) sp.count = 0;
    s_spans[threadIdx.x] = sp;
  }
  __syncthreads();

  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w[K];  // ggml [K, C]: channel c's taps are contiguous, oldest input first
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = kernel[c * K + j];
  for (int i = 0; i < kConvRows && s_spans[i].count > 0; ++i) {
    const Span sp = s_spans[i];
    const int64_t begin = sp.begin, count = sp.count;
    const bool starts_here = begin >= r0;
    const int64_t t_lo = starts_here ? 0 : (r0 - begin > K - 1 ? r0 - begin : K - 1);
    const int64_t tile_end = r1 - begin;
    const int64_t t_hi_want = starts_here && tile_end < K - 1 ? K - 1 : tile_end;
    const int64_t t_hi = t_hi_want < count ? t_hi_want : count;
    if (t_lo >= t_hi && !starts_here) continue;
    float* state = conv_state + int64_t{sp.slot} * (K - 1) * C + c;
    // win[j] = input at window position t_lo + j, where positions 0..K-2 are the old state and
    // position p >= K-1 is the span's row p - (K-1).
    float win[K];
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      const int64_t p = t_lo + j;
      win[j] = p < K - 1 ? state[p * C] : x[(begin + p - (K - 1)) * C + c];
    }
    for (int64_t t = t_lo; t < t_hi; ++t) {
      win[K - 1] = x[(begin + t) * C + c];
      mixed[(begin + t) * C + c] = conv_silu(w, win);
#pragma unroll
      for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
    }
    if (starts_here) {
      // The new state: window positions count .. count + K-2. When this thread processed the
      // whole span they are in win; otherwise the span has more than K-1 rows and they are its
      // last K-1 inputs.
#pragma unroll
      for (int j = 0; j < K - 1; ++j) {
        state[j * C] = t_hi == count ? win[j] : x[(begin + count - (K - 1) + j) * C + c];
      }
    }
  }
}

// ---- 2. the delta rule and the gated norm ----
// Block = (V head h, span), kParts * D threads: thread (p, j) owns value column j of the head's
// state S [D (key)][D (value)] for keys p*R .. p*R + R-1 (R = D / kParts). A warp is 32
// consecutive columns of one key slice, so every state load and store is a coalesced 128-byte
// row segment. Per token:
//   A. p = 0 threads publish q_j, k_j (raw conv outputs) and sum q.q, k.k, q.k per warp; p = 1
//      threads publish v_j; thread D computes the gates; all prefetch the next token's inputs.
//   B. each thread forms its partial S^T k and S^T q over its R keys (old state, raw q, k).
//   C. the kParts partials of column j are summed (fixed order: identical in every part), then
//        kv_mem = exp(g) S^T k^,  d = (v - kv_mem) beta,  S = exp(g) S + k^ d^T,
//        o = S_new^T q^ / sqrt(D) = (exp(g) S^T q^ + d (k^.q^)) / sqrt(D)
//      (the last form reads the old state, so one reduction serves both products; it is the
//      reference's o = S^T q after the update, up to fp32 rounding), and p = 0 sums o^2 per warp.
//   D. p = 0 threads write out_j = o_j / rms(o) * norm_j * silu(z_j) (sigmoid(z_j) with
//      sigmoid_gate).
// Three __syncthreads per token; the shared buffers of phases A-C are not reused before the
// barrier that follows their last read (see the comments at each barrier).
//
// kR > 0: the state lives in registers for the whole span (D = kParts * kR <= 128: 32 floats per
// thread at D = 128, 512 threads, 64 KiB per block). kR == 0: D > 128, whose 256 KiB state does
// not fit one SM; the state stays in global memory and is read twice and written once per token
// (only this block touches it), slower but exact. No shipped model has D > 128.
constexpr int kParts = 4;
constexpr int kMaxD = 256;
constexpr int kFusedConvK = 4;  // the conv taps the folded conv is built for (Qwen3.5's)

struct DeltaParams {
  const Span* spans;
  const float* mixed;  // [n, C] conv + SiLU outputs: q [Hk D] | k [Hk D] | v [Hv D] per row
  const float* z;      // [n, Hv D]
  const float* alpha;  // [n, Hv]
  const float* beta;   // [n, Hv]
  const float* dt_bias;
  const float* a;
  const float* norm;   // [D]
  float* delta_state;  // [n_slots, Hv, D, D]
  // The state after each row but the last of keep_states spans (RecurrentLayer's history):
  // [n_slots, history_rows, Hv, D, D].
  float* delta_history;
  int history_rows;
  float* out;  // [n, Hv D]
  int64_t C;
  int n_k_heads, n_v_heads, head_dim;
  float eps;
  bool sigmoid_gate;  // qwen4exp: sigmoid(z), not silu(z)
  // The conv folded in (delta_rule_kernel<kR, CK> with CK > 0, decode steps): the raw
  // projection qkv [n, C] instead of mixed, the taps [C, CK] and the conv state
  // [n_slots, CK - 1, C]; counters: n_spans * n_k_heads zeroed completion counters.
  const float* qkv;
  const float* conv_w;
  float* conv_state;
  unsigned* counters;
  bool early_reads;  // unless QWENRT_CUDA_DELTA_EARLY=0 (delta_rule_kernel)
};

// Conv folded in (CK > 0: the conv's taps; every span of the step has at most one row): the
// block computes the conv + SiLU of the channels it reads with conv_silu_kernel's conv_silu (so
// the same values), from the slot's conv state and the raw projection. It owns
// its V head's v channels and shifts their state at once. The q and k channels of K head hk are
// read by all Hv / Hk blocks of its V heads, so the last of those blocks to have read them (a
// completion counter a span and K head) shifts theirs, after the others' reads.
template <int kR, int CK>
__global__ void __launch_bounds__(kR > 0 ? kParts * kParts * kR : kParts * kMaxD)
    delta_rule_kernel(const DeltaParams prm) {
  pdl_launch_dependents();
  // Launched dependent (pdl.cuh): nothing is read before the wait, unless early_reads: then the
  // slot's state, the conv taps and the conv state are read first (written only by this layer's
  // delta rule of an earlier step, which ended before the step began: the host waits for each
  // step's sampling), so their latency hides behind the kernels before this one.
  if (!prm.early_reads) pdl_wait();
  __shared__ float s_q[kMaxD], s_k[kMaxD], s_v[kMaxD];
  __shared__ float s_norms[3][kMaxD / 32];   // per-warp q.q, k.k, q.k of the current token
  __shared__ float s_red[2][kParts][kMaxD];  // per-part S^T k, S^T q
  __shared__ float s_o2[kMaxD / 32];         // per-warp o.o
  __shared__ float s_gate[2];                // exp(g), beta

  const int D = kR > 0 ? kParts * kR : prm.head_dim;
  const int R = kR > 0 ? kR : D / kParts;
  const int h = blockIdx.x, Hv = prm.n_v_heads, hk = h % prm.n_k_heads;
  const int j = threadIdx.x % D, p = threadIdx.x / D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;  // warps < D/32 have p = 0
  const Span span = prm.spans[blockIdx.y];
  const int64_t C = prm.C, nk = int64_t{prm.n_k_heads} * D, nv = int64_t{Hv} * D;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float* S = prm.delta_state + (int64_t{span.slot} * Hv + h) * D * D + int64_t{p} * R * D + j;

  float st[kR > 0 ? kR : 1];
  if constexpr (kR > 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) st[r] = S[int64_t{r} * D];
  }

  // The next token's inputs, fetched one token ahead so their latency hides behind the current
  // token's math: p = 0 holds q_j, k_j, z_j; p = 1 holds v_j; thread D holds the gate logits.
  float next_q = 0, next_k = 0, next_z = 0, next_v = 0, next_alpha = 0, next_beta = 0;
  auto fetch = [&](int64_t row) {
    const float* m = prm.mixed + row * C;
    if (p == 0) {
      next_q = m[int64_t{hk} * D + j];
      next_k = m[nk + int64_t{hk} * D + j];
      next_z = prm.z[row * nv + int64_t{h} * D + j];
    } else if (p == 1) {
      next_v = m[2 * nk + int64_t{h} * D + j];
      if (j == 0) {
        next_alpha = prm.alpha[row * Hv + h];
        next_beta = prm.beta[row * Hv + h];
      }
    }
  };
  // Conv folded in: this thread's channels (q and k for p = 0, v for p = 1): their taps and
  // windows (the old state, then the new input).
  constexpr int kW = CK > 0 ? CK : 1;
  float q_win[kW], k_win[kW], v_win[kW], w0[kW], w1[kW];  // w0: q or v taps, w1: k taps
  const int64_t q_ch = int64_t{hk} * D + j, k_ch = nk + q_ch, v_ch = 2 * nk + int64_t{h} * D + j;
  __shared__ bool s_last;  // this block shifts the q and k channels' conv state
  auto conv_taps_and_state = [&] {
    const float* state = prm.conv_state + int64_t{span.slot} * (CK - 1) * C;
    auto load = [&](int64_t ch, float(&w)[kW], float(&win)[kW]) {
#pragma unroll
      for (int i = 0; i < CK; ++i) w[i] = prm.conv_w[ch * CK + i];
#pragma unroll
      for (int i = 0; i < CK - 1; ++i) win[i] = state[i * C + ch];
    };
    if (p == 0) {
      load(q_ch, w0, q_win);
      load(k_ch, w1, k_win);
    } else if (p == 1) {
      load(v_ch, w0, v_win);
    }
  };
  auto fetch_conv = [&](int64_t row) {
    const float* x = prm.qkv + row * C;
    if (p == 0) {
      q_win[CK - 1] = x[q_ch];
      k_win[CK - 1] = x[k_ch];
      next_q = conv_silu(w0, q_win);
      next_k = conv_silu(w1, k_win);
      next_z = prm.z[row * nv + int64_t{h} * D + j];
    } else if (p == 1) {
      v_win[CK - 1] = x[v_ch];
      next_v = conv_silu(w0, v_win);
      float* st = prm.conv_state + int64_t{span.slot} * (CK - 1) * C + v_ch;
#pragma unroll
      for (int i = 0; i < CK - 1; ++i) st[i * C] = v_win[i + 1];
      if (j == 0) {
        next_alpha = prm.alpha[row * Hv + h];
        next_beta = prm.beta[row * Hv + h];
      }
    }
  };
  if constexpr (CK > 0) {
    if (span.count > 0) conv_taps_and_state();
  }
  if (prm.early_reads) pdl_wait();
  if (span.count > 0) {
    if constexpr (CK > 0) {
      fetch_conv(span.begin);
    } else {
      fetch(span.begin);
    }
  }
  const float dt_bias = prm.dt_bias[h], a = prm.a[h];

  for (int t = 0; t < span.count; ++t) {
    const int64_t row = int64_t{span.begin} + t;
    // A. Publish this token's inputs. (The previous token's readers of these buffers all passed
    // barrier 3 of that token.)
    float z = 0;
    if (p == 0) {
      s_q[j] = next_q;
      s_k[j] = next_k;
      z = next_z;
      const float qq = warp_sum(next_q * next_q), kk = warp_sum(next_k * next_k),
                  qk = warp_sum(next_q * next_k);
      if (lane == 0) {
        s_norms[0][warp] = qq;
        s_norms[1][warp] = kk;
        s_norms[2][warp] = qk;
      }
    } else if (p == 1) {
      s_v[j] = next_v;
      if (j == 0) {
        const float x = next_alpha + dt_bias;
        const float softplus = x > 20.0f ? x : log1pf(expf(x));
        s_gate[0] = expf(a * softplus);
        s_gate[1] = 1.0f / (1.0f + expf(-next_beta));
      }
    }
    if (t + 1 < span.count) fetch(row + 1);
    __syncthreads();  // 1: inputs published
    if constexpr (CK > 0) {
      // Every thread's conv state reads are done (their values are published above).
      if (threadIdx.x == 0) {
        __threadfence();
        unsigned* counter = prm.counters + int64_t{blockIdx.y} * prm.n_k_heads + hk;
        s_last = atomicAdd(counter, 1u) == static_cast<unsigned>(Hv / prm.n_k_heads - 1);
        if (s_last) *counter = 0;  // ready for the next launch (graph replays too)
      }
    }

    // B. Partial products over this thread's keys, from the old state and the raw q, k.
    float qq = 0, kk = 0, qk = 0;
    for (int w = 0; w < D / 32; ++w) {
      qq += s_norms[0][w];
      kk += s_norms[1][w];
      qk += s_norms[2][w];
    }
    const float inv_q = 1.0f / fmaxf(sqrtf(qq), prm.eps), inv_k = 1.0f / fmaxf(sqrtf(kk), prm.eps);
    const float decay = s_gate[0], beta = s_gate[1];
    const float* kp = s_k + p * R;
    const float* qp = s_q + p * R;
    float pk = 0, pq = 0;
    if constexpr (kR > 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        pk = fmaf(st[r], kp[r], pk);
        pq = fmaf(st[r], qp[r], pq);
      }
    } else {
      for (int r = 0; r < R; ++r) {
        const float s = S[int64_t{r} * D];
        pk = fmaf(s, kp[r], pk);
        pq = fmaf(s, qp[r], pq);
      }
    }
    s_red[0][p][j] = pk;
    s_red[1][p][j] = pq;
    __syncthreads();  // 2: partials published (s_norms, s_gate are not written again before 1)

    // C. The update of column j, and o_j.
    float sk = 0, sq = 0;
#pragma unroll
    for (int i = 0; i < kParts; ++i) {
      sk += s_red[0][i][j];
      sq += s_red[1][i][j];
    }
    const float kv_mem = decay * sk * inv_k;
    const float d = (s_v[j] - kv_mem) * beta;
    if constexpr (kR > 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r) st[r] = fmaf(kp[r] * inv_k, d, st[r] * decay);
    } else {
      for (int r = 0; r < R; ++r) {
        float* s = S + int64_t{r} * D;
        *s = fmaf(kp[r] * inv_k, d, *s * decay);
      }
    }
    if (span.keep_states && t + 1 < span.count && t < prm.history_rows) {
      // This thread's part of the state after row t, at the same offsets in the history row.
      float* H = prm.delta_history +
                 ((int64_t{span.slot} * prm.history_rows + t) * Hv + h) * D * D +
                 int64_t{p} * R * D + j;
      if constexpr (kR > 0) {
#pragma unroll
        for (int r = 0; r < kR; ++r) H[int64_t{r} * D] = st[r];
      } else {
        for (int r = 0; r < R; ++r) H[int64_t{r} * D] = S[int64_t{r} * D];
      }
    }
    float o = 0;
    if (p == 0) {
      o = (decay * sq * inv_q + d * (qk * inv_q * inv_k)) * scale;
      const float oo = warp_sum(o * o);
      if (lane == 0) s_o2[warp] = oo;
    }
    __syncthreads();  // 3: o.o published; s_q, s_k, s_v, s_red are free for the next token

    // D. The gated RMSNorm of the head's output row. (s_o2 is next written after barrier 2 of
    // the next token, which every thread reaches only after this read.)
    if (p == 0) {
      float oo = 0;
      for (int w = 0; w < D / 32; ++w) oo += s_o2[w];
      const float inv_rms = 1.0f / sqrtf(oo / D + prm.eps);
      prm.out[row * nv + int64_t{h} * D + j] =
          output_gate(z, prm.sigmoid_gate) * (o * inv_rms * prm.norm[j]);
    }
  }

  if constexpr (kR > 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) S[int64_t{r} * D] = st[r];
  }
  if constexpr (CK > 0) {
    // s_last was set before barrier 2 of the (only) token.
    if (span.count > 0 && s_last && p == 0) {
      float* st = prm.conv_state + int64_t{span.slot} * (CK - 1) * C + int64_t{hk} * D + j;
#pragma unroll
      for (int i = 0; i < CK - 1; ++i) {
        st[i * C] = q_win[i + 1];
        st[nk + i * C] = k_win[i + 1];
      }
    }
  }
}

const float* f32_device_data(const Weight& w, int64_t elements, const char* what) {
  if (w.view.dtype != DType::F32 || w.view.n_elements() != elements) {
    cuda_fail(std::string("deltanet: tensor '") + w.name + "' (" + what + "): expected F32 with " +
              std::to_string(elements) + " elements, got " + std::to_string(w.view.n_elements()));
  }
  return static_cast<const float*>(w.view.data);
}

int64_t channels(const DeltaNetArgs& args) {
  return 2 * int64_t{args.n_k_heads} * args.head_dim + int64_t{args.n_v_heads} * args.head_dim;
}

// The conv state after each row r < min(count - 1, history_rows) of every keep_states span: the
// last K-1 inputs up to row r (oldest first), from the slot's state before the step and the
// span's rows. Runs before the conv kernel shifts the state. Thread = channel; grid (channel
// blocks, spans, history rows); blocks of other spans exit.
__global__ void __launch_bounds__(kConvThreads)
    conv_history_kernel(const Span* __restrict__ spans, const float* __restrict__ x,
                        const float* __restrict__ conv_state, float* __restrict__ history,
                        int history_rows, int K, int64_t C) {
  pdl_launch_dependents();
  const Span span = spans[blockIdx.y];
  const int r = blockIdx.z;
  const int64_t c = int64_t{blockIdx.x} * kConvThreads + threadIdx.x;
  if (!span.keep_states || r + 1 >= span.count || r >= history_rows || c >= C) return;
  const float* state = conv_state + int64_t{span.slot} * (K - 1) * C;
  float* out = history + (int64_t{span.slot} * history_rows + r) * (K - 1) * C;
  for (int j = 0; j < K - 1; ++j) {
    const int i = r + 1 + j;  // in the sequence: K-1 state rows, then the span's rows
    out[int64_t{j} * C + c] =
        i < K - 1 ? state[int64_t{i} * C + c] : x[(int64_t{span.begin} + i - (K - 1)) * C + c];
  }
}

template <int K>
void launch_conv(const DeviceStep& step, const float* qkv, const float* kernel, float* conv_state,
                 float* mixed, int64_t C, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((C + kConvThreads - 1) / kConvThreads),
                  static_cast<unsigned>((step.n + kConvRows - 1) / kConvRows));
  launch_dependent(conv_silu_kernel<K>, grid, kConvThreads, 0, stream, step.spans, step.n_spans,
                   step.n, qkv, kernel, conv_state, mixed, C);
  QWENRT_CUDA_CHECK_LAUNCH();
}

// Any D up to kMaxD (the fast kernel needs D a multiple of 32): one thread per value column j,
// the column of S in global memory, reductions through shared memory in a fixed order. Slow but
// exact; only odd test shapes take it.
__global__ void __launch_bounds__(kMaxD) delta_rule_any_d_kernel(const DeltaParams prm) {
  pdl_launch_dependents();
  __shared__ float s_q[kMaxD], s_k[kMaxD], s_red[kMaxD];
  __shared__ float s_scalar[4];  // |q|, |k| inverses, exp(g), beta
  const int D = prm.head_dim, j = threadIdx.x;
  const int h = blockIdx.x, Hv = prm.n_v_heads, hk = h % prm.n_k_heads;
  const Span span = prm.spans[blockIdx.y];
  const int64_t C = prm.C, nk = int64_t{prm.n_k_heads} * D, nv = int64_t{Hv} * D;
  const double scale = 1.0 / sqrt(static_cast<double>(D));
  float* S = prm.delta_state + (int64_t{span.slot} * Hv + h) * D * D;
  auto block_sum = [&](float v) {  // thread 0 adds in index order: deterministic
    s_red[j] = v;
    __syncthreads();
    if (j == 0) {
      double acc = 0;
      for (int i = 0; i < D; ++i) acc += double(s_red[i]);
      s_red[0] = static_cast<float>(acc);
    }
    __syncthreads();
    const float total = s_red[0];
    __syncthreads();
    return total;
  };
  for (int t = 0; t < span.count; ++t) {
    const int64_t row = span.begin + t;
    const float* m = prm.mixed + row * C;
    const float q = m[hk * D + j], k = m[nk + hk * D + j], v = m[2 * nk + h * D + j];
    const float qq = block_sum(q * q), kk = block_sum(k * k);
    if (j == 0) {
      s_scalar[0] = static_cast<float>(1.0 / fmax(sqrt(double(qq)), double(prm.eps)));
      s_scalar[1] = static_cast<float>(1.0 / fmax(sqrt(double(kk)), double(prm.eps)));
      const float x = prm.alpha[row * Hv + h] + prm.dt_bias[h];
      const float sp = x > 20.0f ? x : log1pf(expf(x));
      s_scalar[2] = expf(prm.a[h] * sp);
      s_scalar[3] = 1.0f / (1.0f + expf(-prm.beta[row * Hv + h]));
    }
    __syncthreads();
    s_q[j] = q * s_scalar[0];
    s_k[j] = k * s_scalar[1];
    __syncthreads();
    const double decay = s_scalar[2], beta = s_scalar[3];
    double sk = 0;
    for (int i = 0; i < D; ++i) {
      const float sij = static_cast<float>(S[int64_t{i} * D + j] * decay);
      S[int64_t{i} * D + j] = sij;
      sk += double(sij) * s_k[i];
    }
    const double d = (v - sk) * beta;
    double acc = 0;
    for (int i = 0; i < D; ++i) {
      const float sij = static_cast<float>(S[int64_t{i} * D + j] + double(s_k[i]) * d);
      S[int64_t{i} * D + j] = sij;
      acc += double(sij) * s_q[i];
    }
    if (span.keep_states && t + 1 < span.count && t < prm.history_rows) {
      float* H = prm.delta_history + ((int64_t{span.slot} * prm.history_rows + t) * Hv + h) * D * D;
      for (int i = 0; i < D; ++i) H[int64_t{i} * D + j] = S[int64_t{i} * D + j];
    }
    const float o = static_cast<float>(acc * scale);
    const float oo = block_sum(o * o);
    const float inv = static_cast<float>(1.0 / sqrt(double(oo) / D + prm.eps));
    const float zz = prm.z[row * nv + int64_t{h} * D + j];
    prm.out[row * nv + int64_t{h} * D + j] =
        o * inv * prm.norm[j] * output_gate(zz, prm.sigmoid_gate);
    __syncthreads();
  }
}

template <int kR>
void launch_delta(const DeviceStep& step, const DeltaParams& prm, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(prm.n_v_heads), static_cast<unsigned>(step.n_spans));
  if (prm.counters == nullptr) {
    launch_dependent(delta_rule_kernel<kR, 0>, grid, kParts * prm.head_dim, 0, stream, prm);
  } else if constexpr (kR > 0) {
    launch_dependent(delta_rule_kernel<kR, kFusedConvK>, grid, kParts * prm.head_dim, 0, stream,
                     prm);
  } else {
    cuda_fail("deltanet: the conv folds only into the kernel with the state in registers");
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

// delta_rule_kernel reads the state and the conv's taps and state before its PDL wait
// (QWENRT_CUDA_DELTA_EARLY=0: after it; docs/decisions.md has the measurement).
bool early_reads() {
  static const bool on = [] {
    const char* v = std::getenv("QWENRT_CUDA_DELTA_EARLY");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// Spans this long or longer take the chunked form (when it is enabled).
constexpr int64_t kChunkedMinTokens = 64;

bool use_chunked(const DeviceStep& step, const DeltaNetArgs& args) {
  const char* v = std::getenv("QWENRT_CUDA_CHUNKED");  // read per call: tests switch it
  const bool enabled = !(v && std::string(v) == "0");
  if (!enabled || !deltanet_chunked_supported(args.head_dim)) return false;
  if (step.deltanet_mode == DeltaNetMode::kRecurrent || step.keep_states) return false;
  return step.deltanet_mode == DeltaNetMode::kChunked || step.max_span_count >= kChunkedMinTokens;
}

// The conv folded into the delta rule: decode steps (no span longer than a row, no states kept)
// of the recurrent kernel with the state in registers, taps of kFusedConvK.
bool fused_conv(const DeviceStep& step, const DeltaNetArgs& args) {
  const int D = args.head_dim;
  return step.max_span_count == 1 && !step.keep_states && !use_chunked(step, args) &&
         args.conv.view.ne[0] == kFusedConvK && D % 32 == 0 && D <= kParts * 32;
}

int64_t mixed_bytes(const DeviceStep& step, const DeltaNetArgs& args) {
  // The conv output `mixed` [n, C], rounded up to keep whatever follows 256-byte aligned.
  return (step.n * channels(args) * int64_t{sizeof(float)} + 255) / 256 * 256;
}

}  // namespace

int64_t deltanet_fused_conv_counters(const DeviceStep& step, const DeltaNetArgs& args) {
  return fused_conv(step, args) ? int64_t{step.n_spans} * args.n_k_heads : 0;
}

int64_t deltanet_workspace_bytes(const DeviceStep& step, const DeltaNetArgs& args) {
  return mixed_bytes(step, args) +
         (use_chunked(step, args) ? deltanet_chunked_workspace_bytes(step, args) : 0);
}

void deltanet(const DeviceStep& step, const DeltaNetArgs& args, void* workspace, unsigned* counters,
              cudaStream_t stream) {
  const int D = args.head_dim, Hk = args.n_k_heads, Hv = args.n_v_heads;
  if (D <= 0 || D > kMaxD || Hk <= 0 || Hv % Hk != 0) {
    cuda_fail("deltanet: head_dim " + std::to_string(D) + " must be at most " +
              std::to_string(kMaxD) + " and n_v_heads " + std::to_string(Hv) +
              " a multiple of n_k_heads " + std::to_string(Hk));
  }
  const int64_t C = channels(args);
  const int64_t K = args.conv.view.ne[0];
  if (K < 2 || K > kMaxConvK || args.conv.view.ne[1] != C) {
    cuda_fail("deltanet: tensor '" + args.conv.name +
              "': expected [K <= " + std::to_string(kMaxConvK) + ", " + std::to_string(C) +
              "], got [" + std::to_string(args.conv.view.ne[0]) + ", " +
              std::to_string(args.conv.view.ne[1]) + "]");
  }
  const float* kernel = f32_device_data(args.conv, K * C, "ssm_conv1d");
  if (step.n == 0 || step.n_spans == 0) return;
  float* mixed = static_cast<float*>(workspace);
  const bool fuse = counters != nullptr && fused_conv(step, args);
  if (step.keep_states) {
    if (!args.state.conv_history || !args.state.delta_history || args.state.history_rows < 1)
      cuda_fail("deltanet: a span keeps its states but the layer has no history");
    const dim3 grid(static_cast<unsigned>((C + kConvThreads - 1) / kConvThreads),
                    static_cast<unsigned>(step.n_spans),
                    static_cast<unsigned>(args.state.history_rows));
    conv_history_kernel<<<grid, kConvThreads, 0, stream>>>(
        step.spans, args.qkv, args.state.conv, args.state.conv_history, args.state.history_rows,
        static_cast<int>(K), C);
    QWENRT_CUDA_CHECK_LAUNCH();
  }
  switch (fuse ? 0 : K) {
    case 0:
      break;  // the delta rule kernel runs the conv
    case 2:
      launch_conv<2>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
    case 3:
      launch_conv<3>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
    case 4:
      launch_conv<4>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
    case 5:
      launch_conv<5>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
    case 6:
      launch_conv<6>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
    case 7:
      launch_conv<7>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
    default:
      launch_conv<8>(step, args.qkv, kernel, args.state.conv, mixed, C, stream);
      break;
  }
  if (use_chunked(step, args)) {
    deltanet_chunked(step, args, mixed, C, f32_device_data(args.dt_bias, Hv, "ssm_dt.bias"),
                     f32_device_data(args.a, Hv, "ssm_a"),
                     f32_device_data(args.norm, D, "ssm_norm"),
                     static_cast<uint8_t*>(workspace) + mixed_bytes(step, args), stream);
    return;
  }
  const DeltaParams prm{.spans = step.spans,
                        .mixed = mixed,
                        .z = args.z,
                        .alpha = args.alpha,
                        .beta = args.beta,
                        .dt_bias = f32_device_data(args.dt_bias, Hv, "ssm_dt.bias"),
                        .a = f32_device_data(args.a, Hv, "ssm_a"),
                        .norm = f32_device_data(args.norm, D, "ssm_norm"),
                        .delta_state = args.state.delta,
                        .delta_history = args.state.delta_history,
                        .history_rows = args.state.history_rows,
                        .out = args.out,
                        .C = C,
                        .n_k_heads = Hk,
                        .n_v_heads = Hv,
                        .head_dim = D,
                        .eps = args.eps,
                        .sigmoid_gate = args.sigmoid_gate,
                        .qkv = args.qkv,
                        .conv_w = kernel,
                        .conv_state = args.state.conv,
                        .counters = fuse ? counters : nullptr,
                        .early_reads = early_reads()};
  if (D % 32 != 0) {
    const dim3 grid(static_cast<unsigned>(Hv), static_cast<unsigned>(step.n_spans));
    delta_rule_any_d_kernel<<<grid, D, 0, stream>>>(prm);
    QWENRT_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (D) {
    case 32:
      launch_delta<8>(step, prm, stream);
      break;
    case 64:
      launch_delta<16>(step, prm, stream);
      break;
    case 96:
      launch_delta<24>(step, prm, stream);
      break;
    case 128:
      launch_delta<32>(step, prm, stream);
      break;
    default:
      launch_delta<0>(step, prm, stream);
      break;  // 160..256: the state stays in memory
  }
}

}  // namespace qwenrt::ops::cuda
