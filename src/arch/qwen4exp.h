// qwen4exp's own blocks (qwen4exp.cpp), exposed for their tests against transformers' modules.
#pragma once

#include "arch/blocks.h"

namespace qwenrt::arch {

// A hyper-connection's input side over `rows` rows of the streams [rows, hc, n_embd]: the mixed
// block input [rows, n_embd] and, when the module injects, the injection logits [rows, hc]
// (hc_inject turns them into the weights 2 sigmoid(logit / hc)).
struct HcInput {
  float* mixed;
  float* inject;
};
HcInput hc_input(const BlockContext& ctx, const model::HyperConnectionWeights& w,
                 const float* streams, int64_t rows);

// out [n, n_embd] = Qwen Sparse Attention of x (state layer il: KV and indexer keys).
void qsa_block(const BlockContext& ctx, const model::AttentionWeights& w,
               const model::IndexerWeights& idx, int il, const float* x, float* out);

// streams [n, hc, n_embd] += PLE(streams) (state layer il: token context and conv history).
void ple_block(const BlockContext& ctx, const model::PleWeights& w, const model::Weight& table,
               int il, float* streams);

}  // namespace qwenrt::arch
