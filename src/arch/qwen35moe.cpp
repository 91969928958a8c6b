// qwen35moe: the MoE hybrid (Qwen3.6-35B-A3B and the larger Qwen3.5 MoE models).
#include "arch/hybrid.h"

namespace qwenrt::arch {
namespace {

// out = sigmoid(shared_gate_inp . x) * shared(x) + sum over the top-k experts of w_j expert_j(x),
// routing included: one backend op.
void moe_ffn(const BlockContext& ctx, const model::MoeFfnWeights& w, const float* x, float* out) {
  ctx.ops.moe(w, x, out, ctx.n, ctx.config.n_expert, ctx.config.n_expert_used);
}

}  // namespace

std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config,
                                      ops::Ops& ops, Split split) {
  return std::make_unique<Hybrid<model::Qwen35MoeWeights, model::bind_qwen35moe, moe_ffn>>(
      file, config, ops, split);
}

}  // namespace qwenrt::arch
