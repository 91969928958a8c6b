// qwen4exp: Qwen3.8-Flash-Next, as transformers' modeling_qwen4_exp.py defines it over llama.cpp's
// GGUF layout. The Qwen3.5 MoE hybrid with three changes:
//  - hyper-connections: hc residual streams [n, hc, n_embd] in place of every layer norm; a block
//    reads their gated mix and its output is injected into each stream with its own weight; the
//    final mixer (no output_norm) feeds the head;
//  - Qwen Sparse Attention on the attention layers: an indexer picks, per query, the best blocks
//    of keys (plus the incomplete tail) within a token budget;
//  - a Per-Layer Embedding on one DeltaNet layer: hashed n-gram rows of a large table, gated per
//    stream and passed through a dilated causal conv, added to the streams before the layer.
// The DeltaNet output gate is sigmoid(z), not silu(z).
#include <cmath>

#include "arch/qwen4exp.h"

#include "core/error.h"

namespace qwenrt::arch {

using model::HyperConnectionWeights;

HcInput hc_input(const BlockContext& ctx, const HyperConnectionWeights& w, const float* streams,
                 int64_t rows) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int hc = c.q4.hc_count;
  const int64_t e = c.n_embd, wide = hc * e, lowrank = c.q4.hc_lowrank;
  float* xn = ops.alloc(rows * wide);
  ops.rmsnorm_grouped(streams, w.norm, xn, rows, hc, e, c.rms_eps);
  float* low = ops.alloc(rows * lowrank);
  ops.matmul(w.down, xn, low, rows);
  ops.silu_scaled(low, 1.0f / static_cast<float>(hc), low, rows * lowrank);
  float* gate = ops.alloc(rows * wide);
  ops.matmul(w.up, low, gate, rows);
  HcInput in{.mixed = ops.alloc(rows * e), .inject = nullptr};
  ops.hc_mix(xn, gate, in.mixed, rows, hc, e);
  if (w.inject.present()) {
    in.inject = ops.alloc(rows * hc);
    ops.matmul(w.inject, xn, in.inject, rows);
  }
  return in;
}

// out [n, n_embd] = Qwen Sparse Attention of x: gated attention whose core attends, per query, to
// the keys the layer's indexer selects.
void qsa_block(const BlockContext& ctx, const model::AttentionWeights& w,
               const model::IndexerWeights& idx, int il, const float* x, float* out) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.n, nq = int64_t{c.n_head} * c.head_dim, d = c.q4.indexer_head_dim,
                iq = c.q4.indexer_heads * d;
  const AttentionRows rows = attention_projections(ctx, w, x);
  float* index_q = ops.alloc(n * iq);
  float* index_k = ops.alloc(n * d);
  const ops::Ops::Projection projections[] = {{&idx.q, index_q}, {&idx.k, index_k}};
  ops.matmuls(x, n, projections);
  ops.rmsnorm(index_q, idx.q_norm, index_q, n * c.q4.indexer_heads, d, c.rms_eps);
  ops.rope_neox(index_q, c.q4.indexer_heads, static_cast<int>(d), iq, c.n_rot, c.rope_theta);
  float* attn = ops.alloc(n * nq);
  ops.qsa_attention({.attn = attention_core_args(ctx, rows, il, attn),
                     .index_q = index_q,
                     .index_k = index_k,
                     .k_norm = idx.k_norm,
                     .index_heads = c.q4.indexer_heads,
                     .index_dim = static_cast<int>(d),
                     .ratio = c.q4.compress_ratios[il],
                     .budget = c.q4.indexer_budget,
                     .n_rot = c.n_rot,
                     .rope_theta = c.rope_theta,
                     .eps = c.rms_eps});
  attention_output(ctx, w, rows, attn, out);
}

// streams [n, hc, e] += PLE(streams): the n-gram rows' value, gated per stream by its key against
// the normed stream, plus the dilated conv of the normed gated values.
void ple_block(const BlockContext& ctx, const model::PleWeights& w, const model::Weight& table,
               int il, float* streams) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const model::Qwen4ExpConfig& q = c.q4;
  const int hc = q.hc_count;
  const int64_t n = ctx.n, e = c.n_embd, wide = hc * e;
  const ops::RecurrentLayer& state = ctx.states.recurrent(il);
  float* emb = ops.alloc(n * q.ple_dim());
  ops.ple_embed({.table = table,
                 .ngram = q.ple_ngram,
                 .heads_per_ngram = q.ple_heads_per_ngram,
                 .eos = q.ple_eos,
                 .multipliers = q.ple_multipliers.data(),
                 .offsets = q.ple_head_offsets.data(),
                 .vocab = q.ple_head_vocab.data(),
                 .state = state,
                 .out = emb});
  float* key = ops.alloc(n * wide);
  float* value = ops.alloc(n * e);
  const ops::Ops::Projection projections[] = {{&w.key, key}, {&w.value, value}};
  ops.matmuls(emb, n, projections);
  ops.rmsnorm_grouped(key, w.norm_key, key, n, hc, e, c.rms_eps);
  float* query = ops.alloc(n * wide);
  ops.rmsnorm_grouped(streams, w.norm_query, query, n, hc, e, c.rms_eps);
  float* gated = ops.alloc(n * wide);
  ops.ple_gate(key, query, value, gated, n, hc, e);
  float* normed = ops.alloc(n * wide);
  ops.rmsnorm_grouped(gated, w.norm_conv, normed, n, hc, e, c.rms_eps);
  float* conv = ops.alloc(n * wide);
  ops.ple_conv(
      {.x = normed, .kernel = w.conv, .dilation = q.ple_ngram, .state = state, .out = conv});
  ops.add(gated, conv, gated, n * wide);
  ops.add(streams, gated, streams, n * wide);
}

namespace {

class Qwen4Exp final : public Model {
 public:
  Qwen4Exp(const gguf::File& file, const model::Config& config, ops::Ops& ops)
      : config_(config), weights_(model::bind_qwen4exp(file, config)) {
    model::for_each_weight(weights_, [&](Weight& w) { w = ops.place(w); });
  }
  const model::Config& config() const override { return config_; }

  // No pipeline stages (make_model refuses them): `input` is always null.
  ForwardResult forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                        bool all_hidden, const float*) override {
    const BlockContext ctx{ops, config_, states, n};
    const model::Config& c = config_;
    const int hc = c.q4.hc_count;
    const int64_t e = c.n_embd, wide = hc * e;
    float* x = ops.alloc(n * e);
    ops.embed(weights_.token_embd, x);
    float* streams = ops.alloc(n * wide);  // hc copies of the embedding
    for (int s = 0; s < hc; ++s) ops.copy_2d(x, e, streams + s * e, wide, n, e);
    for (int il = 0; il < c.n_layer; ++il) {
      const int64_t mark = ops.workspace_mark();
      const model::Qwen4ExpLayer& layer = weights_.layers[il];
      if (layer.ple) ple_block(ctx, *layer.ple, weights_.ple_table, il, streams);
      float* out = ops.alloc(n * e);
      HcInput in = hc_input(ctx, layer.hc_attn, streams, n);
      if (const auto* attn = std::get_if<model::AttentionWeights>(&layer.mixer)) {
        if (c.is_qsa_layer(il)) {
          qsa_block(ctx, *attn, layer.indexer, il, in.mixed, out);
        } else {
          attention_block(ctx, *attn, il, in.mixed, out);
        }
      } else {
        deltanet_block(ctx, std::get<model::DeltaNetWeights>(layer.mixer), il, in.mixed, out);
      }
      ops.hc_inject(streams, out, in.inject, n, hc, e);
      in = hc_input(ctx, layer.hc_ffn, streams, n);
      ops.moe(layer.ffn, in.mixed, out, n, c.n_expert, c.n_expert_used);
      // Router lookahead: the next layer's router on this layer's MoE input names the experts it
      // will likely ask for; a streaming backend reads them during the next token mixer.
      if (il + 1 < c.n_layer)
        ops.moe_prefetch(weights_.layers[il + 1].ffn, in.mixed, n, c.n_expert, c.n_expert_used);
      ops.hc_inject(streams, out, in.inject, n, hc, e);
      ops.workspace_release(mark);
    }
    ForwardResult result;
    if (all_hidden) result.all_hidden = hc_input(ctx, weights_.head, streams, n).mixed;
    if (n_out == 0) return result;
    float* last = ops.alloc(n_out * wide);
    ops.gather_output_rows(streams, wide, last);
    result.hidden = hc_input(ctx, weights_.head, last, n_out).mixed;
    float* logits = ops.alloc(n_out * c.n_vocab);
    ops.matmul(weights_.output, result.hidden, logits, n_out);
    result.logits = logits;
    return result;
  }

  bool has_mtp() const override { return false; }
  ForwardResult mtp_forward(ops::Ops&, state::StateStore&, int64_t, int64_t, const float*,
                            int64_t) override {
    fail("qwen4exp files carry no MTP block (llama.cpp's converter drops it)");
  }

 private:
  model::Config config_;
  model::Qwen4ExpWeights weights_;
};

}  // namespace

std::unique_ptr<Model> make_qwen4exp(const gguf::File& file, const model::Config& config,
                                     ops::Ops& ops) {
  return std::make_unique<Qwen4Exp>(file, config, ops);
}

}  // namespace qwenrt::arch
