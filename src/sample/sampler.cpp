#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"

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

Sampler::Sampler(SamplingParams params) : params_(std::move(params)), state_(params_.seed) {
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

std::vector<float> Sampler::distribution(std::span<const float> logits,
                                         std::span<const int32_t> history) const {
  const auto& p = params_;
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<double> l(logits.begin(), logits.end());
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n) fail("logit_bias: token id {} is outside the vocabulary of {}", id, n);
    l[id] += bias;
  }
  if (p.presence_penalty != 0 || p.frequency_penalty != 0 || p.repetition_penalty != 1) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history) {
      if (t >= 0 && t < n) ++counts[t];
    }
    for (const auto& [t, c] : counts) {
      // Repetition penalty as in CTRL / llama.cpp: shrink positive logits, grow negative ones.
      l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
      l[t] -= p.presence_penalty + double(p.frequency_penalty) * c;
    }
  }
  std::vector<float> probs(n, 0.0f);
  if (p.temperature == 0) {
    probs[std::max_element(l.begin(), l.end()) - l.begin()] = 1.0f;
    return probs;
  }
  // Candidates sorted by logit (ties by lower id), then top-k, softmax, top-p, min-p.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  order.resize(k);
  if (!std::isfinite(l[order[0]])) fail("sampling: no token has a finite logit");
  std::vector<double> q(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i)
    sum += q[i] = std::exp((l[order[i]] - l[order[0]]) / p.temperature);
  for (auto& v : q) v /= sum;
  int64_t keep = k;
  if (p.top_p < 1) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += q[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0) {
    const double floor = p.min_p * q[0];
    int64_t i = 1;
    while (i < keep && q[i] >= floor) ++i;
    keep = i;
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += q[i];
  for (int64_t i = 0; i < keep; ++i) probs[order[i]] = static_cast<float>(q[i] / kept);
  return probs;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const std::vector<float> probs = distribution(logits, history);
  if (params_.temperature == 0)
    return static_cast<int32_t>(std::max_element(probs.begin(), probs.end()) - probs.begin());
  const double u = uniform();
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  if (last < 0) fail("sampling: every token was excluded");
  return last;  // rounding left u just above the total
}

}  // namespace qwenrt::sample
