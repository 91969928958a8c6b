// A loaded model: the forward pass of one architecture over a batch of sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gguf/reader.h"
#include "model/config.h"
#include "ops/ops.h"
#include "state/state.h"

namespace qwenrt::arch {

// How DeltaNet layers run a span of several tokens (one token always runs the recurrence).
enum class DeltaNetMode { kAuto, kRecurrent, kChunked };

// One sequence's tokens inside a batch: rows [begin, begin + count), all of slot `slot`.
struct SeqSpan {
  int slot = 0;
  int64_t begin = 0;
  int64_t count = 0;
};

struct ForwardBatch {
  const int32_t* tokens = nullptr;     // [n]
  const int32_t* positions = nullptr;  // [n]
  int64_t n = 0;
  std::vector<SeqSpan> spans;       // cover [0, n) in order
  std::vector<int64_t> logit_rows;  // rows whose logits are wanted, ascending
  DeltaNetMode deltanet_mode = DeltaNetMode::kAuto;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const model::Config& config() const = 0;
  // Runs the batch, advancing each span's slot state; writes logits
  // [logit_rows.size(), n_vocab] to host memory, and when `hidden` is not null the final hidden
  // states of the same rows after output_norm [logit_rows.size(), n_embd] (the MTP block's input).
  virtual void forward(ops::Ops& ops, state::StateStore& states, const ForwardBatch& batch,
                       float* logits, float* hidden = nullptr) = 0;

  // Whether the file holds an MTP block.
  virtual bool has_mtp() const = 0;
  // The MTP block over a batch: row i pairs the trunk's hidden state `hidden` [n, n_embd] (host)
  // at some position p with batch.tokens[i] = the token at p + 1; batch.positions are the MTP
  // block's own positions (0, 1, ... per slot: it keeps its own KV rows). Writes draft logits for
  // position p + 2 of every row [n, n_vocab] to host memory.
  virtual void mtp_forward(ops::Ops& ops, state::StateStore& states, const ForwardBatch& batch,
                           const float* hidden, float* logits) = 0;
};

std::unique_ptr<Model> make_qwen35(const gguf::File& file, const model::Config& config);
std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config);

}  // namespace qwenrt::arch
