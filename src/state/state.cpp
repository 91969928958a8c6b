#include "state/state.h"

#include "core/error.h"

namespace qwenrt::state {

StateStore::StateStore(const model::Config& config, int n_slots, int64_t n_ctx)
    : config_(config), n_ctx_(n_ctx) {
  if (n_slots < 1) fail("state: need at least one sequence slot, got {}", n_slots);
  if (n_ctx < 1) fail("state: context size must be positive, got {}", n_ctx);
  slots_.resize(n_slots);
  for (int i = 0; i < n_slots; ++i) reset(i);
}

SequenceState& StateStore::slot(int index) {
  if (index < 0 || index >= n_slots())
    fail("state: slot {} out of range [0, {})", index, n_slots());
  return slots_[index];
}

const SequenceState& StateStore::slot(int index) const {
  if (index < 0 || index >= n_slots())
    fail("state: slot {} out of range [0, {})", index, n_slots());
  return slots_[index];
}

void StateStore::reset(int index) {
  SequenceState& s = slot(index);
  s.n_tokens = 0;
  s.n_mtp_tokens = 0;
  s.layers.assign(config_.n_layer + config_.n_layer_nextn, {});
  for (int il = 0; il < config_.n_layer; ++il) {
    if (config_.is_attention_layer(il)) continue;  // KV rows grow as tokens arrive
    s.layers[il].conv.assign(int64_t{config_.conv_kernel - 1} * config_.conv_channels(), 0.0f);
    s.layers[il].delta.assign(
        int64_t{config_.ssm_v_heads} * config_.ssm_head_dim * config_.ssm_head_dim, 0.0f);
  }
}

void StateStore::restore(int index, const Snapshot& snapshot) {
  if (snapshot.layers.size() != static_cast<size_t>(config_.n_layer + config_.n_layer_nextn)) {
    fail("state: snapshot has {} layers, model has {}", snapshot.layers.size(),
         config_.n_layer + config_.n_layer_nextn);
  }
  slot(index) = snapshot;
}

}  // namespace qwenrt::state
