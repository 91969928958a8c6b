#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "ops/ref/sampling.h"

namespace qwenrt::sample {

SamplingParams resolve(const SamplingRequest& r, model::Checkpoint checkpoint, bool thinking) {
  // Every registered checkpoint's card gives the same numbers; other models get them too.
  (void)checkpoint;
  SamplingParams p;
  p.temperature = r.temperature.value_or(thinking ? 1.0f : 0.7f);
  p.top_p = r.top_p.value_or(thinking ? 0.95f : 0.80f);
  p.top_k = r.top_k.value_or(20);
  p.min_p = r.min_p.value_or(0.0f);
  p.presence_penalty = r.presence_penalty.value_or(0.0f);
  p.frequency_penalty = r.frequency_penalty.value_or(0.0f);
  p.repetition_penalty = r.repetition_penalty.value_or(1.0f);
  p.logit_bias = r.logit_bias;
  p.seed = r.seed ? *r.seed : std::random_device{}();
  return p;
}

Sampler::Sampler(SamplingParams params)
    : params_(std::move(params)),
      bias_(params_.logit_bias.begin(), params_.logit_bias.end()),
      state_(params_.seed) {
  // A fixed order for the bias list (the map's order is unspecified).
  std::sort(bias_.begin(), bias_.end());
  const auto& p = params_;
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    fail("temperature must be >= 0, got {}", p.temperature);
  if (p.top_k < 0) fail("top_k must be >= 0, got {}", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("min_p must be in [0, 1], got {}", p.min_p);
  if (!(p.repetition_penalty > 0))
    fail("repetition_penalty must be > 0, got {}", p.repetition_penalty);
}

double Sampler::uniform() {
  // splitmix64: tiny, fast and specified bit for bit (std distributions are not portable).
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

ops::SamplingRow Sampler::row(std::span<const int32_t> history, double u) const {
  const auto& p = params_;
  return {.temperature = p.temperature,
          .top_k = p.top_k,
          .top_p = p.top_p,
          .min_p = p.min_p,
          .presence_penalty = p.presence_penalty,
          .frequency_penalty = p.frequency_penalty,
          .repetition_penalty = p.repetition_penalty,
          .logit_bias = bias_,
          .history = history,
          .u = u};
}

ops::SamplingRow Sampler::next_row(std::span<const int32_t> history) {
  // Greedy rows draw nothing, so a greedy stretch leaves the generator where it was.
  return row(history, params_.temperature == 0 ? 0.0 : uniform());
}

std::vector<float> Sampler::distribution(std::span<const float> logits,
                                         std::span<const int32_t> history) const {
  return ops::ref::sampling_distribution(logits, row(history, 0.0));
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const ops::SamplingRow r = next_row(history);
  return ops::ref::pick_token(ops::ref::sampling_distribution(logits, r), r);
}

}  // namespace qwenrt::sample
