// The reference kernels: plain scalar loops in fp32 with fp64 accumulators, one sequence or one
// row set at a time, written to be read against SPEC.md. RefOps (ref_ops.cpp) runs the Ops
// interface on them; fast backends' kernel tests compare against them. Frozen: fix, never optimise.
#pragma once

#include <cstdint>
#include <vector>

#include "core/weight.h"
#include "ops/types.h"

namespace qwenrt::ops::ref {

// y [n, out] = x [n, in] @ W^T for W [in, out] of any type quant/ dequantises.
void matmul(const Weight& w, const float* x, float* y, int64_t n);
// out [n, dim] = rows ids[0..n) of table [dim, n_vocab]; Error on an id outside the table.
void embed_rows(const Weight& table, const int32_t* ids, float* out, int64_t n);
// out [rows, dim] = x / sqrt(mean(x^2) + eps) * weight [dim]. out may be x.
void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps);
// x [rows, dim] /= max(||x||, eps), in place; rows are `stride` floats apart.
void l2norm(float* x, int64_t rows, int64_t dim, int64_t stride, float eps);
// NeoX rotation (pairs i, i + n_rot/2) of the first n_rot dims of every head, in place.
// x [n_tokens, n_heads, head_dim], token rows `token_stride` floats apart.
void rope_neox(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
               int64_t token_stride, int n_rot, float theta);
// Causal GQA attention of one sequence: q [n_q, n_head, hd] (rows q_stride apart) against
// contiguous keys/values [n_kv, n_head_kv, hd]; query i sits at kv position n_kv - n_q + i and sees
// kv 0..that position. Query head h uses kv head h / (n_head / n_head_kv). out [n_q, n_head, hd].
void attention(const float* q, int64_t q_stride, const float* k, const float* v, float* out,
               int64_t n_q, int64_t n_kv, int n_head, int n_head_kv, int head_dim, float scale);
// Causal depthwise conv1d + SiLU of one sequence: x [n, C] (rows x_stride apart), kernel [C, K]
// (ggml [K, C]), state [K-1, C] holding the previous K-1 inputs (oldest first), updated.
// out [n, C] = silu(sum_j kernel[c][j] * input[t - (K-1) + j][c]).
void conv1d_silu(const float* x, int64_t x_stride, float* state, const float* kernel, int K,
                 float* out, int64_t n, int64_t channels);
// g [n, Hv] = a * softplus(alpha + dt_bias); beta [n, Hv] = sigmoid(beta), in place.
void deltanet_gates(float* alpha_to_g, float* beta, const float* dt_bias, const float* a, int64_t n,
                    int n_v_heads);
// The gated delta rule token by token, and the same in chunks of 64 (the WY form for prefill).
void gated_delta_recurrent(const GatedDeltaArgs& args);
void gated_delta_chunked(const GatedDeltaArgs& args);
// out = silu(gate) * up, n floats (out may alias either).
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// out [rows, cols] = x * sigmoid(gate); gate rows are gate_stride floats apart.
void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                 int64_t cols);
// MoE routing: softmax over logits [n, n_expert], top-k (ties to the lower id), renormalised (sum
// clamped at >= 6.103515625e-5). ids/weights [n, k].
void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights);
// out [n, dim] += sum_j weights[t, j] * expert_{ids[t, j]}(x[t]): the SwiGLU
// down(silu(gate_e x) * up_e x) of the given expert tensors (gate/up separate or fused).
void moe_experts(const MoeWeights& w, const float* x, const int32_t* ids, const float* weights,
                 float* out, int64_t n, int k);
// The whole MoE FFN of SPEC.md: out [n, dim] = sigmoid(shared_gate_inp . x) * shared(x)
// + sum over the top-k routed experts of w_j expert_j(x).
void moe_ffn(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert, int k);

// ---- qwen4exp (ops.h states what each computes) ----
void rmsnorm_grouped(const float* x, const float* weight, float* out, int64_t rows, int groups,
                     int64_t dim, float eps);
void silu_scaled(const float* x, float scale, float* out, int64_t n);
void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc, int64_t dim);
void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
               int64_t dim);
void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
              int hc, int64_t dim);
// The n-gram table rows of one token with its predecessors ctx [ngram] (ctx[0] the token,
// already cut at eos): rows [heads] (ops/types.h PleEmbedArgs).
void ple_rows(const PleEmbedArgs& args, const int64_t* ctx, int64_t* rows);
// The QSA selection of one query (types.h QsaArgs): the positions of [0, n_kv) it attends to,
// ascending, from its indexer query q [heads, dim] and the pooled block keys [n_blocks, dim]
// (the complete blocks of [0, n_kv)).
void qsa_select(const float* q, const float* pooled, int64_t n_kv, int heads, int dim, int ratio,
                int budget, std::vector<int64_t>& positions);

// A QSA span's first half (qsa_attention_spans): its K, V and raw indexer keys into the slot's
// pages (table: the slot's page table), then the pooled block keys of the slot, one per block
// complete at the span's end [n_blocks, index_dim] (mean of the raw keys, k_norm, RoPE at the
// block's first position).
std::vector<float> qsa_append_and_pool(const Span& span, const int32_t* table, const QsaArgs& a);

// The data of an F32 tensor; Error naming it otherwise.
const float* f32_data(const Weight& w);

// The Ops blocks over the spans of a step (ops.h states what they compute), span by span: the
// definition of RefOps' blocks and the fallback of a fast backend that has no kernel for a case.
void attention_spans(const StepLayout& step, const AttentionArgs& args);
void deltanet_spans(const StepLayout& step, const DeltaNetArgs& args);
void qsa_attention_spans(const StepLayout& step, const QsaArgs& args);
void ple_embed_spans(const StepLayout& step, const PleEmbedArgs& args);
void ple_conv_spans(const StepLayout& step, const PleConvArgs& args);
// One sampled token per output row of the step (ref/sampling.h semantics).
void sample_rows(const StepLayout& step, const float* logits, int64_t n_vocab,
                 const SamplingRow* rows, int n_top, SampledToken* out);

}  // namespace qwenrt::ops::ref
