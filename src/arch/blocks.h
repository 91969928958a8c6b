// The blocks both architectures share: gated full attention, Gated DeltaNet, and the trunk loop
// (SPEC.md "Layer skeleton"), written as short sequences of Ops calls over the whole batch.
#pragma once

#include <type_traits>

#include "arch/model.h"
#include "model/weights.h"

namespace qwenrt::arch {

// Everything a block needs besides its weights and its input/output rows.
struct BlockContext {
  ops::Ops& ops;
  const model::Config& config;  // the rank's (its heads) under tensor parallelism
  state::StateStore& states;
  int64_t n;      // rows of the step
  int rank = 0;   // the rank's index in the state store (tensor and pipeline parallelism)
  int ranks = 1;  // tensor parallelism (model/shard.h): the ranks whose outputs are summed
};

// x [n, n_embd] = the sum of every rank's x: the block outputs of projections split by their
// input (attention and DeltaNet outputs, FFN down, the rank's experts).
inline void sum_over_ranks(const BlockContext& ctx, float* x) {
  if (ctx.ranks > 1) ctx.ops.all_reduce_sum(x, ctx.n * ctx.config.n_embd);
}

// out [n, n_embd] = gated attention of x [n, n_embd] (already normed), appending to the KV of
// each span's slot in state layer il.
void attention_block(const BlockContext& ctx, const model::AttentionWeights& w, int il,
                     const float* x, float* out);

// Gated attention's two halves around its core, for blocks that run another core (QSA):
// the projections with their norms and RoPE, and the gated output projection.
struct AttentionRows {
  float* q;     // [n, n_head, head_dim]
  float* gate;  // [n, n_head * head_dim]
  float* k;     // [n, n_head_kv, head_dim]
  float* v;     // [n, n_head_kv, head_dim]
};
AttentionRows attention_projections(const BlockContext& ctx, const model::AttentionWeights& w,
                                    const float* x);
// The attention core's arguments over those rows, writing attn [n, n_head * head_dim].
ops::AttentionArgs attention_core_args(const BlockContext& ctx, const AttentionRows& rows, int il,
                                       float* attn);
// out [n, n_embd] = W_o (attn * sigmoid(gate)); attn is overwritten.
void attention_output(const BlockContext& ctx, const model::AttentionWeights& w,
                      const AttentionRows& rows, float* attn, float* out);
// out [n, n_embd] = Gated DeltaNet of x [n, n_embd] (already normed), advancing conv and delta
// state of each span's slot in state layer il.
void deltanet_block(const BlockContext& ctx, const model::DeltaNetWeights& w, int il,
                    const float* x, float* out);

// The layer loop and the head, for any FFN kind: ffn(ctx, ffn_weights, in, out) runs the residual
// add and norm `in` describes (in.x += in.delta, in.h = rmsnorm(in.x)), then writes out [n, n_embd]
// from in.h: one call, so that a backend can fuse the norm into the FFN's first kernel. Runs the
// stage's layers (model/pipeline.h): a stage after the first starts from the residual stream
// `input`, a stage before the last ends in its own.
template <class Ffn, class FfnFn>
ForwardResult run_trunk(const BlockContext& ctx, const model::ModelWeights<Ffn>& w, FfnFn ffn,
                        int64_t n_out, bool all_hidden, const model::Stage& stage,
                        const float* input) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.n, e = c.n_embd;
  float* x = ops.alloc(n * e);
  float* h = ops.alloc(n * e);
  float* mixed = ops.alloc(n * e);
  if (stage.is_first()) {
    ops.embed(w.token_embd, x);
  } else {
    ops.copy_2d(input, e, x, e, n, e);
  }
  ops.rmsnorm(x, w.layers[stage.first].attn_norm, h, n, e, c.rms_eps);
  for (int il = stage.first; il < stage.end; ++il) {
    // h = attn_norm(x) on entry; each residual add is fused with the norm that follows it. The
    // layer's temporaries go back to the workspace once x and h are updated.
    const int64_t mark = ops.workspace_mark();
    const auto& layer = w.layers[il];
    if (const auto* attn = std::get_if<model::AttentionWeights>(&layer.mixer)) {
      attention_block(ctx, *attn, il, h, mixed);
    } else {
      deltanet_block(ctx, std::get<model::DeltaNetWeights>(layer.mixer), il, h, mixed);
    }
    sum_over_ranks(ctx, mixed);
    ffn(ctx, layer.ffn, {x, mixed, &layer.post_attn_norm, h, e, c.rms_eps}, mixed);
    sum_over_ranks(ctx, mixed);
    // Router lookahead: the next layer's router on this layer's FFN input names the experts it
    // will likely ask for; a backend streaming experts reads them during the next mixer.
    if constexpr (std::is_same_v<Ffn, model::MoeFfnWeights>) {
      if (il + 1 < stage.end)
        ops.moe_prefetch(w.layers[il + 1].ffn, h, n, c.n_expert, c.n_expert_used);
    }
    if (il + 1 < stage.end) {
      ops.add_rmsnorm(x, mixed, w.layers[il + 1].attn_norm, h, n, e, c.rms_eps);
    } else {  // the next stage norms x with its first layer's norm (the same floats as fused)
      ops.add(x, mixed, x, n * e);
    }
    ops.workspace_release(mark);
  }
  if (!stage.is_last()) return {.residual = x};
  ForwardResult result;
  if (all_hidden) {
    // Apart from the output rows' own norm below, so that the logits are exactly those of a step
    // that does not ask for every row's hidden state.
    float* every = ops.alloc(n * e);
    ops.rmsnorm(x, w.output_norm, every, n, e, c.rms_eps);
    result.all_hidden = every;
  }
  if (n_out == 0) return result;
  float* last = ops.alloc(n_out * e);
  ops.gather_output_rows(x, e, last);
  ops.rmsnorm(last, w.output_norm, last, n_out, e, c.rms_eps);
  // The rank's rows of the head under tensor parallelism (the engine gathers them).
  float* logits = ops.alloc(n_out * w.output.view.ne[1]);
  ops.matmul(w.output, last, logits, n_out);
  result.logits = logits;
  result.hidden = last;
  return result;
}

// The MTP block (SPEC.md "MTP head"): x = eh_proj [enorm(embed(next)); hnorm(hidden)], one gated
// attention layer (state layer n_layer) and FFN with residuals anchored on x, then the head over
// the step's n_out output rows: logits [n_out, head_rows] from the head's first head_rows rows
// (0: all of them; -1: none, under tensor parallelism when they lie on other ranks).
template <class Ffn, class FfnFn>
ForwardResult run_mtp(const BlockContext& ctx, const model::MtpWeights<Ffn>& w, FfnFn ffn,
                      int64_t n_out, const float* hidden_in, int64_t head_rows = 0) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.n, e = c.n_embd;
  float* embed = ops.alloc(n * e);
  float* hidden = ops.alloc(n * e);
  float* both = ops.alloc(n * 2 * e);
  ops.embed(w.embed, embed);
  ops.rmsnorm(embed, w.enorm, embed, n, e, c.rms_eps);
  ops.rmsnorm(hidden_in, w.hnorm, hidden, n, e, c.rms_eps);
  ops.copy_2d(embed, e, both, 2 * e, n, e);  // the embedding is the low half
  ops.copy_2d(hidden, e, both + e, 2 * e, n, e);
  float* x = ops.alloc(n * e);
  float* h = ops.alloc(n * e);
  float* mixed = ops.alloc(n * e);
  ops.matmul(w.eh_proj, both, x, n);
  ops.rmsnorm(x, w.attn_norm, h, n, e, c.rms_eps);
  attention_block(ctx, w.attn, c.n_layer, h, mixed);
  sum_over_ranks(ctx, mixed);
  ffn(ctx, w.ffn, {x, mixed, &w.post_attn_norm, h, e, c.rms_eps}, mixed);
  sum_over_ranks(ctx, mixed);
  ops.add(x, mixed, x, n * e);
  // The state after the head norm (shared_head_norm) is what a chained draft's row takes as its
  // hidden input, as llama.cpp's qwen35 MTP chain (the MTP row's t_h_nextn after
  // shared_head_norm) and vLLM's Qwen3.5 MTP (its output after self.norm) do.
  ops.rmsnorm(x, w.head_norm, x, n, e, c.rms_eps);
  if (n_out == 0) return {};
  float* out = x;
  if (n_out < n) {
    out = ops.alloc(n_out * e);
    ops.gather_output_rows(x, e, out);
  }
  if (head_rows < 0) return {.hidden = out};  // none of the rows lie on this rank
  Weight head = w.head;
  if (head_rows > 0 && head_rows < head.view.ne[1]) {  // a prefix of the rows: still contiguous
    head.view.ne[1] = head_rows;
    head.view.nb[2] = head.view.nb[1] * head_rows;
    head.view.nb[3] = head.view.nb[2];
  }
  float* logits = ops.alloc(n_out * head.view.ne[1]);
  ops.matmul(head, out, logits, n_out);
  return {.logits = logits, .hidden = out};
}

}  // namespace qwenrt::arch
