// Token sampling: greedy, temperature, top-k, top-p, min-p, presence / frequency / repetition
// penalties, logit bias, seeded RNG; and the per-checkpoint, per-mode defaults of the official
// model cards (SPEC.md). Explicit values always win over defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/identity.h"
#include "ops/types.h"

namespace qwenrt::sample {

// What a request or flag asked for; unset fields take the mode's defaults.
struct SamplingRequest {
  std::optional<float> temperature;  // 0 = greedy
  std::optional<int> top_k;          // 0 = off
  std::optional<float> top_p;        // 1 = off
  std::optional<float> min_p;        // 0 = off
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  std::optional<float> repetition_penalty;  // 1 = off
  std::unordered_map<int32_t, float> logit_bias;
  std::optional<uint64_t> seed;
};

// Fully resolved settings.
struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::unordered_map<int32_t, float> logit_bias;
  uint64_t seed = 0;
};

// Card defaults for the checkpoint and mode (thinking: temp 1.0, top_p 0.95, top_k 20;
// non-thinking: 0.7, 0.80, 20), overridden by whatever the request sets. An unset seed becomes a
// random one.
SamplingParams resolve(const SamplingRequest& request, model::Checkpoint checkpoint, bool thinking);

class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  // Picks the next token from logits [n_vocab]; `history` holds the tokens the penalties count
  // (the generated ones). Throws Error if every token ends up excluded.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  // The probabilities sample() draws from (after bias, penalties, temperature and the filters);
  // for tests and for logprobs. Greedy gives a one-hot vector.
  std::vector<float> distribution(std::span<const float> logits,
                                  std::span<const int32_t> history) const;

  // The row a backend samples with (ops::Ops::sample), drawing the next uniform number when the
  // settings are not greedy; sample() is exactly pick_token(sampling_distribution(next_row())).
  // The row refers to this sampler's bias list and to `history`: keep both alive until used.
  ops::SamplingRow next_row(std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }
  // The generator's position in its stream: a speculative check draws a number for each row it
  // samples, then puts the generator back to just after the rows it used, so drafting never
  // changes which number picks which token.
  uint64_t rng_state() const { return state_; }
  void set_rng_state(uint64_t state) { state_ = state; }

 private:
  ops::SamplingRow row(std::span<const int32_t> history, double u) const;
  double uniform();  // [0, 1) from the seeded generator, identical on every platform

  SamplingParams params_;
  std::vector<std::pair<int32_t, float>> bias_;
  uint64_t state_;
};

}  // namespace qwenrt::sample
