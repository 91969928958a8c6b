// The gated delta rule over long spans in chunks of 64 tokens (the WY / UT form that
// flash-linear-attention's chunk_gated_delta_rule uses), equal to the recurrence of deltanet.cu up
// to fp32 rounding. For one V head with state S [D key][D value] at a chunk's start, tokens
// t = 0..L-1 of the chunk, normalised q^_t, k^_t, beta_t, and g_t the cumulative log decay within
// the chunk (Gamma_t = exp(g_t)):
//
//   M [t][s] = beta_t exp(g_t - g_s) (k^_t . k^_s) for s < t            (strictly lower)
//   U = (I + M)^-1 (beta v),  W = (I + M)^-1 (beta Gamma k^)             (forward substitution)
//   D = U - W S                        the chunk's new values d_t (the recurrence's d)
//   O = scale (Gamma q^ S + (P o (q^ k^T)) D),  P [t][s] = exp(g_t - g_s) for s <= t
//   S' = Gamma_L S + sum_t exp(g_L - g_t) k^_t d_t^T
//
// (unrolling d_t = beta_t (v_t - Gamma_t S^T k^_t - sum_{s<t} exp(g_t - g_s) (k^_t . k^_s) d_s)
// gives the first three lines; o_t = S_t^T q^_t and S' the others). Three launches over all spans
// of a step:
//   1. prep, block = (V head, chunk), all chunks in parallel: q^, k^ (written once per K head),
//      the gates, g, M in shared memory, U and W by forward substitution (a thread per column).
//   2. state, block = (V head, 32 value columns, span): the chunks of a span in order, the state's
//      columns in shared memory: saves each chunk's start state, D = U - W S (over U), S'.
//      Value columns of S evolve independently, so a head's state splits four ways.
//   3. output, block = (V head, chunk), all chunks in parallel: O from the saved start state and
//      D, then the gated RMSNorm into out.
// Two forms of the same three launches. By default the chunk's matrix products run on tensor
// cores (tf32 inputs, fp32 accumulation): prep's k^ k^T here, the state and output kernels in
// deltanet_chunked_tc.cu; the forward substitution and the state stay fp32 on CUDA cores.
// QWENRT_CUDA_CHUNKED_TC=0 selects this file's kernels, fp32 throughout on CUDA cores. Spans of
// any length (a short one is one partial chunk); D = 64 or 128.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ops/cuda/check.h"
#include "ops/cuda/deltanet_chunked.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {
namespace {

using chunked::ChunkParams;
using chunked::chunks_of;
using chunked::find_chunk;
using chunked::kCols;
using chunked::kL;
using chunked::kThreads;

// The chunk's [kL][kL] dot products of rows of a with rows of b (both [kL][kD + 1] in shared
// memory): thread = (row t, 16 columns s), each product handed to put(t, s, dot).
template <int kD, typename Put>
__device__ __forceinline__ void gram_rows(const float* a, const float* b, Put put) {
  static_assert(kThreads == kL * 4, "four threads a row, 16 columns each");
  const int t = threadIdx.x / 4, s_begin = (threadIdx.x % 4) * 16;
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0;
  const float* at = a + t * (kD + 1);
  for (int r = 0; r < kD; ++r) {
    const float x = at[r];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = fmaf(x, b[(s_begin + i) * (kD + 1) + r], acc[i]);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) put(t, s_begin + i, acc[i]);
}

// ---- 1. prep ----
// Row stride of k^ in shared memory: kD + 1 for the fp32 gram_rows, kD + 4 (4 mod 32) for the
// tensor-core fragment reads.
constexpr int prep_k_stride(int d, bool tc) {
  return tc ? d + 4 : d + 1;
}

// kTC: M's k^ k^T on tensor cores (tf32 inputs, fp32 accumulation), else fp32 FMA. The forward
// substitution is fp32 on CUDA cores in both.
template <int kD, bool kTC>
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(const ChunkParams p) {
  constexpr int kS = prep_k_stride(kD, kTC);
  extern __shared__ float smem[];
  float* sk = smem;          // [kL][kS] normalised k
  float* sM = sk + kL * kS;  // [kL][kL + 1]
  __shared__ float s_g[kL], s_b[kL];
  const int h = blockIdx.x, hk = h % p.Hk;
  Span span;
  int c;
  if (!find_chunk(p, blockIdx.y, span, c)) return;
  const int len = min(kL, span.count - c * kL);
  const int64_t row0 = int64_t{span.begin} + int64_t{c} * kL;
  const int64_t nk = int64_t{p.Hk} * kD;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // q^ and k^: a warp per row (q written by the V head h == hk only; k by it too).
  for (int t = warp; t < kL; t += kThreads / 32) {
    float kv[kD / 32], qv[kD / 32];
    if (t < len) {
      const float* m = p.mixed + (row0 + t) * p.C;
      float kk = 0, qq = 0;
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) {
        kv[i] = m[nk + int64_t{hk} * kD + lane + 32 * i];
        qv[i] = m[int64_t{hk} * kD + lane + 32 * i];
        kk = fmaf(kv[i], kv[i], kk);
        qq = fmaf(qv[i], qv[i], qq);
      }
      const float inv_k = 1.0f / fmaxf(sqrtf(warp_sum(kk)), p.eps);
      const float inv_q = 1.0f / fmaxf(sqrtf(warp_sum(qq)), p.eps);
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) {
        kv[i] *= inv_k;
        qv[i] *= inv_q;
      }
      if (h < p.Hk) {
        const int64_t at = ((row0 + t) * p.Hk + hk) * kD + lane;
#pragma unroll
        for (int i = 0; i < kD / 32; ++i) {
          p.k[at + 32 * i] = kv[i];
          p.q[at + 32 * i] = qv[i];
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) kv[i] = 0;
    }
#pragma unroll
    for (int i = 0; i < kD / 32; ++i) sk[t * kS + lane + 32 * i] = kv[i];
  }
  // Gates and the cumulative log decay (warp 0: lanes hold tokens lane and lane + 32).
  if (warp == 0) {
    float gl[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = lane + 32 * i;
      float g = 0, b = 0;
      if (t < len) {
        const int64_t row = row0 + t;
        const float x = p.alpha[row * p.Hv + h] + p.dt_bias[h];
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        g = p.a[h] * sp;
        b = 1.0f / (1.0f + expf(-p.beta[row * p.Hv + h]));
      }
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float y = __shfl_up_sync(0xffffffffu, g, off);
        if (lane >= off) g += y;
      }
      gl[i] = g;
      s_b[t] = b;
    }
    const float first_half = __shfl_sync(0xffffffffu, gl[0], 31);
    s_g[lane] = gl[0];
    s_g[lane + 32] = gl[1] + first_half;
  }
  __syncthreads();
  if (tid < len) p.g[(row0 + tid) * p.Hv + h] = s_g[tid];

  // M = beta_t exp(g_t - g_s) (k^ k^T) below the diagonal.
  const auto put_m = [&](int t, int s, float dot) {
    sM[t * (kL + 1) + s] = s < t ? s_b[t] * expf(s_g[t] - s_g[s]) * dot : 0.0f;
  };
  if constexpr (kTC) {
    chunked::gram_rows_tc<kD, kS>(sk, sk, put_m);
  } else {
    gram_rows<kD>(sk, sk, put_m);
  }
  __syncthreads();

  // U and W: a thread per column of [beta v | beta Gamma k^], solved down the chunk's rows.
  for (int col = tid; col < 2 * kD; col += kThreads) {
    float y[kL];
#pragma unroll
    for (int t = 0; t < kL; ++t) {
      float x = 0;
      if (t < len) {
        x = col < kD ? s_b[t] * p.mixed[(row0 + t) * p.C + 2 * nk + int64_t{h} * kD + col]
                     : s_b[t] * expf(s_g[t]) * sk[t * kS + col - kD];
      }
#pragma unroll
      for (int s = 0; s < t; ++s) x = fmaf(-sM[t * (kL + 1) + s], y[s], x);
      y[t] = x;
    }
    float* dst = col < kD ? p.u : p.w;
    const int j = col < kD ? col : col - kD;
#pragma unroll
    for (int t = 0; t < kL; ++t) {
      if (t < len) dst[((row0 + t) * p.Hv + h) * kD + j] = y[t];
    }
  }
}

// ---- 2. state ----
template <int kD>
__global__ void __launch_bounds__(kThreads) chunk_state_kernel(const ChunkParams p) {
  extern __shared__ float smem[];
  float* sW = smem;                // [kL][kD + 1]
  float* sK = sW + kL * (kD + 1);  // [kL][kD + 1]: k^_t exp(g_L - g_t)
  float* sS = sK + kL * (kD + 1);  // [kD][kCols]
  float* sDn = sS + kD * kCols;    // [kL][kCols]
  const int h = blockIdx.x, hk = h % p.Hk, col0 = blockIdx.y * kCols;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;  // column, row group (8 of them)
  int chunk_base = 0;
  for (int s = 0; s < static_cast<int>(blockIdx.z); ++s) chunk_base += chunks_of(p.spans[s]);
  const Span span = p.spans[blockIdx.z];
  const int n_chunks = chunks_of(span);
  float* S = p.delta_state + (int64_t{span.slot} * p.Hv + h) * kD * kD;
  for (int r = ty; r < kD; r += 8) sS[r * kCols + tx] = S[int64_t{r} * kD + col0 + tx];
  __syncthreads();
  for (int c = 0; c < n_chunks; ++c) {
    const int len = min(kL, span.count - c * kL);
    const int64_t row0 = int64_t{span.begin} + int64_t{c} * kL;
    float* S0 = p.s0 + (int64_t{chunk_base + c} * p.Hv + h) * kD * kD;
    for (int r = ty; r < kD; r += 8) S0[int64_t{r} * kD + col0 + tx] = sS[r * kCols + tx];
    const float g_last = p.g[(row0 + len - 1) * p.Hv + h];
    for (int t = ty; t < kL; t += 8) {
      const bool in = t < len;
      const float scale = in ? expf(g_last - p.g[(row0 + t) * p.Hv + h]) : 0.0f;
      for (int r = tx; r < kD; r += 32) {
        sW[t * (kD + 1) + r] = in ? p.w[((row0 + t) * p.Hv + h) * kD + r] : 0.0f;
        sK[t * (kD + 1) + r] = in ? scale * p.k[((row0 + t) * p.Hk + hk) * kD + r] : 0.0f;
      }
    }
    __syncthreads();
    // D = U - W S for rows ty*8 .. ty*8+7 of column tx (D goes over U).
    {
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0;
      for (int r = 0; r < kD; ++r) {
        const float s = sS[r * kCols + tx];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(sW[(ty * 8 + i) * (kD + 1) + r], s, acc[i]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int t = ty * 8 + i;
        float d = 0;
        if (t < len) {
          float* u = p.u + ((row0 + t) * p.Hv + h) * kD + col0 + tx;
          d = *u - acc[i];
          *u = d;
        }
        sDn[t * kCols + tx] = d;
      }
    }
    __syncthreads();
    // S' = exp(g_L) S + sum_t (k^_t exp(g_L - g_t)) d_t^T.
    const float decay = expf(g_last);
    for (int r = ty; r < kD; r += 8) {
      float acc = sS[r * kCols + tx] * decay;
      for (int t = 0; t < len; ++t) acc = fmaf(sK[t * (kD + 1) + r], sDn[t * kCols + tx], acc);
      sS[r * kCols + tx] = acc;
    }
    __syncthreads();
  }
  for (int r = ty; r < kD; r += 8) S[int64_t{r} * kD + col0 + tx] = sS[r * kCols + tx];
}

// ---- 3. output ----
template <int kD>
__global__ void __launch_bounds__(kThreads) chunk_output_kernel(const ChunkParams p) {
  extern __shared__ float smem[];
  float* sQ = smem;                // [kL][kD + 1]
  float* sK = sQ + kL * (kD + 1);  // [kL][kD + 1]
  float* sA = sK + kL * (kD + 1);  // [kL][kL + 1]: P o (q^ k^T), s <= t
  float* sS = sA + kL * (kL + 1);  // [kD][kCols]: a column tile of the start state
  float* sDn = sS + kD * kCols;    // [kL][kCols]: the same tile of D
  __shared__ float s_g[kL];
  const int h = blockIdx.x, hk = h % p.Hk;
  Span span;
  int c;
  if (!find_chunk(p, blockIdx.y, span, c)) return;
  const int len = min(kL, span.count - c * kL);
  const int64_t row0 = int64_t{span.begin} + int64_t{c} * kL;
  const int tid = threadIdx.x, tx = tid % 32, ty = tid / 32;
  const float* S0 = p.s0 + (int64_t{blockIdx.y} * p.Hv + h) * kD * kD;
  for (int t = ty; t < kL; t += 8) {
    const bool in = t < len;
    for (int r = tx; r < kD; r += 32) {
      const int64_t at = ((row0 + t) * p.Hk + hk) * kD + r;
      sQ[t * (kD + 1) + r] = in ? p.q[at] : 0.0f;
      sK[t * (kD + 1) + r] = in ? p.k[at] : 0.0f;
    }
  }
  if (tid < kL) s_g[tid] = tid < len ? p.g[(row0 + tid) * p.Hv + h] : 0.0f;
  __syncthreads();
  // A = exp(g_t - g_s) (q^ k^T) on and below the diagonal.
  gram_rows<kD>(sQ, sK, [&](int t, int s, float dot) {
    sA[t * (kL + 1) + s] = s <= t && t < len ? expf(s_g[t] - s_g[s]) * dot : 0.0f;
  });
  const float scale = rsqrtf(static_cast<float>(kD));
  float o[kD / kCols][8];  // unrolled tiles: o stays in registers
#pragma unroll
  for (int tile = 0; tile < kD / kCols; ++tile) {
    __syncthreads();  // sA written; the previous tile's reads of sS, sDn done
    const int col0 = tile * kCols;
    for (int r = ty; r < kD; r += 8) sS[r * kCols + tx] = S0[int64_t{r} * kD + col0 + tx];
    for (int t = ty; t < kL; t += 8)
      sDn[t * kCols + tx] = t < len ? p.u[((row0 + t) * p.Hv + h) * kD + col0 + tx] : 0.0f;
    __syncthreads();
    float qs[8], ad[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) qs[i] = ad[i] = 0;
    for (int r = 0; r < kD; ++r) {
      const float s = sS[r * kCols + tx];
#pragma unroll
      for (int i = 0; i < 8; ++i) qs[i] = fmaf(sQ[(ty * 8 + i) * (kD + 1) + r], s, qs[i]);
    }
    for (int s = 0; s < kL; ++s) {
      const float d = sDn[s * kCols + tx];
#pragma unroll
      for (int i = 0; i < 8; ++i) ad[i] = fmaf(sA[(ty * 8 + i) * (kL + 1) + s], d, ad[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) o[tile][i] = scale * (expf(s_g[ty * 8 + i]) * qs[i] + ad[i]);
  }
  // The gated RMSNorm: a row's D values are this warp's (32 lanes x kD / 32 tiles).
  const int64_t nv = int64_t{p.Hv} * kD;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int t = ty * 8 + i;
    float oo = 0;
#pragma unroll
    for (int tile = 0; tile < kD / kCols; ++tile) oo = fmaf(o[tile][i], o[tile][i], oo);
    oo = warp_sum(oo);
    if (t >= len) continue;
    const float inv_rms = 1.0f / sqrtf(oo / kD + p.eps);
    const int64_t row = row0 + t;
#pragma unroll
    for (int tile = 0; tile < kD / kCols; ++tile) {
      const int j = tile * kCols + tx;
      const float z = p.z[row * nv + int64_t{h} * kD + j];
      p.out[row * nv + int64_t{h} * kD + j] =
          chunked::output_gate(z, p.sigmoid_gate) * (o[tile][i] * inv_rms * p.norm[j]);
    }
  }
}

constexpr size_t prep_smem(int d, bool tc) {
  return sizeof(float) * (size_t(kL) * prep_k_stride(d, tc) + size_t(kL) * (kL + 1));
}
constexpr size_t state_smem(int d) {
  return sizeof(float) * (2 * size_t(kL) * (d + 1) + size_t(d) * kCols + size_t(kL) * kCols);
}
constexpr size_t output_smem(int d) {
  return sizeof(float) * (2 * size_t(kL) * (d + 1) + size_t(kL) * (kL + 1) + size_t(d) * kCols +
                          size_t(kL) * kCols);
}

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

struct Layout {
  int64_t q, k, g, u, w, s0, total;
};

Layout layout_of(const DeviceStep& step, const DeltaNetArgs& args) {
  const int64_t n = step.n, D = args.head_dim, Hk = args.n_k_heads, Hv = args.n_v_heads;
  const int64_t max_chunks = n / kL + step.n_spans;
  Layout l{};
  int64_t at = 0;
  auto take = [&](int64_t floats) {
    const int64_t here = at;
    at += align256(floats * int64_t{sizeof(float)});
    return here;
  };
  l.q = take(n * Hk * D);
  l.k = take(n * Hk * D);
  l.g = take(n * Hv);
  l.u = take(n * Hv * D);
  l.w = take(n * Hv * D);
  l.s0 = take(max_chunks * Hv * D * D);
  l.total = at;
  return l;
}

// Whether the chunk's products run on tensor cores (the default) or the fp32 kernels of this
// file (QWENRT_CUDA_CHUNKED_TC=0: the tensor-core path is new; read per call, tests switch it).
bool chunked_tensor_cores() {
  const char* v = std::getenv("QWENRT_CUDA_CHUNKED_TC");
  return !(v && std::string(v) == "0");
}

template <int kD, bool kTC>
void launch(const DeviceStep& step, const ChunkParams& prm, cudaStream_t stream) {
  // Function attributes, not stream operations: allowed while a graph is captured.
  static const bool attributes_set = [] {
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(chunk_prep_kernel<kD, kTC>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(prep_smem(kD, kTC))));
    if constexpr (!kTC) {
      QWENRT_CUDA_CHECK(cudaFuncSetAttribute(chunk_state_kernel<kD>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(state_smem(kD))));
      QWENRT_CUDA_CHECK(cudaFuncSetAttribute(chunk_output_kernel<kD>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(output_smem(kD))));
    }
    return true;
  }();
  (void)attributes_set;
  const auto max_chunks = static_cast<unsigned>(step.n / kL + step.n_spans);
  const auto Hv = static_cast<unsigned>(prm.Hv);
  chunk_prep_kernel<kD, kTC><<<dim3(Hv, max_chunks), kThreads, prep_smem(kD, kTC), stream>>>(prm);
  QWENRT_CUDA_CHECK_LAUNCH();
  if constexpr (kTC) {
    chunked::launch_state_output_tc<kD>(step, prm, stream);
  } else {
    chunk_state_kernel<kD><<<dim3(Hv, kD / kCols, static_cast<unsigned>(step.n_spans)), kThreads,
                             state_smem(kD), stream>>>(prm);
    QWENRT_CUDA_CHECK_LAUNCH();
    chunk_output_kernel<kD><<<dim3(Hv, max_chunks), kThreads, output_smem(kD), stream>>>(prm);
    QWENRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool deltanet_chunked_supported(int head_dim) {
  return head_dim == 64 || head_dim == 128;
}

int64_t deltanet_chunked_workspace_bytes(const DeviceStep& step, const DeltaNetArgs& args) {
  return layout_of(step, args).total;
}

void deltanet_chunked(const DeviceStep& step, const DeltaNetArgs& args, const float* mixed,
                      int64_t C, const float* dt_bias, const float* a, const float* norm,
                      void* workspace, cudaStream_t stream) {
  const Layout l = layout_of(step, args);
  auto* base = static_cast<uint8_t*>(workspace);
  auto at = [&](int64_t offset) { return reinterpret_cast<float*>(base + offset); };
  const ChunkParams prm{.spans = step.spans,
                        .n_spans = step.n_spans,
                        .mixed = mixed,
                        .z = args.z,
                        .alpha = args.alpha,
                        .beta = args.beta,
                        .dt_bias = dt_bias,
                        .a = a,
                        .norm = norm,
                        .delta_state = args.state.delta,
                        .out = args.out,
                        .q = at(l.q),
                        .k = at(l.k),
                        .g = at(l.g),
                        .u = at(l.u),
                        .w = at(l.w),
                        .s0 = at(l.s0),
                        .C = C,
                        .Hk = args.n_k_heads,
                        .Hv = args.n_v_heads,
                        .eps = args.eps,
                        .sigmoid_gate = args.sigmoid_gate};
  const bool tc = chunked_tensor_cores();
  if (args.head_dim == 64) {
    tc ? launch<64, true>(step, prm, stream) : launch<64, false>(step, prm, stream);
  } else if (args.head_dim == 128) {
    tc ? launch<128, true>(step, prm, stream) : launch<128, false>(step, prm, stream);
  } else {
    cuda_fail("deltanet (chunked): head_dim " + std::to_string(args.head_dim) +
              " is not 64 or 128");
  }
}

}  // namespace qwenrt::ops::cuda
