// Sampling on the CPU backend: the semantics of ops/ref/sampling.cpp (bias, penalties, greedy or
// temperature + top-k + softmax + top-p + min-p, the pick by the row's draw, raw
// log-probabilities), with the same arithmetic in the same order, so it picks the same token; its
// buffers are kept between calls, so a decode step does not allocate.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/types.h"

namespace qwenrt::ops::cpu {

class Sampler {
 public:
  // Samples one row of logits [n_vocab] into out. Error as ref::sampling_distribution.
  void sample(const float* logits, int64_t n_vocab, const SamplingRow& row, int n_top,
              SampledToken& out);

 private:
  // The token after bias, penalties, temperature and filters (the general path).
  void choose(const float* logits, int64_t n_vocab, const SamplingRow& row, SampledToken& out);
  // out's log-probability and its top n_top from the raw logits.
  void log_probabilities(const float* logits, int64_t n_vocab, int n_top, SampledToken& out);

  std::vector<double> adjusted_;                 // [n_vocab] logits after bias and penalties
  std::vector<int32_t> counts_;                  // [n_vocab] history counts (zero between calls)
  std::vector<int32_t> order_;                   // [n_vocab] candidate ids
  std::vector<double> probs_;                    // [top-k] softmax of the candidates
  std::vector<std::pair<int32_t, float>> kept_;  // kept candidates, by id for the pick
};

}  // namespace qwenrt::ops::cpu
