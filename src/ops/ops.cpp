// The fusable sequences of the Ops interface, as the ops they consist of: the definition a fused
// backend kernel is tested against, and what ref and cpu run.
#include "ops/ops.h"

#include "core/error.h"

namespace qwenrt::ops {

void Ops::add_rmsnorm(float* x, const float* delta, const Weight& weight, float* out, int64_t rows,
                      int64_t dim, float eps) {
  add(x, delta, x, rows * dim);
  rmsnorm(x, weight, out, rows, dim, eps);
}

void Ops::add_rmsnorm_moe(const NormedInput& in, const MoeWeights& w, float* out, int64_t n,
                          int n_expert, int k) {
  add_rmsnorm(in.x, in.delta, *in.norm, in.h, n, in.dim, in.eps);
  moe(w, in.h, out, n, n_expert, k);
}

void Ops::attention_gated(const AttentionArgs& args, const float* gate, int64_t gate_stride,
                          int64_t n) {
  attention(args);
  sigmoid_mul(args.out, gate, gate_stride, args.out, n, int64_t{args.n_head} * args.head_dim);
}

void Ops::attention_heads(const AttentionHeadsArgs& a) {
  const int64_t hd = a.head_dim, rows_q = a.n * a.n_head;
  copy_2d(a.q_gate, 2 * hd, a.q, hd, rows_q, hd);
  copy_2d(a.q_gate + hd, 2 * hd, a.gate, hd, rows_q, hd);
  rmsnorm(a.q, *a.q_norm, a.q, rows_q, hd, a.eps);
  rmsnorm(a.k, *a.k_norm, a.k, a.n * a.n_head_kv, hd, a.eps);
  rope_neox(a.q, a.n_head, a.head_dim, a.n_head * hd, a.n_rot, a.rope_theta);
  rope_neox(a.k, a.n_head_kv, a.head_dim, a.n_head_kv * hd, a.n_rot, a.rope_theta);
}

void Ops::matmuls(const float* x, int64_t n, std::span<const Projection> projections) {
  for (const Projection& p : projections) matmul(*p.w, x, p.y, n);
}

void Ops::ffn_swiglu(const Weight& gate, const Weight& up, const Weight& down, const float* x,
                     float* out, int64_t n) {
  const int64_t ff = gate.view.ne[1];
  float* g = alloc(n * ff);
  float* u = alloc(n * ff);
  matmul(gate, x, g, n);
  matmul(up, x, u, n);
  silu_mul(g, u, g, n * ff);
  matmul(down, g, out, n);
}

void Ops::join_host_group(std::shared_ptr<HostGroup>, int) {
  fail("the {} backend does not run tensor parallel yet", name());
}

// The qwen4exp entries have no default: a backend that runs the architecture overrides them.
void Ops::rmsnorm_grouped(const float*, const Weight&, float*, int64_t, int, int64_t, float) {
  fail("the {} backend has no rmsnorm_grouped (qwen4exp)", name());
}
void Ops::silu_scaled(const float*, float, float*, int64_t) {
  fail("the {} backend has no silu_scaled (qwen4exp)", name());
}
void Ops::hc_mix(const float*, const float*, float*, int64_t, int, int64_t) {
  fail("the {} backend has no hc_mix (qwen4exp)", name());
}
void Ops::hc_inject(float*, const float*, const float*, int64_t, int, int64_t) {
  fail("the {} backend has no hc_inject (qwen4exp)", name());
}
void Ops::ple_gate(const float*, const float*, const float*, float*, int64_t, int, int64_t) {
  fail("the {} backend has no ple_gate (qwen4exp)", name());
}
void Ops::ple_embed(const PleEmbedArgs&) {
  fail("the {} backend has no ple_embed (qwen4exp)", name());
}
void Ops::ple_conv(const PleConvArgs&) {
  fail("the {} backend has no ple_conv (qwen4exp)", name());
}
void Ops::qsa_attention(const QsaArgs&) {
  fail("the {} backend has no qsa_attention (qwen4exp)", name());
}

void Ops::stream_experts(const ExpertStreaming&) {
  fail("the {} backend cannot stream experts from the file (use --backend cpu)", name());
}

}  // namespace qwenrt::ops
