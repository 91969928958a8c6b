// The fused MoE FFN of the CPU backend: the whole of ops::ref::moe_ffn in one call.
#pragma once

#include <cstdint>

#include "ops/cpu/expert_cache.h"
#include "ops/cpu/matmul.h"
#include "ops/types.h"

namespace qwenrt::ops::cpu {

// out [n, dim] = sigmoid(shared_gate_inp . x) * shared(x) + sum over the top-k routed experts of
// w_j * expert_j(x), for x [n, dim] (rows dim floats apart), with expert(x) the SwiGLU
// down(silu(gate x) * up x). Routing (router matmul, softmax, top-k with ties to the lower id,
// renormalised with the sum clamped at >= 6.103515625e-5) runs inside. Each input is quantised
// once and reused by every expert; tokens are grouped by expert so each chosen expert's weights
// stream once per call; threads take 64-row tasks of every expert (the shared expert in the same
// pass) from a shared counter. Gate/up separate or fused (gate_up_exps: gate rows, then up rows).
// No allocation once Scratch has grown to the call's size.
// With a cache, the routed experts' bytes come from it (ExpertCache: read from the file on a miss,
// the resident ones computed first), in rounds of what it holds; the output is the same bits.
void moe_ffn(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert, int k,
             Context& ctx, ExpertCache* cache = nullptr);

// Routing alone (what moe_ffn runs inside): logits [n, n_expert] -> ids, weights [n, k].
// Same arithmetic as ops::ref::moe_route (fp64 softmax), without allocating.
void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights);

}  // namespace qwenrt::ops::cpu
