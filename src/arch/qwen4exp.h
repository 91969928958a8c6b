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

}  // namespace qwenrt::arch
