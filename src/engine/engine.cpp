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

void Engine::prefault_weights(const std::function<void(uint64_t, uint64_t)>& progress) {
  uint64_t total = 0, done = 0;
  for (const auto& t : file_.tensors()) total += t.n_bytes;
  constexpr uint64_t kPage = 4096, kReport = 64ull << 20;
  uint64_t next_report = 0;
  volatile uint8_t sink = 0;  // the reads must happen
  for (const auto& t : file_.tensors()) {
    for (uint64_t off = 0; off < t.n_bytes; off += kPage) sink = sink + t.data[off];
    done += t.n_bytes;
    if (progress && (done >= next_report || done == total)) {
      progress(done, total);
      next_report = done + kReport;
    }
  }
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
  if (options.prefault) prefault_weights(options.on_load_progress);
  int64_t n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(config_.n_ctx_train, 32768);
  states_ = std::make_unique<state::StateStore>(config_, options.n_slots, n_ctx);
}

arch::ForwardBatch Engine::plan(const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& positions,
                                const std::vector<int32_t>& slots,
                                int64_t (*next)(const state::SequenceState&)) {
  const size_t n = tokens.size();
  if (positions.size() != n || slots.size() != n) {
    fail("batch: tokens, positions and slots must have the same length");
  }
  arch::ForwardBatch fb;
  fb.tokens = tokens.data();
  fb.positions = positions.data();
  fb.n = static_cast<int64_t>(n);
  fb.deltanet_mode = options_.deltanet_mode;
  std::vector<int> seen;
  for (size_t i = 0; i < n; ++i) {
    const int slot = slots[i];
    const int32_t token = tokens[i];
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
    const int64_t expected = next(states_->slot(slot)) + span.count;
    if (positions[i] != expected) {
      fail("batch row {}: slot {} expects position {}, got {}", i, slot, expected, positions[i]);
    }
    if (expected >= states_->n_ctx()) {
      fail("batch row {}: slot {} would hold {} tokens, the context is {}", i, slot, expected + 1,
           states_->n_ctx());
    }
    ++span.count;
  }
  return fb;
}

StepOutput Engine::step_with_hidden(const Batch& batch) {
  if (batch.size() == 0) return {};
  if (batch.want_logits.size() != batch.size()) {
    fail("batch: tokens, positions, slots and want_logits must have the same length");
  }
  arch::ForwardBatch fb = plan(batch.tokens, batch.positions, batch.slots,
                               [](const state::SequenceState& s) { return s.n_tokens; });
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch.want_logits[i]) fb.logit_rows.push_back(static_cast<int64_t>(i));
  }
  StepOutput out;
  out.logits.resize(fb.logit_rows.size() * config_.n_vocab);
  out.hidden.resize(fb.logit_rows.size() * config_.n_embd);
  ops_->reset_workspace();
  model_->forward(*ops_, *states_, fb, out.logits.data(), out.hidden.data());
  ops_->reset_workspace();
  for (const auto& span : fb.spans) states_->slot(span.slot).n_tokens += span.count;
  return out;
}

std::vector<float> Engine::step(const Batch& batch) {
  return step_with_hidden(batch).logits;
}

std::vector<float> Engine::mtp_step(const MtpBatch& batch) {
  if (!model_->has_mtp()) fail("{}: the model has no MTP block", file_.path());
  const size_t n = batch.tokens.size();
  if (n == 0) return {};
  if (batch.hidden.size() != n * config_.n_embd) {
    fail("MTP batch: {} hidden values for {} rows of {}", batch.hidden.size(), n, config_.n_embd);
  }
  arch::ForwardBatch fb = plan(batch.tokens, batch.positions, batch.slots,
                               [](const state::SequenceState& s) { return s.n_mtp_tokens; });
  for (size_t i = 0; i < n; ++i) fb.logit_rows.push_back(static_cast<int64_t>(i));
  std::vector<float> logits(n * config_.n_vocab);
  ops_->reset_workspace();
  model_->mtp_forward(*ops_, *states_, fb, batch.hidden.data(), logits.data());
  ops_->reset_workspace();
  for (const auto& span : fb.spans) states_->slot(span.slot).n_mtp_tokens += span.count;
  return logits;
}

}  // namespace qwenrt::engine
