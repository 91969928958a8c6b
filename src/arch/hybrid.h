// The model class of both hybrid architectures (qwen35, qwen35moe): bind the file's tensors, take
// the rank's share of them under tensor parallelism (model/shard.h), place them, and run the trunk
// or the MTP block with the architecture's FFN.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "arch/blocks.h"
#include "core/error.h"
#include "model/shard.h"

namespace qwenrt::arch {

// Weights: model::Qwen35Weights or Qwen35MoeWeights; bind: its binder; ffn: ffn(ctx, w, in, out)
// (blocks.h, run_trunk).
template <class Weights, auto bind, auto ffn>
class Hybrid final : public Model {
 public:
  Hybrid(const gguf::File& file, const model::Config& config, ops::Ops& ops, Split split)
      : config_(model::shard_config(config, split.shard)),
        shard_(split.shard),
        stage_(split.stage.count > 0 ? split.stage : model::whole_trunk(config)),
        state_rank_(split.state_rank),
        weights_(bind_split(file, config, shard_, stage_, arena_)) {
    // Each distinct tensor once (the MTP block's head and embedding are often the trunk's).
    std::map<std::tuple<const void*, DType, int64_t, int64_t, int64_t>, Weight> placed;
    model::for_each_weight(weights_, [&](Weight& w) {
      if (!w.present()) return;  // off the rank's pipeline stage
      const auto key =
          std::make_tuple(w.view.data, w.view.dtype, w.view.ne[0], w.view.ne[1], w.view.ne[2]);
      auto it = placed.find(key);
      if (it == placed.end()) it = placed.emplace(key, ops.place(w)).first;
      w = it->second;
    });
    // The rank's copies the backend copied again (repacked) are not read any more.
    std::vector<const void*> in_use;
    for (const auto& [key, w] : placed) in_use.push_back(w.view.data);
    arena_.keep_only(in_use);
  }
  const model::Config& config() const override { return config_; }
  ForwardResult forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                        bool all_hidden, const float* input) override {
    if (!stage_.is_first() && !input) fail("pipeline stage {}: no input", stage_.index);
    return run_trunk(context(ops, states, n), weights_, ffn, n_out, all_hidden, stage_, input);
  }
  bool has_mtp() const override { return weights_.mtp.has_value(); }
  ForwardResult mtp_forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                            const float* hidden, int64_t head_rows) override {
    if (!weights_.mtp) fail("this model has no MTP block");
    return run_mtp(context(ops, states, n), *weights_.mtp, ffn, n_out, hidden,
                   local_head_rows(head_rows));
  }

 private:
  BlockContext context(ops::Ops& ops, state::StateStore& states, int64_t n) const {
    return {ops, config_, states, n, state_rank_, shard_.size};
  }
  // The file's weights, cut to the stage's, then to the rank's share of them.
  static Weights bind_split(const gguf::File& file, const model::Config& config, model::Shard shard,
                            const model::Stage& stage, model::ShardArena& arena) {
    Weights w = bind(file, config);
    if (stage.count > 1) model::keep_stage(w, stage);
    arena.set_sources_mapped(file.mapped());
    return shard.size > 1 ? model::shard_weights(w, config, shard, arena) : w;
  }
  // The first `rows` rows of the whole head (0: all) as rows of this rank's share: 0 = all of
  // them, -1 = none.
  int64_t local_head_rows(int64_t rows) const {
    if (shard_.size == 1 || rows <= 0) return rows;
    const int64_t local = model::head_rows_on_rank(config_, shard_, rows);
    return local == 0 ? -1 : local;
  }

  model::Config config_;
  model::Shard shard_;
  model::Stage stage_;
  int state_rank_;
  model::ShardArena arena_;  // before weights_: the shared copies they may view
  Weights weights_;
};

}  // namespace qwenrt::arch
