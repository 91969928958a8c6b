#include "ops/ref/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "core/error.h"

namespace qwenrt::ops::ref {

std::vector<float> sampling_distribution(std::span<const float> logits, const SamplingRow& p) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<double> l(logits.begin(), logits.end());
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n) fail("logit_bias: token id {} is outside the vocabulary of {}", id, n);
    l[id] += bias;
  }
  if (p.presence_penalty != 0 || p.frequency_penalty != 0 || p.repetition_penalty != 1) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : p.history) {
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

int32_t pick_token(std::span<const float> probs, const SamplingRow& row) {
  if (row.temperature == 0)
    return static_cast<int32_t>(std::max_element(probs.begin(), probs.end()) - probs.begin());
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (row.u < cum) return last;
  }
  if (last < 0) fail("sampling: every token was excluded");
  return last;  // rounding left u just above the total
}

void fill_logprobs(std::span<const float> logits, int n_top, SampledToken& out) {
  const int64_t n = static_cast<int64_t>(logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const double log_z = mx + std::log(sum);
  if (out.id >= 0 && out.id < n) out.logprob = static_cast<float>(logits[out.id] - log_z);
  out.n_top = static_cast<int>(std::min<int64_t>({n_top, kMaxTopLogprobs, n}));
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + out.n_top, order.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  for (int i = 0; i < out.n_top; ++i) {
    out.top_ids[i] = order[i];
    out.top_logprobs[i] = static_cast<float>(logits[order[i]] - log_z);
  }
}

}  // namespace qwenrt::ops::ref
