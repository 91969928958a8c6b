// The Ops interface: the operations the forward pass is written in, over fp32 activations that
// live in the backend's memory (host memory for ref and cpu, device memory for cuda).
//
// Shapes are row-major with the last index contiguous: x [n, dim] means n rows of dim floats.
// Weights are GGUF tensors in ggml order ([in, out]: ne[0] = in is contiguous) of any type that
// quant/ supports. Integer index arrays (token ids, positions, expert ids) are host arrays.
// The reference backend (ops/ref) defines what every entry computes; fast backends are tested
// against it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/weights.h"

namespace qwenrt::ops {

using model::Weight;

// Arguments of the gated delta rule for one sequence of n tokens (SPEC: Gated DeltaNet, step 5).
struct GatedDeltaArgs {
  const float* q;  // [n, Hk, D], L2-normalised, row stride q_stride floats
  const float* k;  // [n, Hk, D], L2-normalised, row stride k_stride floats
  const float* v;  // [n, Hv, D], row stride v_stride floats
  int64_t q_stride, k_stride, v_stride;
  const float* g;     // [n, Hv]: log decay (a * softplus(alpha + dt_bias)), <= 0
  const float* beta;  // [n, Hv]: sigmoid(beta logits)
  float* state;       // [Hv, D (key), D (value)], read and updated
  float* out;         // [n, Hv, D]
  int64_t n;          // tokens
  int n_k_heads;      // Hk; V head h reads K head h % Hk
  int n_v_heads;      // Hv
  int head_dim;       // D
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // Memory for activations, valid until reset_workspace().
  virtual float* alloc(int64_t n_floats) = 0;
  virtual void reset_workspace() = 0;
  // Host <-> backend copies of fp32 data.
  virtual void upload(const float* host, float* dst, int64_t n) = 0;
  virtual void download(const float* src, float* host, int64_t n) = 0;

  // y [n, out] = x [n, in] @ W^T for W [in, out].
  virtual void matmul(const Weight& w, const float* x, float* y, int64_t n) = 0;
  // out [n, dim] = rows ids[0..n) of table [dim, n_vocab].
  virtual void embed_rows(const Weight& table, const int32_t* ids, float* out, int64_t n) = 0;
  // out [rows, dim] = x / sqrt(mean(x^2) + eps) * weight [dim] (F32 tensor). out may be x.
  virtual void rmsnorm(const float* x, const Weight& weight, float* out, int64_t rows, int64_t dim,
                       float eps) = 0;
  // x [rows, dim] /= max(||x||, eps), in place; rows are `stride` floats apart.
  virtual void l2norm(float* x, int64_t rows, int64_t dim, int64_t stride, float eps) = 0;
  // NeoX rotation (pairs i, i + n_rot/2) of the first n_rot dims of every head, in place.
  // x [n_tokens, n_heads, head_dim], token rows `token_stride` floats apart.
  virtual void rope_neox(float* x, const int32_t* positions, int64_t n_tokens, int n_heads,
                         int head_dim, int64_t token_stride, int n_rot, float theta) = 0;
  // Causal GQA attention of one sequence: q [n_q, n_head, hd] (rows q_stride apart) against
  // keys/values [n_kv, n_head_kv, hd]; query i sits at kv position n_kv - n_q + i and sees
  // kv 0..that position. Query head h uses kv head h / (n_head / n_head_kv).
  // out [n_q, n_head, hd].
  virtual void attention(const float* q, int64_t q_stride, const float* k, const float* v,
                         float* out, int64_t n_q, int64_t n_kv, int n_head, int n_head_kv,
                         int head_dim, float scale) = 0;
  // Causal depthwise conv1d + SiLU of one sequence: x [n, C], kernel [C, K] (F32 tensor, ggml
  // [K, C]), state [K-1, C] holding the previous K-1 inputs (oldest first), updated.
  // out [n, C] = silu(sum_j kernel[c][j] * input[t - (K-1) + j][c]).
  virtual void conv1d_silu(const float* x, float* state, const Weight& kernel, float* out,
                           int64_t n, int64_t channels) = 0;
  // DeltaNet gates: g [n, Hv] = a * softplus(alpha + dt_bias); beta [n, Hv] = sigmoid(beta), in
  // place.
  virtual void deltanet_gates(float* alpha_to_g, float* beta, const Weight& dt_bias,
                              const Weight& a, int64_t n, int n_v_heads) = 0;
  // The gated delta rule over n tokens, token by token (recurrent) or in chunks of 64 (chunked).
  virtual void gated_delta(const GatedDeltaArgs& args, bool chunked) = 0;

  // out = silu(gate) * up, n floats (out may alias either).
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out [rows, cols] = x * sigmoid(gate); gate rows are gate_stride floats apart.
  virtual void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out,
                           int64_t rows, int64_t cols) = 0;
  // out = a + b, n floats (out may alias either).
  virtual void add(const float* a, const float* b, float* out, int64_t n) = 0;
  // dst [rows, cols] (rows dst_stride apart) = src [rows, cols] (rows src_stride apart).
  virtual void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                       int64_t rows, int64_t cols) = 0;

  // MoE routing: softmax over logits [n, n_expert], top-k, renormalised (sum clamped at
  // >= 6.103515625e-5). ids/weights [n, k] are host arrays.
  virtual void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids,
                         float* weights) = 0;
  // out [n, dim] += sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) where expert e is the SwiGLU
  // down(silu(gate_e x) * up_e x) of the given expert tensors (gate/up separate or fused).
  virtual void moe_experts(const model::MoeFfnWeights& w, const float* x, const int32_t* ids,
                           const float* weights, float* out, int64_t n, int k) = 0;
  // x [rows, cols] *= sigmoid(s[r]) per row, s [rows].
  virtual void scale_rows_sigmoid(float* x, const float* s, int64_t rows, int64_t cols) = 0;
};

// The reference backend (frozen oracle).
std::unique_ptr<Ops> make_ref_ops();

}  // namespace qwenrt::ops
