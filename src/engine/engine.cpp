#include "engine/engine.h"

#include <algorithm>

#include "core/error.h"

namespace qwenrt::engine {

void Batch::add(int slot, int32_t token, int32_t position, bool logits) {
  tokens.push_back(token);
  positions.push_back(position);
  slots.push_back(slot);
  want_logits.push_back(logits ? 1 : 0);
}

std::unique_ptr<Engine> Engine::load(const std::string& path, const EngineOptions& options) {
  return std::unique_ptr<Engine>(new Engine(gguf::File::open(path).value(), options));
}

Engine::Engine(gguf::File file, const EngineOptions& options)
    : file_(std::move(file)),
      config_(model::Config::from_gguf(file_)),
      identity_(model::identify(file_)),
      options_(options) {
  if (options.backend != "ref") fail("unknown backend '{}' (available: ref)", options.backend);
  ops_ = ops::make_ref_ops();
  model_ =
      config_.is_moe() ? arch::make_qwen35moe(file_, config_) : arch::make_qwen35(file_, config_);
  int64_t n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(config_.n_ctx_train, 32768);
  states_ = std::make_unique<state::StateStore>(config_, options.n_slots, n_ctx);
}

std::vector<float> Engine::step(const Batch& batch) {
  const size_t n = batch.size();
  if (n == 0) return {};
  if (batch.positions.size() != n || batch.slots.size() != n || batch.want_logits.size() != n) {
    fail("batch: tokens, positions, slots and want_logits must have the same length");
  }
  arch::ForwardBatch fb;
  fb.tokens = batch.tokens.data();
  fb.positions = batch.positions.data();
  fb.n = static_cast<int64_t>(n);
  fb.deltanet_mode = options_.deltanet_mode;
  std::vector<int> seen;
  for (size_t i = 0; i < n; ++i) {
    const int slot = batch.slots[i];
    const int32_t token = batch.tokens[i];
    if (token < 0 || token >= config_.n_vocab) {
      fail("batch row {}: token id {} is outside the vocabulary of {} tokens", i, token,
           config_.n_vocab);
    }
    if (fb.spans.empty() || fb.spans.back().slot != slot) {
      if (std::find(seen.begin(), seen.end(), slot) != seen.end()) {
        fail("batch row {}: the tokens of slot {} are not contiguous", i, slot);
      }
      seen.push_back(slot);
      fb.spans.push_back({slot, static_cast<int64_t>(i), 0});
    }
    arch::SeqSpan& span = fb.spans.back();
    const int64_t expected = states_->slot(slot).n_tokens + span.count;
    if (batch.positions[i] != expected) {
      fail("batch row {}: slot {} expects position {}, got {}", i, slot, expected,
           batch.positions[i]);
    }
    if (expected >= states_->n_ctx()) {
      fail("batch row {}: slot {} would hold {} tokens, the context is {}", i, slot, expected + 1,
           states_->n_ctx());
    }
    ++span.count;
    if (batch.want_logits[i]) fb.logit_rows.push_back(static_cast<int64_t>(i));
  }
  std::vector<float> logits(fb.logit_rows.size() * config_.n_vocab);
  ops_->reset_workspace();
  model_->forward(*ops_, *states_, fb, logits.data());
  ops_->reset_workspace();
  for (const auto& span : fb.spans) states_->slot(span.slot).n_tokens += span.count;
  return logits;
}

}  // namespace qwenrt::engine
