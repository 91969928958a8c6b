// qwen35: the dense hybrid (Qwen3.6-27B, Qwen3.8-27B and the small Qwen3.5 models).
#include "arch/blocks.h"
#include "core/error.h"

namespace qwenrt::arch {
namespace {

// out = down(silu(gate x) * up x)
void dense_ffn(const BlockContext& ctx, const model::DenseFfnWeights& w, const float* x,
               float* out) {
  ctx.ops.ffn_swiglu(w.gate, w.up, w.down, x, out, ctx.n);
}

class Qwen35 final : public Model {
 public:
  Qwen35(const gguf::File& file, const model::Config& config, ops::Ops& ops)
      : config_(config), weights_(model::bind_qwen35(file, config)) {
    model::for_each_weight(weights_, [&](Weight& w) { w = ops.place(w); });
  }
  const model::Config& config() const override { return config_; }
  ForwardResult forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                        bool all_hidden) override {
    return run_trunk(BlockContext{ops, config_, states, n}, weights_, dense_ffn, n_out, all_hidden);
  }
  bool has_mtp() const override { return weights_.mtp.has_value(); }
  ForwardResult mtp_forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                            const float* hidden, int64_t head_rows) override {
    if (!weights_.mtp) fail("this model has no MTP block");
    return run_mtp(BlockContext{ops, config_, states, n}, *weights_.mtp, dense_ffn, n_out, hidden,
                   head_rows);
  }

 private:
  model::Config config_;
  model::Qwen35Weights weights_;
};

}  // namespace

std::unique_ptr<Model> make_qwen35(const gguf::File& file, const model::Config& config,
                                   ops::Ops& ops) {
  return std::make_unique<Qwen35>(file, config, ops);
}

}  // namespace qwenrt::arch
