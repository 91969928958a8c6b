// The Gated DeltaNet core of a layer on the CPU (SPEC: Gated DeltaNet, steps 2-6): everything
// between the input projections and ssm_out, for every span of a batch in one call, with per-slot
// conv and delta state. The pieces (conv1d + SiLU, the delta rule in both forms) are exposed too,
// each the batched form of its ops::ref kernel.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/cpu/common.h"

namespace qwenrt::ops::cpu {

// Causal depthwise conv1d + SiLU of every span (ref::conv1d_silu per span):
//   x [n, C] rows x_stride apart; kernel [C, K] (ggml [K, C]); conv_state [n_slots, K-1, C]
//   (oldest input first; a span's at index slot, updated); out [n, C] contiguous. K <= 8.
void conv1d_silu(const Span* spans, int n_spans, const float* x, int64_t x_stride,
                 const float* kernel, int K, float* conv_state, float* out, int64_t channels,
                 ThreadPool& pool);

// The gated delta rule over a batch (ref::gated_delta_* per span). Row r of q/k/v/g/beta/out is
// activation row r (a span's rows are [begin, begin + count)).
struct GatedDeltaBatch {
  const float* q;  // [n, Hk, D] L2-normalised, rows q_stride floats apart
  const float* k;  // [n, Hk, D] L2-normalised, rows k_stride floats apart
  const float* v;  // [n, Hv, D], rows v_stride floats apart
  int64_t q_stride, k_stride, v_stride;
  const float* g;      // [n, Hv] log decay (<= 0)
  const float* beta;   // [n, Hv] in (0, 1)
  float* delta_state;  // [n_slots, Hv, D (key), D (value)], a span's at index slot, updated
  float* out;          // [n, Hv, D]
  int n_k_heads;       // Hk; V head h reads K head h % Hk
  int n_v_heads;       // Hv
  int head_dim;        // D, a multiple of 16
};
// Token by token (decode and short spans); threads over (span, V head).
void gated_delta_recurrent(const GatedDeltaBatch& b, const Span* spans, int n_spans,
                           ThreadPool& pool);
// In chunks of 64 (the WY form, for prefill); equal to the recurrent form.
void gated_delta_chunked(const GatedDeltaBatch& b, const Span* spans, int n_spans,
                         ThreadPool& pool);

// One DeltaNet layer's weights and state, as the core reads them.
struct DeltaNetLayerArgs {
  const float* conv_kernel;  // [C, K] (ggml [K, C]), C = 2 * Hk * D + Hv * D
  int conv_k;                // K (4 in every shipped model), <= 8
  const float* dt_bias;      // [Hv] ssm_dt.bias
  const float* a;            // [Hv] ssm_a (= -exp(A_log))
  const float* norm;         // [D] ssm_norm
  float eps;                 // rms eps: the l2norm floor of q, k and the output norm's eps
  int n_k_heads, n_v_heads, head_dim;  // Hk, Hv, D (D a multiple of 16)
  float* conv_state;                   // [n_slots, K-1, C]
  float* delta_state;                  // [n_slots, Hv, D, D]
  // The states after each row of keep_states spans (ops::RecurrentLayer's history).
  float* conv_history = nullptr;   // [n_slots, history_rows, K-1, C]
  float* delta_history = nullptr;  // [n_slots, history_rows, Hv, D, D]
  int history_rows = 0;
  bool sigmoid_gate = false;  // the output gate: sigmoid(z) (qwen4exp), else silu(z)
};

// The DeltaNet core for a batch of single-token spans (every span's count is 1), fused: per row
// conv1d + SiLU of the fused q|k|v stream, L2 norm of q and k per K head, the gates
// (g = a softplus(alpha + dt_bias), beta = sigmoid(beta)), one delta-rule step per V head, then
// out = rmsnorm(o per V head, norm) * silu(z). Threads over (row, K head with its V heads).
//   qkv [n, C] (pre-conv projections), z [n, Hv*D], alpha, beta [n, Hv] (logits), out [n, Hv*D];
//   all contiguous, row r = activation row r.
void deltanet_decode(const DeltaNetLayerArgs& layer, const Span* spans, int n_spans,
                     const float* qkv, const float* z, const float* alpha, const float* beta,
                     float* out, ThreadPool& pool);

// Floats of workspace deltanet_prefill needs for a batch of n_rows rows (the conv output).
int64_t deltanet_prefill_workspace_floats(const DeltaNetLayerArgs& layer, int64_t n_rows);

// The same core for any mix of spans (one call per layer): all single-token spans take the fused
// decode path; otherwise conv over all spans into workspace, then per (span, V head) the delta
// rule (chunked for spans of 16+ tokens, token by token below and for keep_states spans, whose
// states after each row go into the history) and the gated norm.
// workspace: deltanet_prefill_workspace_floats floats (unused when every span is one token).
void deltanet_prefill(const DeltaNetLayerArgs& layer, const Span* spans, int n_spans,
                      const float* qkv, const float* z, const float* alpha, const float* beta,
                      float* out, float* workspace, ThreadPool& pool);

}  // namespace qwenrt::ops::cpu
