// The CUDA backend's sampling (ops/cuda/sampling.cu) against the reference backend on the same
// logits and rows: every setting family (greedy; temperature with top_k 1 / 20 / 2000 / off, top_p
// 0.95 / 0.8 / 1, min_p 0 / 0.05; presence, frequency and repetition penalties over a history
// with repeats and out-of-vocabulary tokens; logit bias with -inf exclusions), n_top 0 / 5 / 20,
// many rows of different settings in one call, the real vocabulary and small odd ones, logits
// with exact ties, and many uniform draws per setting.
//
// Tolerances: ids and top ids exactly; log-probabilities within 1e-5 absolute (the device sums
// exp in another order). The device's sums are trees where ref runs left to right, so a draw
// within ~1e-12 of a probability boundary (or a top-p cut within ~1e-14) could differ; random
// draws land there with negligible probability.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "support/scoped_env.h"

namespace qwenrt::ops {
namespace {

// Samples rows [n_rows] over logits [n_rows, n_vocab] (host) on `ops`, as the engine's last step.
std::vector<SampledToken> sample_on(Ops& ops, const std::vector<float>& logits, int64_t n_vocab,
                                    const std::vector<SamplingRow>& rows, int n_top) {
  const auto n_rows = static_cast<int64_t>(rows.size());
  std::vector<int32_t> tokens(n_rows, 0), positions(n_rows), output_rows(n_rows);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(output_rows.begin(), output_rows.end(), 0);
  const Span span{.slot = 0, .begin = 0, .count = static_cast<int32_t>(n_rows), .n_past = 0};
  const StepLayout layout{.tokens = tokens.data(),
                          .positions = positions.data(),
                          .n = n_rows,
                          .spans = &span,
                          .n_spans = 1,
                          .output_rows = output_rows.data(),
                          .n_output_rows = n_rows};
  ops.reset_workspace();
  ops.begin_step(layout);
  float* dev = ops.alloc(n_rows * n_vocab);
  ops.upload(logits.data(), dev, n_rows * n_vocab);
  std::vector<SampledToken> out(n_rows);
  for (auto& t : out) t.id = -7, t.logprob = NAN, t.n_top = -1;  // poisoned: unwritten fails
  ops.sample(dev, n_vocab, rows.data(), n_top, out.data());
  return out;
}

void expect_same(const SampledToken& got, const SampledToken& want, const std::string& what) {
  EXPECT_EQ(got.id, want.id) << what;
  EXPECT_NEAR(got.logprob, want.logprob, 1e-5) << what;
  ASSERT_EQ(got.n_top, want.n_top) << what;
  for (int i = 0; i < want.n_top; ++i) {
    EXPECT_EQ(got.top_ids[i], want.top_ids[i]) << what << " top " << i;
    EXPECT_NEAR(got.top_logprobs[i], want.top_logprobs[i], 1e-5) << what << " top " << i;
  }
}

enum class LogitKind { kRandom, kTies, kFlat };

// Logits [n_vocab]: kRandom a normal bulk with a few peaks; kTies values on a 0.5 grid (many
// exact ties, the top ones included); kFlat every value equal.
std::vector<float> make_logits(int64_t n_vocab, LogitKind kind, std::mt19937_64& rng) {
  std::normal_distribution<float> bulk(0.0f, 2.5f);
  std::uniform_int_distribution<int64_t> any(0, n_vocab - 1);
  std::vector<float> l(n_vocab);
  for (auto& x : l) x = bulk(rng);
  for (int i = 0; i < 8; ++i) l[any(rng)] += 8.0f + i;
  if (kind == LogitKind::kTies) {
    for (auto& x : l) x = std::round(x * 2.0f) / 2.0f;
  } else if (kind == LogitKind::kFlat) {
    for (auto& x : l) x = 1.25f;
  }
  return l;
}

// One setting family; bias and history are filled per case.
struct Setting {
  const char* name;
  float temperature;
  int top_k;
  float top_p, min_p;
  float presence, frequency, repetition;
  bool bias;
};

const Setting kSettings[] = {
    {"greedy", 0.0f, 0, 1.0f, 0.0f, 0, 0, 1, false},
    {"greedy_penalised_biased", 0.0f, 0, 1.0f, 0.0f, 1.5f, 0.5f, 1.3f, true},
    {"top_k1", 1.0f, 1, 1.0f, 0.0f, 0, 0, 1, false},
    {"k20_p095", 1.0f, 20, 0.95f, 0.0f, 0, 0, 1, false},
    {"t07_k20_p08", 0.7f, 20, 0.8f, 0.0f, 0, 0, 1, false},
    {"k20_minp", 1.0f, 20, 1.0f, 0.05f, 0, 0, 1, false},
    {"k2000_p095_minp", 1.2f, 2000, 0.95f, 0.05f, 0, 0, 1, false},
    {"kall_p095", 1.0f, 0, 0.95f, 0.0f, 0, 0, 1, false},
    {"kall_p1", 1.0f, 0, 1.0f, 0.0f, 0, 0, 1, false},
    {"t08_kall_minp", 0.8f, 0, 1.0f, 0.05f, 0, 0, 1, false},
    {"t15_kall_p08", 1.5f, 0, 0.8f, 0.0f, 0, 0, 1, false},
    {"k20_penalties", 1.0f, 20, 0.95f, 0.0f, 1.5f, 0.5f, 1.3f, false},
    {"kall_penalties_p09", 0.9f, 0, 0.9f, 0.0f, 0.7f, 0.3f, 1.1f, false},
    {"k20_bias", 1.0f, 20, 0.95f, 0.0f, 0, 0, 1, true},
    {"kall_bias_penalties_p095", 1.0f, 0, 0.95f, 0.02f, 1.0f, 0.2f, 1.2f, true},
};

// Biases for the logits: -inf on the top three tokens (excluded), +4 and -3 on two others.
std::vector<std::pair<int32_t, float>> make_bias(const std::vector<float>& l) {
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t top = std::min<size_t>(3, l.size() > 1 ? l.size() - 1 : 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<int64_t>(top), order.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  std::vector<std::pair<int32_t, float>> bias;
  for (size_t i = 0; i < top; ++i) bias.emplace_back(order[i], -INFINITY);
  if (l.size() > top + 1) bias.emplace_back(order[top + 1], -3.0f);
  if (l.size() > 5) bias.emplace_back(static_cast<int32_t>(l.size() / 2 + 1), 4.0f);
  return bias;
}

// A history with repeats, favouring high logits (so penalties move the top), plus tokens outside
// the vocabulary, which are ignored.
std::vector<int32_t> make_history(const std::vector<float>& l, std::mt19937_64& rng) {
  const auto n = static_cast<int32_t>(l.size());
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int32_t top = std::min<int32_t>(n, 40);
  std::partial_sort(order.begin(), order.begin() + top, order.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  std::uniform_int_distribution<int32_t> pick_top(0, top - 1), pick_any(0, n - 1);
  std::vector<int32_t> h;
  for (int i = 0; i < 60; ++i) h.push_back(order[pick_top(rng)]);
  for (int i = 0; i < 30; ++i) h.push_back(pick_any(rng));
  h.push_back(-1);
  h.push_back(n + 5);
  return h;
}

struct SamplingCase {
  int64_t n_vocab;
  LogitKind kind;
  int draws;  // uniform draws per setting
  int n_top;
};

std::string case_name(const ::testing::TestParamInfo<SamplingCase>& info) {
  const char* kinds[] = {"random", "ties", "flat"};
  return "v" + std::to_string(info.param.n_vocab) + "_" + kinds[int(info.param.kind)] + "_top" +
         std::to_string(info.param.n_top);
}

class CudaSampling : public ::testing::TestWithParam<SamplingCase> {};

TEST_P(CudaSampling, MatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const SamplingCase c = GetParam();
  std::mt19937_64 rng(1234 + c.n_vocab * 7 + int(c.kind));
  const std::vector<float> row_logits = make_logits(c.n_vocab, c.kind, rng);
  const auto bias = make_bias(row_logits);
  const auto history = make_history(row_logits, rng);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  // Rows interleave the settings, so neighbouring rows of one call differ.
  std::vector<SamplingRow> rows;
  std::vector<std::string> names;
  for (int d = 0; d < c.draws; ++d) {
    for (const Setting& s : kSettings) {
      SamplingRow r;
      r.temperature = s.temperature;
      r.top_k = s.top_k;
      r.top_p = s.top_p;
      r.min_p = s.min_p;
      r.presence_penalty = s.presence;
      r.frequency_penalty = s.frequency;
      r.repetition_penalty = s.repetition;
      if (s.bias) r.logit_bias = bias;
      r.history = history;
      r.u = d == 0 ? 0.0 : d == 1 ? 0.999999 : uniform(rng);
      rows.push_back(r);
      names.push_back(std::string(s.name) + " u=" + std::to_string(r.u));
    }
  }
  std::vector<float> logits;
  logits.reserve(rows.size() * row_logits.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
  }
  auto ref = make_ref_ops();
  auto cuda = make_cuda_ops();
  const auto want = sample_on(*ref, logits, c.n_vocab, rows, c.n_top);
  const auto got = sample_on(*cuda, logits, c.n_vocab, rows, c.n_top);
  int mismatches = 0;
  for (size_t i = 0; i < rows.size() && mismatches < 20; ++i) {
    expect_same(got[i], want[i], names[i]);
    mismatches += got[i].id != want[i].id;
  }
}

// Draws per setting: many on small vocabularies; fewer on the real one (ref sorts it per row).
INSTANTIATE_TEST_SUITE_P(Cases, CudaSampling,
                         ::testing::Values(SamplingCase{1, LogitKind::kRandom, 20, 5},
                                           SamplingCase{7, LogitKind::kRandom, 200, 5},
                                           SamplingCase{7, LogitKind::kTies, 200, 20},
                                           SamplingCase{3072, LogitKind::kRandom, 200, 20},
                                           SamplingCase{3072, LogitKind::kTies, 200, 0},
                                           SamplingCase{3072, LogitKind::kFlat, 50, 20},
                                           SamplingCase{248320, LogitKind::kRandom, 12, 20},
                                           SamplingCase{248320, LogitKind::kTies, 8, 5},
                                           SamplingCase{248320, LogitKind::kFlat, 4, 20}),
                         case_name);

// Rows that are all plain greedy (temperature 0, no bias, no penalties, n_top 0) take the split
// greedy kernels: two launches, or one with QWENRT_CUDA_GREEDY_ONE=1 (whose row's last block
// merges). Both against ref on vocabularies from 1 to past the one-launch path's 256 x 1024
// elements, rows of their own logits (ties, flat rows), twice in a row (the completion counters
// are reset by each launch).
TEST(CudaSamplingGreedy, PlainRowsMatchReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* one : {"0", "1"}) {
    const testing_support::ScopedEnv env("QWENRT_CUDA_GREEDY_ONE", one);
    auto cuda = make_cuda_ops();
    for (int64_t n_vocab : {1, 7, 1000, 3072, 248320, 300001}) {
      std::mt19937_64 rng(77 + n_vocab);
      std::vector<float> logits;
      const int n_rows = n_vocab > 100000 ? 3 : 5;
      for (int i = 0; i < n_rows; ++i) {
        const auto l = make_logits(n_vocab, LogitKind(i % 3), rng);
        logits.insert(logits.end(), l.begin(), l.end());
      }
      std::vector<SamplingRow> rows(n_rows);
      for (auto& r : rows) r.temperature = 0;
      const auto want = sample_on(*make_ref_ops(), logits, n_vocab, rows, 0);
      for (int rep = 0; rep < 3; ++rep) {
        // The third call asks for no log-probabilities: the same ids (a backend may leave the
        // log-probability 0 then).
        for (auto& r : rows) r.logprobs = rep < 2;
        const auto got = sample_on(*cuda, logits, n_vocab, rows, 0);
        for (int i = 0; i < n_rows; ++i) {
          const std::string what = std::string("one launch ") + one + ", vocab " +
                                   std::to_string(n_vocab) + ", row " + std::to_string(i) +
                                   ", call " + std::to_string(rep);
          if (rep < 2) {
            expect_same(got[i], want[i], what);
          } else {
            EXPECT_EQ(got[i].id, want[i].id) << what;
          }
        }
      }
    }
  }
}

// Rows of different logits in one call: each row's own logits are read.
TEST(CudaSamplingRows, EachRowItsOwnLogits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n_vocab = 3072;
  std::mt19937_64 rng(99);
  std::vector<float> logits;
  std::vector<SamplingRow> rows;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int i = 0; i < 24; ++i) {
    const auto l = make_logits(n_vocab, i % 3 == 0 ? LogitKind::kTies : LogitKind::kRandom, rng);
    logits.insert(logits.end(), l.begin(), l.end());
    SamplingRow r;
    r.temperature = i % 4 == 0 ? 0.0f : 0.6f + 0.1f * float(i % 5);
    r.top_k = i % 2 == 0 ? 20 : 0;
    r.top_p = i % 3 == 1 ? 0.9f : 1.0f;
    r.u = uniform(rng);
    rows.push_back(r);
  }
  const auto want = sample_on(*make_ref_ops(), logits, n_vocab, rows, 20);
  const auto got = sample_on(*make_cuda_ops(), logits, n_vocab, rows, 20);
  for (size_t i = 0; i < rows.size(); ++i) expect_same(got[i], want[i], "row " + std::to_string(i));
}

// A sampled row whose bias excludes every token is an error, as in ref (the other rows are fine).
TEST(CudaSamplingRows, EveryTokenExcludedIsAnError) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n_vocab = 7;
  std::mt19937_64 rng(5);
  const auto l = make_logits(n_vocab, LogitKind::kRandom, rng);
  std::vector<float> logits(l);
  logits.insert(logits.end(), l.begin(), l.end());
  std::vector<std::pair<int32_t, float>> exclude_all;
  for (int32_t i = 0; i < n_vocab; ++i) exclude_all.emplace_back(i, -INFINITY);
  std::vector<SamplingRow> rows(2);
  rows[0].top_k = 20;
  rows[0].u = 0.5;
  rows[1] = rows[0];
  rows[1].logit_bias = exclude_all;
  EXPECT_THROW(sample_on(*make_ref_ops(), logits, n_vocab, rows, 0), Error);
  EXPECT_THROW(sample_on(*make_cuda_ops(), logits, n_vocab, rows, 0), Error);
  // Without the excluding row the same call samples.
  rows.pop_back();
  logits.resize(n_vocab);
  const auto want = sample_on(*make_ref_ops(), logits, n_vocab, rows, 5);
  const auto got = sample_on(*make_cuda_ops(), logits, n_vocab, rows, 5);
  expect_same(got[0], want[0], "the remaining row");
}

}  // namespace
}  // namespace qwenrt::ops
