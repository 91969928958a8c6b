// Sampler: the filters' exact distributions on fixed logits, empirical frequencies of seeded
// draws against them, reproducibility, penalties, defaults and explicit overrides.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "sample/sampler.h"

namespace qwenrt::sample {
namespace {

// logits = log(p) for p = [0.4, 0.3, 0.15, 0.1, 0.05]
std::vector<float> fixed_logits() {
  return {std::log(0.4f), std::log(0.3f), std::log(0.15f), std::log(0.1f), std::log(0.05f)};
}

SamplingParams plain(uint64_t seed = 7) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

// Draws n samples and checks every token's frequency against `want` within 5 standard errors.
void expect_frequencies(Sampler& s, const std::vector<float>& logits,
                        const std::vector<double>& want, int n = 40000) {
  std::vector<int> counts(logits.size());
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits, {})];
  for (size_t t = 0; t < want.size(); ++t) {
    const double f = double(counts[t]) / n;
    const double se = std::sqrt(std::max(want[t] * (1 - want[t]), 1e-12) / n);
    EXPECT_NEAR(f, want[t], 5 * se + 1e-12) << "token " << t;
  }
}

TEST(Sampler, TemperatureOneSamplesTheSoftmax) {
  Sampler s(plain());
  expect_frequencies(s, fixed_logits(), {0.4, 0.3, 0.15, 0.1, 0.05});
}

TEST(Sampler, TemperatureSharpens) {
  auto p = plain();
  p.temperature = 0.5f;  // p^2 renormalised
  Sampler s(p);
  const double z = 0.16 + 0.09 + 0.0225 + 0.01 + 0.0025;
  expect_frequencies(s, fixed_logits(), {0.16 / z, 0.09 / z, 0.0225 / z, 0.01 / z, 0.0025 / z});
}

TEST(Sampler, TopKKeepsTheBestK) {
  auto p = plain();
  p.top_k = 2;
  Sampler s(p);
  expect_frequencies(s, fixed_logits(), {0.4 / 0.7, 0.3 / 0.7, 0, 0, 0});
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  auto p = plain();
  p.top_p = 0.8f;  // 0.4 + 0.3 = 0.7 < 0.8, + 0.15 = 0.85 >= 0.8: three tokens
  Sampler s(p);
  const auto d = s.distribution(fixed_logits(), {});
  EXPECT_NEAR(d[0], 0.4 / 0.85, 1e-6);
  EXPECT_NEAR(d[2], 0.15 / 0.85, 1e-6);
  EXPECT_EQ(d[3], 0.0f);
  expect_frequencies(s, fixed_logits(), {0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0});
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  auto p = plain();
  p.min_p = 0.3f;  // floor 0.12: keeps 0.4, 0.3, 0.15
  Sampler s(p);
  const auto d = s.distribution(fixed_logits(), {});
  EXPECT_NEAR(d[1], 0.3 / 0.85, 1e-6);
  EXPECT_EQ(d[3], 0.0f);
  EXPECT_EQ(d[4], 0.0f);
}

TEST(Sampler, GreedyAndSeededReproducibility) {
  auto g = plain();
  g.temperature = 0;
  Sampler greedy(g);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(greedy.sample(fixed_logits(), {}), 0);
  Sampler a(plain(42)), b(plain(42)), c(plain(43));
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 200; ++i) {
    ra.push_back(a.sample(fixed_logits(), {}));
    rb.push_back(b.sample(fixed_logits(), {}));
    rc.push_back(c.sample(fixed_logits(), {}));
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
}

TEST(Sampler, PenaltiesAndBias) {
  auto p = plain();
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{4, 10.0f}};
  Sampler s(p);
  std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.0f, -20.0f};
  // token 0 seen twice: 2/2 - 0.5 - 0.5 = 0; token 2 seen once: -1*2 - 0.5 - 0.25 = -2.75;
  // token 4: -20 + 10 = -10. Best is token 1 (1.0).
  const std::vector<int32_t> history = {0, 0, 2};
  EXPECT_EQ(s.sample(logits, history), 1);
  auto q = p;
  q.temperature = 1;
  q.presence_penalty = q.frequency_penalty = 0;
  q.repetition_penalty = 1;
  q.logit_bias = {{4, 30.0f}};  // -20 + 30 = 10 dominates
  auto d = Sampler(q).distribution(logits, history);
  EXPECT_GT(d[4], 0.99f);
}

TEST(Sampler, DefaultsFollowTheModeAndExplicitValuesWin) {
  SamplingRequest r;
  auto t = resolve(r, model::Checkpoint::kQwen36_27B, true);
  EXPECT_FLOAT_EQ(t.temperature, 1.0f);
  EXPECT_FLOAT_EQ(t.top_p, 0.95f);
  EXPECT_EQ(t.top_k, 20);
  auto n = resolve(r, model::Checkpoint::kQwen38_27B, false);
  EXPECT_FLOAT_EQ(n.temperature, 0.7f);
  EXPECT_FLOAT_EQ(n.top_p, 0.80f);
  r.temperature = 0.0f;
  r.top_k = 5;
  r.seed = 9;
  auto e = resolve(r, model::Checkpoint::kQwen36_35B_A3B, true);
  EXPECT_FLOAT_EQ(e.temperature, 0.0f);
  EXPECT_EQ(e.top_k, 5);
  EXPECT_EQ(e.seed, 9u);
}

TEST(Sampler, BadSettingsAreErrors) {
  auto p = plain();
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = plain();
  p.temperature = -1;
  EXPECT_THROW(Sampler{p}, Error);
  p = plain();
  p.logit_bias = {{99, 1.0f}};
  EXPECT_THROW(Sampler(p).sample(fixed_logits(), {}), Error);
}

}  // namespace
}  // namespace qwenrt::sample
