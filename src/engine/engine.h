// The Engine: a loaded model, its backend and its sequence slots, driven one step at a time.
// One entry point (step) serves the CLI, the server's continuous batching and speculative
// verification: a batch mixes prefill chunks and decode tokens of many sequences.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arch/model.h"
#include "gguf/reader.h"
#include "model/config.h"
#include "model/identity.h"
#include "ops/ops.h"
#include "state/state.h"

namespace qwenrt::engine {

struct EngineOptions {
  std::string backend = "ref";  // only the reference backend exists so far
  int n_slots = 1;              // sequences held at once
  int64_t n_ctx = 0;  // tokens per sequence; 0 = the model's context_length, capped at 32768
  arch::DeltaNetMode deltanet_mode = arch::DeltaNetMode::kAuto;
  // Read every weight page once at load (so the first step does not pay for page faults);
  // on_load_progress(bytes done, bytes total) is called as it goes.
  bool prefault = true;
  std::function<void(uint64_t, uint64_t)> on_load_progress;
};

// Rows of (slot, token, position, wants logits). A slot's tokens must be contiguous in the batch
// and continue its sequence: the first at the slot's current length, then one position each.
struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> slots;
  std::vector<uint8_t> want_logits;

  void add(int slot, int32_t token, int32_t position, bool logits);
  size_t size() const { return tokens.size(); }
};

// Rows for the MTP block: row i drafts position p + 2 of slot slots[i] from the trunk's hidden
// state at p (hidden, n_embd floats a row) and the token at p + 1; positions are the MTP block's
// own, continuing from the slot's n_mtp_tokens.
struct MtpBatch {
  std::vector<int32_t> slots;
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<float> hidden;
};

struct StepOutput {
  std::vector<float> logits;  // [rows wanting logits, n_vocab]
  std::vector<float> hidden;  // [rows wanting logits, n_embd]: after output_norm (MTP input)
};

class Engine {
 public:
  // Opens, validates and binds the model; Error on anything wrong with the file.
  static std::unique_ptr<Engine> load(const std::string& path, const EngineOptions& options = {});

  const model::Config& config() const { return config_; }
  const model::Identity& identity() const { return identity_; }
  const gguf::File& file() const { return file_; }
  state::StateStore& states() { return *states_; }

  // Runs one batch; returns logits [rows wanting logits, n_vocab] in batch order.
  std::vector<float> step(const Batch& batch);
  // The same, also returning the final hidden states of those rows.
  StepOutput step_with_hidden(const Batch& batch);

  bool has_mtp() const { return model_->has_mtp(); }
  // Runs the MTP block; returns draft logits [rows, n_vocab]. Error if the model has none.
  std::vector<float> mtp_step(const MtpBatch& batch);

 private:
  Engine(gguf::File file, const EngineOptions& options);
  void prefault_weights(const std::function<void(uint64_t, uint64_t)>& progress);
  // Checks rows (slot, token, position) and groups them into spans; `next` gives each slot's
  // next expected position.
  arch::ForwardBatch plan(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                          const std::vector<int32_t>& slots,
                          int64_t (*next)(const state::SequenceState&));

  gguf::File file_;
  model::Config config_;
  model::Identity identity_;
  EngineOptions options_;
  std::unique_ptr<ops::Ops> ops_;
  std::unique_ptr<arch::Model> model_;
  std::unique_ptr<state::StateStore> states_;
};

}  // namespace qwenrt::engine
