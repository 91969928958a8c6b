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
  // [logit_rows.size(), n_vocab] to host memory.
  virtual void forward(ops::Ops& ops, state::StateStore& states, const ForwardBatch& batch,
                       float* logits) = 0;
};

std::unique_ptr<Model> make_qwen35(const gguf::File& file, const model::Config& config);
std::unique_ptr<Model> make_qwen35moe(const gguf::File& file, const model::Config& config);

}  // namespace qwenrt::arch
