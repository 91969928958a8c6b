// qwen35moe: the MoE hybrid (Qwen3.6-35B-A3B and the larger Qwen3.5 MoE models).
#include <vector>

#include "arch/blocks.h"
#include "core/error.h"

namespace qwenrt::arch {
namespace {

// out = sigmoid(shared_gate_inp . x) * shared(x) + sum over the top-k experts of w_j expert_j(x)
void moe_ffn(const BlockContext& ctx, const model::MoeFfnWeights& w, const float* x, float* out) {
  ops::Ops& ops = ctx.ops;
  const model::Config& c = ctx.config;
  const int64_t n = ctx.batch.n, sff = c.n_ff_shexp;
  const int k = c.n_expert_used;

  float* router_logits = ops.alloc(n * c.n_expert);
  ops.matmul(w.router, x, router_logits, n);
  std::vector<float> host_logits(n * c.n_expert);
  ops.download(router_logits, host_logits.data(), n * c.n_expert);
  std::vector<int32_t> ids(n * k);
  std::vector<float> weights(n * k);
  ops.moe_route(host_logits.data(), n, c.n_expert, k, ids.data(), weights.data());

  float* gate = ops.alloc(n * sff);
  float* up = ops.alloc(n * sff);
  float* shared_scale = ops.alloc(n);
  ops.matmul(w.shared_gate, x, gate, n);
  ops.matmul(w.shared_up, x, up, n);
  ops.silu_mul(gate, up, gate, n * sff);
  ops.matmul(w.shared_down, gate, out, n);
  ops.matmul(w.shared_gate_inp, x, shared_scale, n);  // [n_embd] as a one-row matrix
  ops.scale_rows_sigmoid(out, shared_scale, n, c.n_embd);
  ops.moe_experts(w, x, ids.data(), weights.data(), out, n, k);
}

class Qwen35Moe final : public Model {
 public:
  Qwen35Moe(const gguf::File& file, const model::Config& config)
      : config_(config), weights_(model::bind_qwen35moe(file, config)) {}
  const model::Config& config() const override { return config_; }
  void forward(ops::Ops& ops, state::StateStore& states, const ForwardBatch& batch, float* logits,
               float* hidden) override {
    run_trunk(BlockContext{ops, config_, batch, states}, weights_, moe_ffn, logits, hidden);
  }
  bool has_mtp() const override { return weights_.mtp.has_value(); }
  void mtp_forward(ops::Ops& ops, state::StateStore& states, const ForwardBatch& batch,
                   const float* hidden, float* logits) override {
    if (!weights_.mtp) fail("this model has no MTP block");
    run_mtp(BlockContext{ops, config_, batch, states}, *weights_.mtp, moe_ffn, hidden, logits);
  }

 private:
  model::Config config_;
  model::Qwen35MoeWeights weights_;
};

}  // namespace

std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config) {
  return std::make_unique<Qwen35Moe>(file, config);
}

}  // namespace qwenrt::arch
