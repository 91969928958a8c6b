// The CPU backend's small row ops: norms, RoPE and gated products, vectorised (AVX-512 / AVX2 /
// portable, chosen at run time: common.h) and split over the pool when large. Each equals the
// ops::ref kernel of the same name (tests/test_cpu_elementwise.cpp states the tolerances).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace qwenrt::ops::cpu {

// out [rows, dim] = x / sqrt(mean(x^2) + eps) * weight [dim]. out may be x.
void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
             ThreadPool& pool);

// The residual add fused with the next norm: x [rows, dim] += mixed [rows, dim]; then
// out [rows, dim] = rmsnorm(x) * weight [dim], each row while it is in cache. out may be mixed.
void add_rmsnorm(float* x, const float* mixed, const float* weight, float* out, int64_t rows,
                 int64_t dim, float eps, ThreadPool& pool);

// x [rows, dim] /= max(||x||, eps) in place; rows are `stride` floats apart.
void l2norm(float* x, int64_t rows, int64_t dim, int64_t stride, float eps, ThreadPool& pool);

// RoPE NeoX tables: cos_sin [n_tokens, n_rot] holds, for token t and pair i < n_rot/2,
// cos at [t][i] and sin at [t][n_rot/2 + i] of positions[t] * theta^(-2i/n_rot), computed in double
// (as ref::rope_neox does) and rounded to float. Build once per step, apply to every layer.
void rope_neox_table(const int32_t* positions, int64_t n_tokens, int n_rot, float theta,
                     float* cos_sin, ThreadPool& pool);
// Rotates pairs (i, i + n_rot/2) of the first n_rot dims of every head in place:
// x [n_tokens, n_heads, head_dim], token rows token_stride floats apart; n_rot even, <= head_dim.
void rope_neox_apply(float* x, const float* cos_sin, int64_t n_tokens, int n_heads, int head_dim,
                     int64_t token_stride, int n_rot, ThreadPool& pool);
// Both in one call (the table in per-thread scratch): the same contract as ref::rope_neox.
void rope_neox(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
               int64_t token_stride, int n_rot, float theta, ThreadPool& pool);

// out [n] = silu(gate) * up (out may alias either).
void silu_mul(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool);
// out [rows, cols] = x * sigmoid(gate); gate rows are gate_stride floats apart. out may be x.
void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                 int64_t cols, ThreadPool& pool);
// out [n] = a + b (out may alias either).
void add(const float* a, const float* b, float* out, int64_t n, ThreadPool& pool);

}  // namespace qwenrt::ops::cpu
