// qwen4exp's own elementwise ops on the GPU (ref/qwen4exp.cpp defines each): the grouped RMSNorm of
// the hyper-connection streams, the scaled SiLU, the hyper-connection mix and injection, the PLE
// gate, the PLE's dilated causal conv with its per-slot history, and the device half of the PLE
// embedding (the slot's remembered tokens; its rows come from the host, cuda_ops_qwen4exp.cpp).
// Every grid depends on host-known sizes only (n, n_spans, the channel count); spans are read on
// the device, so a captured step replays with new spans.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/spans.cuh"
#include "ops/cuda/warp.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;

unsigned blocks_for(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), in every thread. Warp
// sums, then warp 0's lanes add them in warp order: deterministic. s_warp: 32 floats of shared
// memory, free again when this returns.
__device__ float block_sum(float v, float* s_warp) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < n_warps; ++w) total += s_warp[w];
  __syncthreads();  // every thread has read s_warp before anyone writes it again
  return total;
}

// ---- rmsnorm_grouped: one block per (row, group) vector of dim floats ----
// In place (out == x) is safe: each thread re-reads only the elements it read itself, and every
// read of the first pass happens before the block sum.
__global__ void rmsnorm_grouped_kernel(const float* x, const float* weight, float* out,
                                       int64_t n_vectors, int groups, int64_t dim, float eps) {
  pdl_launch_dependents();
  __shared__ float s_warp[32];
  for (int64_t r = blockIdx.x; r < n_vectors; r += gridDim.x) {
    const float* xr = x + r * dim;
    const float* w = weight + (r % groups) * dim;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(block_sum(ss, s_warp) / static_cast<float>(dim) + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = xr[i] * inv * w[i];
  }
}

// ---- silu_scaled, hc_mix, hc_inject: one thread per output element ----
__global__ void silu_scaled_kernel(const float* x, float scale, float* out, int64_t n) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i] * scale;
  out[i] = v * sigmoid(v);
}

// out [n, dim] = mean over s < hc of sigmoid(gate[r, s, :]) * xn[r, s, :].
__global__ void hc_mix_kernel(const float* xn, const float* gate, float* out, int64_t n, int hc,
                              int64_t dim) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t r = i / dim, d = i % dim;
  float acc = 0;
  for (int s = 0; s < hc; ++s) {
    const int64_t at = (r * hc + s) * dim + d;
    acc += sigmoid(gate[at]) * xn[at];
  }
  out[i] = acc / static_cast<float>(hc);
}

// streams [n, hc, dim] += block[r, :] * 2 sigmoid(inject[r, s] / hc).
__global__ void hc_inject_kernel(float* streams, const float* block, const float* inject, int64_t n,
                                 int hc, int64_t dim) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n * hc * dim) return;
  const int64_t d = i % dim, rs = i / dim, r = rs / hc;
  const float w = 2.0f * sigmoid(inject[rs] / static_cast<float>(hc));
  streams[i] = streams[i] + block[r * dim + d] * w;
}

// ---- ple_gate: one block per (row, stream) ----
__global__ void ple_gate_kernel(const float* key, const float* query, const float* value,
                                float* out, int64_t n_vectors, int hc, int64_t dim) {
  pdl_launch_dependents();
  __shared__ float s_warp[32];
  for (int64_t rs = blockIdx.x; rs < n_vectors; rs += gridDim.x) {
    const int64_t o = rs * dim, r = rs / hc;
    float dot = 0;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dot += key[o + d] * query[o + d];
    const float g = block_sum(dot, s_warp) / sqrtf(static_cast<float>(dim));
    const float sign = g > 0 ? 1.0f : g < 0 ? -1.0f : 0.0f;
    const float gate = sigmoid(sign * sqrtf(fmaxf(fabsf(g), 1e-6f)));
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) out[o + d] = gate * value[r * dim + d];
  }
}

// ---- ple_conv ----
// The conv taps as floats from the placed [K, C] tensor (tap k of channel c at c * K + k).
__device__ __forceinline__ float tap(const void* w, int dtype, int64_t i) {
  switch (dtype) {
    case 1:
      return __half2float(static_cast<const __half*>(w)[i]);
    case 2:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
    default:
      return static_cast<const float*>(w)[i];
  }
}

// Outputs: thread = channel, grid.y = rows (grid-stride). Row t of its span reads input
// t - (K-1-k) * dilation: the span's rows, or the slot's history before them (hist rows, oldest
// first). The history is only read here; ple_conv_state_kernel replaces it afterwards.
__global__ void ple_conv_kernel(const Span* spans, int n_spans, int64_t n, const float* x,
                                const void* w, int dtype, int K, int dilation,
                                const float* conv_state, float* out, int64_t C) {
  pdl_launch_dependents();
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t hist = int64_t{K - 1} * dilation;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    const Span sp = spans[span_index(spans, n_spans, r)];
    const int64_t t = r - sp.begin;
    const float* state = conv_state + int64_t{sp.slot} * hist * C;
    float acc = 0;
    for (int k = 0; k < K; ++k) {
      const int64_t u = t - int64_t{K - 1 - k} * dilation;  // < 0: in the history
      const float in = u >= 0 ? x[(sp.begin + u) * C + c] : state[(hist + u) * C + c];
      acc = fmaf(tap(w, dtype, c * K + k), in, acc);
    }
    out[r * C + c] = acc * sigmoid(acc);
  }
}

// The history after the step: thread = channel, grid.y = span. Window position i (hist history
// rows, then the span's rows) is read from the old history or x. A keep_states span first writes
// the history after each of its rows t < min(count - 1, history_rows); then the new history is
// window rows count .. count + hist - 1. In place: row j is written after rows > j were read.
__global__ void ple_conv_state_kernel(const Span* spans, const float* x, float* conv_state,
                                      float* history, int history_rows, int64_t hist, int64_t C) {
  pdl_launch_dependents();
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const Span sp = spans[blockIdx.y];
  float* state = conv_state + int64_t{sp.slot} * hist * C;
  auto window = [&](int64_t i) {
    return i < hist ? state[i * C + c] : x[(sp.begin + i - hist) * C + c];
  };
  if (sp.keep_states && history) {
    for (int64_t t = 0; t + 1 < sp.count && t < history_rows; ++t) {
      float* h = history + (int64_t{sp.slot} * history_rows + t) * hist * C;
      for (int64_t j = 0; j < hist; ++j) h[j * C + c] = window(t + 1 + j);
    }
  }
  for (int64_t j = 0; j < hist; ++j) state[j * C + c] = window(sp.count + j);
}

// ---- ple_embed's remembered tokens: one block per span ----
// staged_tokens [n_spans, ctx_len]: each span's slot's tokens after the step; staged_history
// [n_spans, history_rows, ctx_len] (null without keep_states): those after each row.
__global__ void ple_tokens_kernel(const Span* spans, const float* staged_tokens,
                                  const float* staged_history, float* ple_tokens,
                                  float* ple_tokens_history, int history_rows, int ctx_len) {
  pdl_launch_dependents();
  const int s = blockIdx.x;
  const Span sp = spans[s];
  for (int j = threadIdx.x; j < ctx_len; j += blockDim.x)
    ple_tokens[int64_t{sp.slot} * ctx_len + j] = staged_tokens[int64_t{s} * ctx_len + j];
  if (!sp.keep_states || !staged_history) return;
  const int rows = sp.count - 1 < history_rows ? sp.count - 1 : history_rows;
  for (int i = threadIdx.x; i < rows * ctx_len; i += blockDim.x) {
    const int t = i / ctx_len, j = i % ctx_len;
    ple_tokens_history[(int64_t{sp.slot} * history_rows + t) * ctx_len + j] =
        staged_history[(int64_t{s} * history_rows + t) * ctx_len + j];
  }
}

int dtype_code(const Weight& w) {
  switch (w.view.dtype) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 2;
    default:
      cuda_fail("ple_conv: tensor '{}' has a type without a conv kernel (F32, F16 or BF16 only)",
                w.name);
  }
}

}  // namespace

void rmsnorm_grouped(const float* x, const float* weight, float* out, int64_t rows, int groups,
                     int64_t dim, float eps, cudaStream_t stream) {
  const int64_t n_vectors = rows * groups;
  if (n_vectors == 0 || dim == 0) return;
  const int threads = dim <= 256 ? 64 : dim <= 2048 ? 256 : 512;
  const unsigned grid = static_cast<unsigned>(n_vectors < (1 << 30) ? n_vectors : (1 << 30));
  rmsnorm_grouped_kernel<<<grid, threads, 0, stream>>>(x, weight, out, n_vectors, groups, dim, eps);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void silu_scaled(const float* x, float scale, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  silu_scaled_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, scale, out, n);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc, int64_t dim,
            cudaStream_t stream) {
  if (n * dim == 0) return;
  hc_mix_kernel<<<blocks_for(n * dim, kThreads), kThreads, 0, stream>>>(xn, gate, out, n, hc, dim);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
               int64_t dim, cudaStream_t stream) {
  const int64_t total = n * hc * dim;
  if (total == 0) return;
  hc_inject_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(streams, block, inject, n,
                                                                         hc, dim);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
              int hc, int64_t dim, cudaStream_t stream) {
  const int64_t n_vectors = n * hc;
  if (n_vectors == 0 || dim == 0) return;
  const int threads = dim <= 256 ? 64 : 256;
  const unsigned grid = static_cast<unsigned>(n_vectors < (1 << 30) ? n_vectors : (1 << 30));
  ple_gate_kernel<<<grid, threads, 0, stream>>>(key, query, value, out, n_vectors, hc, dim);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void ple_conv(const DeviceStep& step, const PleConvArgs& args, cudaStream_t stream) {
  const int64_t K = args.kernel.view.ne[0], C = args.kernel.view.ne[1];
  if (K < 1 || args.dilation < 1)
    cuda_fail("ple_conv: tensor '{}' has {} taps, dilation {}", args.kernel.name, K, args.dilation);
  if (!args.state.ple_conv) cuda_fail("ple_conv: the layer has no PLE conv state");
  const int dtype = dtype_code(args.kernel);
  if (step.n == 0 || step.n_spans == 0) return;
  const int64_t hist = (K - 1) * args.dilation;
  const unsigned channel_blocks = blocks_for(C, kThreads);
  const dim3 grid(channel_blocks, static_cast<unsigned>(step.n < kMaxGridY ? step.n : kMaxGridY));
  ple_conv_kernel<<<grid, kThreads, 0, stream>>>(step.spans, step.n_spans, step.n, args.x,
                                                 args.kernel.view.data, dtype, static_cast<int>(K),
                                                 args.dilation, args.state.ple_conv, args.out, C);
  QWENRT_CUDA_CHECK_LAUNCH();
  if (hist == 0) return;
  if (step.keep_states && (!args.state.ple_conv_history || args.state.history_rows < 1))
    cuda_fail("ple_conv: a span keeps its states but the layer has no PLE conv history");
  const dim3 state_grid(channel_blocks, static_cast<unsigned>(step.n_spans));
  ple_conv_state_kernel<<<state_grid, kThreads, 0, stream>>>(
      step.spans, args.x, args.state.ple_conv,
      step.keep_states ? args.state.ple_conv_history : nullptr, args.state.history_rows, hist, C);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void ple_tokens_update(const DeviceStep& step, const float* staged_tokens,
                       const float* staged_history, const RecurrentLayer& state, int ctx_len,
                       cudaStream_t stream) {
  if (step.n_spans == 0 || ctx_len == 0) return;
  if (staged_history && (!state.ple_tokens_history || state.history_rows < 1))
    cuda_fail("ple_embed: a span keeps its states but the layer has no PLE token history");
  ple_tokens_kernel<<<static_cast<unsigned>(step.n_spans), 64, 0, stream>>>(
      step.spans, staged_tokens, staged_history, state.ple_tokens, state.ple_tokens_history,
      state.history_rows, ctx_len);
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
