// qwen35moe: the MoE hybrid (Qwen3.6-35B-A3B and the larger Qwen3.5 MoE models).
#include "arch/hybrid.h"

namespace qwenrt::arch {
namespace {

// h = norm(x += delta); out = sigmoid(shared_gate_inp . h) * shared(h) + sum over the top-k
// experts of w_j expert_j(h), routing included: one backend op (the norm may fold into routing).
void moe_ffn(const BlockContext& ctx, const model::MoeFfnWeights& w,
             const ops::Ops::NormedInput& in, float* out) {
  ctx.ops.add_rmsnorm_moe(in, w, out, ctx.n, ctx.config.n_expert, ctx.config.n_expert_used);
}

}  // namespace

std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config,
                                      ops::Ops& ops, Split split) {
  return std::make_unique<Hybrid<model::Qwen35MoeWeights, model::bind_qwen35moe, moe_ffn>>(
      file, config, ops, split);
}

}  // namespace qwenrt::arch
