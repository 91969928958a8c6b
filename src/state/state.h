// Per-sequence state: KV rows for attention layers, conv + delta state for DeltaNet layers.
//
// Recurrent state cannot be truncated, so rollback is snapshot + restore; speculation and the
// prefix cache are built on that. The reference layout is contiguous host vectors per slot;
// paged device KV comes with the fast backends behind the same slot interface.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace qwenrt::state {

struct LayerState {
  std::vector<float> k;      // attention: [n_tokens, n_head_kv * head_dim]
  std::vector<float> v;      // attention: [n_tokens, n_head_kv * head_dim]
  std::vector<float> conv;   // DeltaNet: [conv_kernel - 1, conv_channels], oldest input first
  std::vector<float> delta;  // DeltaNet: [Hv, D (key), D (value)]
};

struct SequenceState {
  int64_t n_tokens = 0;            // tokens consumed so far (the next position)
  int64_t n_mtp_tokens = 0;        // positions the MTP block has seen (its KV rows)
  std::vector<LayerState> layers;  // trunk layers, then the MTP blocks' attention
};

// A saved copy of one slot's state.
using Snapshot = SequenceState;

class StateStore {
 public:
  StateStore(const model::Config& config, int n_slots, int64_t n_ctx);

  int n_slots() const { return static_cast<int>(slots_.size()); }
  int64_t n_ctx() const { return n_ctx_; }
  SequenceState& slot(int index);
  const SequenceState& slot(int index) const;

  // Empties a slot (zero recurrent state, no KV).
  void reset(int index);
  Snapshot snapshot(int index) const { return slot(index); }
  void restore(int index, const Snapshot& snapshot);

 private:
  const model::Config& config_;
  int64_t n_ctx_;
  std::vector<SequenceState> slots_;
};

}  // namespace qwenrt::state
