#include "arch/blocks.h"

#include <cmath>

#include "core/error.h"

namespace qwenrt::arch {

void attention_block(const BlockContext& ctx, const model::AttentionWeights& w, int il,
                     const float* x, float* out) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.batch.n, hd = c.head_dim, nq = int64_t{c.n_head} * hd,
                nkv = int64_t{c.n_head_kv} * hd;
  float* q = ops.alloc(n * nq);
  float* gate = ops.alloc(n * nq);
  float* k = ops.alloc(n * nkv);
  float* v = ops.alloc(n * nkv);
  // attn_q yields per head [query (hd) | gate (hd)]; a fused attn_qkv puts k and v after that.
  float* q_gate = ops.alloc(n * 2 * nq);
  if (w.qkv.present()) {
    const int64_t width = 2 * nq + 2 * nkv;
    float* qkv = ops.alloc(n * width);
    ops.matmul(w.qkv, x, qkv, n);
    ops.copy_2d(qkv, width, q_gate, 2 * nq, n, 2 * nq);
    ops.copy_2d(qkv + 2 * nq, width, k, nkv, n, nkv);
    ops.copy_2d(qkv + 2 * nq + nkv, width, v, nkv, n, nkv);
  } else {
    ops.matmul(w.q, x, q_gate, n);
    ops.matmul(w.k, x, k, n);
    ops.matmul(w.v, x, v, n);
  }
  ops.copy_2d(q_gate, 2 * hd, q, hd, n * c.n_head, hd);
  ops.copy_2d(q_gate + hd, 2 * hd, gate, hd, n * c.n_head, hd);

  ops.rmsnorm(q, w.q_norm, q, n * c.n_head, hd, c.rms_eps);
  ops.rmsnorm(k, w.k_norm, k, n * c.n_head_kv, hd, c.rms_eps);
  ops.rope_neox(q, ctx.batch.positions, n, c.n_head, c.head_dim, nq, c.n_rot, c.rope_theta);
  ops.rope_neox(k, ctx.batch.positions, n, c.n_head_kv, c.head_dim, nkv, c.n_rot, c.rope_theta);

  float* attn = ops.alloc(n * nq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const SeqSpan& span : ctx.batch.spans) {
    state::LayerState& ls = ctx.states.slot(span.slot).layers[il];
    const int64_t n_past = static_cast<int64_t>(ls.k.size()) / nkv;
    ls.k.resize((n_past + span.count) * nkv);
    ls.v.resize((n_past + span.count) * nkv);
    ops.download(k + span.begin * nkv, ls.k.data() + n_past * nkv, span.count * nkv);
    ops.download(v + span.begin * nkv, ls.v.data() + n_past * nkv, span.count * nkv);
    ops.attention(q + span.begin * nq, nq, ls.k.data(), ls.v.data(), attn + span.begin * nq,
                  span.count, n_past + span.count, c.n_head, c.n_head_kv, c.head_dim, scale);
  }
  ops.sigmoid_mul(attn, gate, nq, attn, n, nq);
  ops.matmul(w.output, attn, out, n);
}

void deltanet_block(const BlockContext& ctx, const model::DeltaNetWeights& w, int il,
                    const float* x, float* out) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.batch.n, D = c.ssm_head_dim, C = c.conv_channels();
  const int64_t nk = int64_t{c.ssm_k_heads} * D, nv = int64_t{c.ssm_v_heads} * D;
  float* qkv = ops.alloc(n * C);
  float* z = ops.alloc(n * nv);
  float* g = ops.alloc(n * c.ssm_v_heads);
  float* beta = ops.alloc(n * c.ssm_v_heads);
  ops.matmul(w.qkv, x, qkv, n);
  ops.matmul(w.gate, x, z, n);
  ops.matmul(w.alpha, x, g, n);
  ops.matmul(w.beta, x, beta, n);
  ops.deltanet_gates(g, beta, w.dt_bias, w.a, n, c.ssm_v_heads);

  float* mixed = ops.alloc(n * C);  // conv + SiLU over the whole fused q|k|v stream
  for (const SeqSpan& span : ctx.batch.spans) {
    state::LayerState& ls = ctx.states.slot(span.slot).layers[il];
    ops.conv1d_silu(qkv + span.begin * C, ls.conv.data(), w.conv, mixed + span.begin * C,
                    span.count, C);
  }
  float* q = ops.alloc(n * nk);
  float* k = ops.alloc(n * nk);
  ops.copy_2d(mixed, C, q, nk, n, nk);
  ops.copy_2d(mixed + nk, C, k, nk, n, nk);
  ops.l2norm(q, n * c.ssm_k_heads, D, D, c.rms_eps);
  ops.l2norm(k, n * c.ssm_k_heads, D, D, c.rms_eps);

  float* o = ops.alloc(n * nv);
  for (const SeqSpan& span : ctx.batch.spans) {
    state::LayerState& ls = ctx.states.slot(span.slot).layers[il];
    const bool chunked = ctx.batch.deltanet_mode == DeltaNetMode::kChunked ||
                         (ctx.batch.deltanet_mode == DeltaNetMode::kAuto && span.count > 1);
    ops.gated_delta({.q = q + span.begin * nk,
                     .k = k + span.begin * nk,
                     .v = mixed + span.begin * C + 2 * nk,
                     .q_stride = nk,
                     .k_stride = nk,
                     .v_stride = C,
                     .g = g + span.begin * c.ssm_v_heads,
                     .beta = beta + span.begin * c.ssm_v_heads,
                     .state = ls.delta.data(),
                     .out = o + span.begin * nv,
                     .n = span.count,
                     .n_k_heads = c.ssm_k_heads,
                     .n_v_heads = c.ssm_v_heads,
                     .head_dim = c.ssm_head_dim},
                    chunked);
  }
  ops.rmsnorm(o, w.norm, o, n * c.ssm_v_heads, D, c.rms_eps);
  ops.silu_mul(z, o, o, n * nv);  // silu here (sigmoid in attention)
  ops.matmul(w.output, o, out, n);
}

}  // namespace qwenrt::arch
