#include "arch/blocks.h"

#include <cmath>

namespace qwenrt::arch {

AttentionRows attention_projections(const BlockContext& ctx, const model::AttentionWeights& w,
                                    const float* x) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.n, hd = c.head_dim, nq = int64_t{c.n_head} * hd,
                nkv = int64_t{c.n_head_kv} * hd;
  AttentionRows r{.q = ops.alloc(n * nq),
                  .gate = ops.alloc(n * nq),
                  .k = ops.alloc(n * nkv),
                  .v = ops.alloc(n * nkv)};
  // attn_q yields per head [query (hd) | gate (hd)]; a fused attn_qkv puts k and v after that.
  float* q_gate = ops.alloc(n * 2 * nq);
  if (w.qkv.present()) {
    const int64_t width = 2 * nq + 2 * nkv;
    float* qkv = ops.alloc(n * width);
    ops.matmul(w.qkv, x, qkv, n);
    ops.copy_2d(qkv, width, q_gate, 2 * nq, n, 2 * nq);
    ops.copy_2d(qkv + 2 * nq, width, r.k, nkv, n, nkv);
    ops.copy_2d(qkv + 2 * nq + nkv, width, r.v, nkv, n, nkv);
  } else {
    const ops::Ops::Projection qkv[] = {{&w.q, q_gate}, {&w.k, r.k}, {&w.v, r.v}};
    ops.matmuls(x, n, qkv);
  }
  // Query and gate apart, then QK-norm and RoPE on the queries and keys.
  ops.attention_heads({.q_gate = q_gate,
                       .q_norm = &w.q_norm,
                       .k_norm = &w.k_norm,
                       .q = r.q,
                       .gate = r.gate,
                       .k = r.k,
                       .n = n,
                       .n_head = c.n_head,
                       .n_head_kv = c.n_head_kv,
                       .head_dim = c.head_dim,
                       .n_rot = c.n_rot,
                       .rope_theta = c.rope_theta,
                       .eps = c.rms_eps});
  return r;
}

ops::AttentionArgs attention_core_args(const BlockContext& ctx, const AttentionRows& rows, int il,
                                       float* attn) {
  const model::Config& c = ctx.config;
  return {.q = rows.q,
          .q_stride = int64_t{c.n_head} * c.head_dim,
          .k = rows.k,
          .v = rows.v,
          .kv = ctx.states.kv(il, ctx.rank),
          .out = attn,
          .n_head = c.n_head,
          .n_head_kv = c.n_head_kv,
          .head_dim = c.head_dim,
          .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
}

void attention_output(const BlockContext& ctx, const model::AttentionWeights& w,
                      const AttentionRows& rows, float* attn, float* out) {
  const int64_t nq = int64_t{ctx.config.n_head} * ctx.config.head_dim;
  ctx.ops.sigmoid_mul(attn, rows.gate, nq, attn, ctx.n, nq);
  ctx.ops.matmul(w.output, attn, out, ctx.n);
}

void attention_block(const BlockContext& ctx, const model::AttentionWeights& w, int il,
                     const float* x, float* out) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.n, nq = int64_t{c.n_head} * c.head_dim;
  const AttentionRows rows = attention_projections(ctx, w, x);
  float* attn = ops.alloc(n * nq);
  ops.attention_gated(attention_core_args(ctx, rows, il, attn), rows.gate, nq, n);
  ops.matmul(w.output, attn, out, n);
}

void deltanet_block(const BlockContext& ctx, const model::DeltaNetWeights& w, int il,
                    const float* x, float* out) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.n, nv = int64_t{c.ssm_v_heads} * c.ssm_head_dim;
  float* qkv = ops.alloc(n * c.conv_channels());
  float* z = ops.alloc(n * nv);
  float* alpha = ops.alloc(n * c.ssm_v_heads);
  float* beta = ops.alloc(n * c.ssm_v_heads);
  const ops::Ops::Projection projections[] = {
      {&w.qkv, qkv}, {&w.gate, z}, {&w.alpha, alpha}, {&w.beta, beta}};
  ops.matmuls(x, n, projections);
  float* o = ops.alloc(n * nv);
  ops.deltanet({.qkv = qkv,
                .z = z,
                .alpha = alpha,
                .beta = beta,
                .conv = w.conv,
                .dt_bias = w.dt_bias,
                .a = w.a,
                .norm = w.norm,
                .state = ctx.states.recurrent(il, ctx.rank),
                .out = o,
                .n_k_heads = c.ssm_k_heads,
                .n_v_heads = c.ssm_v_heads,
                .head_dim = c.ssm_head_dim,
                .eps = c.rms_eps,
                .sigmoid_gate = c.deltanet_sigmoid_gate()});
  ops.matmul(w.output, o, out, n);
}

}  // namespace qwenrt::arch
