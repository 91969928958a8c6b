// qwen35: the dense hybrid (Qwen3.6-27B, Qwen3.8-27B and the small Qwen3.5 models).
#include "arch/hybrid.h"

namespace qwenrt::arch {
namespace {

// h = norm(x += delta); out = down(silu(gate h) * up h)
void dense_ffn(const BlockContext& ctx, const model::DenseFfnWeights& w,
               const ops::Ops::NormedInput& in, float* out) {
  ctx.ops.add_rmsnorm(in.x, in.delta, *in.norm, in.h, ctx.n, in.dim, in.eps);
  ctx.ops.ffn_swiglu(w.gate, w.up, w.down, in.h, out, ctx.n);
}

}  // namespace

std::unique_ptr<Model> make_qwen35(const gguf::File& file, const model::Config& config,
                                   ops::Ops& ops, Split split) {
  return std::make_unique<Hybrid<model::Qwen35Weights, model::bind_qwen35, dense_ffn>>(file, config,
                                                                                       ops, split);
}

}  // namespace qwenrt::arch
