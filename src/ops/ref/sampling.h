// The sampling semantics every backend follows (sample::Sampler is a thin wrapper over these):
// logit bias, presence / frequency / repetition penalties over the history, then greedy, or
// temperature with top-k, softmax, top-p and min-p, and a pick by the row's uniform draw.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/types.h"

namespace qwenrt::ops::ref {

// The probabilities a row draws from (greedy gives a one-hot vector). Error if no token has a
// finite logit or a bias names a token outside the vocabulary.
std::vector<float> sampling_distribution(std::span<const float> logits, const SamplingRow& row);
// The token the row's draw u picks from that distribution (the arg max when greedy).
int32_t pick_token(std::span<const float> probs, const SamplingRow& row);
// Log-softmax of the raw logits: the chosen token's value and the top n_top (ties to the lower id).
void fill_logprobs(std::span<const float> logits, int n_top, SampledToken& out);

}  // namespace qwenrt::ops::ref
