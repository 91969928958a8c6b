#include "ops/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace qwenrt::ops::cpu {

void Sampler::sample(const float* logits, int64_t n, const SamplingRow& p, int n_top,
                     SampledToken& out) {
  out = SampledToken{};
  const bool plain = p.logit_bias.empty() && p.presence_penalty == 0 && p.frequency_penalty == 0 &&
                     p.repetition_penalty == 1;
  if (p.temperature == 0 && plain) {
    // Greedy on the raw logits: the argmax of the floats is that of their doubles (the first of
    // equal ones either way), without a pass converting the vocabulary.
    out.id = static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
  } else {
    choose(logits, n, p, out);
  }
  if (!p.logprobs) return;  // nobody reads them: no pass over the vocabulary for the partition
  log_probabilities(logits, n, n_top, out);
}

void Sampler::choose(const float* logits, int64_t n, const SamplingRow& p, SampledToken& out) {
  adjusted_.resize(n);
  order_.resize(n);
  if (static_cast<int64_t>(counts_.size()) != n) counts_.assign(n, 0);
  std::vector<double>& l = adjusted_;
  for (int64_t i = 0; i < n; ++i) l[i] = logits[i];
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n) fail("logit_bias: token id {} is outside the vocabulary of {}", id, n);
    l[id] += bias;
  }
  if (p.presence_penalty != 0 || p.frequency_penalty != 0 || p.repetition_penalty != 1) {
    for (int32_t t : p.history) {
      if (t >= 0 && t < n) ++counts_[t];
    }
    // Each distinct token once (its count is cleared when applied), as ref's map does.
    for (int32_t t : p.history) {
      if (t < 0 || t >= n || counts_[t] == 0) continue;
      l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
      l[t] -= p.presence_penalty + double(p.frequency_penalty) * counts_[t];
      counts_[t] = 0;
    }
  }
  if (p.temperature == 0) {
    out.id = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  } else {
    std::iota(order_.begin(), order_.end(), 0);
    const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, n) : n;
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    if (!std::isfinite(l[order_[0]])) fail("sampling: no token has a finite logit");
    probs_.resize(k);
    double sum = 0;
    for (int64_t i = 0; i < k; ++i)
      sum += probs_[i] = std::exp((l[order_[i]] - l[order_[0]]) / p.temperature);
    for (int64_t i = 0; i < k; ++i) probs_[i] /= sum;
    int64_t keep = k;
    if (p.top_p < 1) {
      double cum = 0;
      for (int64_t i = 0; i < k; ++i) {
        cum += probs_[i];
        if (cum >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0) {
      const double floor = p.min_p * probs_[0];
      int64_t i = 1;
      while (i < keep && probs_[i] >= floor) ++i;
      keep = i;
    }
    double kept = 0;
    for (int64_t i = 0; i < keep; ++i) kept += probs_[i];
    // ref walks the float probabilities in id order: the same values, summed in the same order.
    kept_.clear();
    for (int64_t i = 0; i < keep; ++i)
      kept_.emplace_back(order_[i], static_cast<float>(probs_[i] / kept));
    std::sort(kept_.begin(), kept_.end());
    double cum = 0;
    out.id = -1;
    for (const auto& [id, prob] : kept_) {
      if (prob <= 0) continue;
      cum += prob;
      out.id = id;
      if (p.u < cum) break;
    }
    if (out.id < 0) fail("sampling: every token was excluded");
  }
}

void Sampler::log_probabilities(const float* logits, int64_t n, int n_top, SampledToken& out) {
  // Raw log-probabilities.
  const double mx = *std::max_element(logits, logits + n);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(double(logits[i]) - mx);
  const double log_z = mx + std::log(z);
  out.logprob = static_cast<float>(logits[out.id] - log_z);
  out.n_top = static_cast<int>(std::min<int64_t>({n_top, kMaxTopLogprobs, n}));
  if (out.n_top > 0) {
    order_.resize(n);  // (the greedy path does not size it)
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + out.n_top, order_.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (int i = 0; i < out.n_top; ++i) {
      out.top_ids[i] = order_[i];
      out.top_logprobs[i] = static_cast<float>(logits[order_[i]] - log_z);
    }
  }
}

}  // namespace qwenrt::ops::cpu
