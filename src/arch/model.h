// A loaded model: the forward pass of one architecture over a batch of sequences.
#pragma once

#include <cstdint>
#include <memory>

#include "gguf/reader.h"
#include "model/config.h"
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
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const model::Config& config() const = 0;
  // Runs the step of n rows laid out by the last ops.begin_step (its spans' slots advance in
  // `states`, whose pages the engine reserved); returns logits and hidden states of its n_out
  // output rows, and with all_hidden the hidden states of all n rows.
  virtual ForwardResult forward(ops::Ops& ops, state::StateStore& states, int64_t n, int64_t n_out,
                                bool all_hidden) = 0;

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

// Bind the file's tensors and place them on the backend; with shard.size > 1, the rank's share
// of them (model/shard.h; qwen35 and qwen35moe only).
std::unique_ptr<Model> make_qwen35(const gguf::File& file, const model::Config& config,
                                   ops::Ops& ops, model::Shard shard = {});
std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config,
                                      ops::Ops& ops, model::Shard shard = {});
std::unique_ptr<Model> make_qwen4exp(const gguf::File& file, const model::Config& config,
                                     ops::Ops& ops);
// The model of the file's architecture.
std::unique_ptr<Model> make_model(const gguf::File& file, const model::Config& config,
                                  ops::Ops& ops, model::Shard shard = {});

}  // namespace qwenrt::arch
