// qwen35moe: the MoE hybrid (Qwen3.6-35B-A3B and the larger Qwen3.5 MoE models).
#include "arch/blocks.h"
#include "core/error.h"

namespace qwenrt::arch {
namespace {

// out = sigmoid(shared_gate_inp . x) * shared(x) + sum over the top-k experts of w_j expert_j(x),
// routing included: one backend op.
void moe_ffn(const BlockContext& ctx, const model::MoeFfnWeights& w, const float* x, float* out) {
  ctx.ops.moe(w, x, out, ctx.n, ctx.config.n_expert, ctx.config.n_expert_used);
}

class Qwen35Moe final : public Model {
 public:
  Qwen35Moe(const gguf::File& file, const model::Config& config, ops::Ops& ops)
      : config_(config), weights_(model::bind_qwen35moe(file, config)) {
    model::for_each_weight(weights_, [&](Weight& w) { w = ops.place(w); });
  }
  const model::Config& config() const override { return config_; }
  ForwardResult forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                        bool all_hidden) override {
    return run_trunk(BlockContext{ops, config_, states, n}, weights_, moe_ffn, n_out, all_hidden);
  }
  bool has_mtp() const override { return weights_.mtp.has_value(); }
  ForwardResult mtp_forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                            const float* hidden, int64_t head_rows) override {
    if (!weights_.mtp) fail("this model has no MTP block");
    return run_mtp(BlockContext{ops, config_, states, n}, *weights_.mtp, moe_ffn, n_out, hidden,
                   head_rows);
  }

 private:
  model::Config config_;
  model::Qwen35MoeWeights weights_;
};

}  // namespace

std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config,
                                      ops::Ops& ops) {
  return std::make_unique<Qwen35Moe>(file, config, ops);
}

}  // namespace qwenrt::arch
