// A loaded model: the forward pass of one architecture over a batch of sequences.
#pragma once

#include <cstdint>
#include <memory>

#include "gguf/reader.h"
#include "model/config.h"
#include "model/pipeline.h"
#include "model/shard.h"
#include "ops/ops.h"
#include "state/state.h"

namespace qwenrt::arch {

using ops::DeltaNetMode;

// What a forward pass leaves in the backend's workspace (valid until its reset).
struct ForwardResult {
  const float* logits = nullptr;  // [n_output_rows, n_vocab]
  const float* hidden = nullptr;  // [n_output_rows, n_embd]: after output_norm (the MTP input)
  // [n, n_embd]: every row's hidden state after output_norm, when the step asked for it (the MTP
  // drafter feeds every position to the MTP block, not only the output rows).
  const float* all_hidden = nullptr;
  // [n, n_embd]: the residual stream after the stage's last layer, on every pipeline stage but
  // the last (model/pipeline.h); the next stage's input.
  const float* residual = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const model::Config& config() const = 0;
  // Runs the step of n rows laid out by the last ops.begin_step (its spans' slots advance in
  // `states`, whose pages the engine reserved); returns logits and hidden states of its n_out
  // output rows, and with all_hidden the hidden states of all n rows. A pipeline stage after the
  // first takes the previous stage's residual stream `input` [n, n_embd] (backend memory) in place
  // of the embedded tokens; a stage before the last returns only its own (ForwardResult::residual).
  virtual ForwardResult forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                                bool all_hidden, const float* input = nullptr) = 0;

  // Whether the file holds an MTP block.
  virtual bool has_mtp() const = 0;
  // The MTP block over the step's rows: row i pairs the trunk's hidden state `hidden` [n, n_embd]
  // (backend memory) at some position p with the step's token i = the token at p + 1; the step's
  // positions are the MTP block's own (it keeps its own KV track). Returns, for its n_out output
  // rows, draft logits for position p + 2 [n_out, n_vocab] and the block's hidden state after its
  // head norm [n_out, n_embd] (a chained draft's input in place of the trunk's).
  virtual ForwardResult mtp_forward(ops::Ops& ops, state::StateStore& states, int64_t n,
                                    int64_t n_out, const float* hidden, int64_t head_rows) = 0;
};

// How a rank's model is cut: its tensor-parallel share (model/shard.h) of its pipeline stage's
// layers (model/pipeline.h; an empty stage, count 0: the whole trunk).
struct Split {
  model::Shard shard;
  model::Stage stage{.count = 0};
  int state_rank = 0;  // the rank's index in the state store
};

// Bind the file's tensors and place them on the backend; with a split, the rank's share of them
// (qwen35 and qwen35moe only).
std::unique_ptr<Model> make_qwen35(const gguf::File& file, const model::Config& config,
                                   ops::Ops& ops, Split split = {});
std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config,
                                      ops::Ops& ops, Split split = {});
std::unique_ptr<Model> make_qwen4exp(const gguf::File& file, const model::Config& config,
                                     ops::Ops& ops);
// The model of the file's architecture.
std::unique_ptr<Model> make_model(const gguf::File& file, const model::Config& config,
                                  ops::Ops& ops, Split split = {});

}  // namespace qwenrt::arch
