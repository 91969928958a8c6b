// cpu::attention over paged KV against ref::attention on the same keys gathered contiguous, for
// mixes of spans (decode rows and prefill blocks, different past lengths, slots out of order),
// page tables that scatter pages through the pool, at every SIMD level this machine runs.
// Unused pool rows hold NaN so a read past a span's causal window fails, and outputs start NaN so
// an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ops/cpu/attention.h"
#include "ops/cpu/common.h"
#include "ops/ref/kernels.h"
#include "support/model_files.h"

namespace qwenrt::ops::cpu {
namespace {

std::string sci(double x) {
  return fmt::format("{:.2e}", x);
}

using testing_support::rel_l2;

ThreadPool& shared_pool() {
  static ThreadPool* pool = new ThreadPool(2);  // never destroyed: tests only need it alive
  return *pool;
}

struct SpanShape {
  int count, n_past;
};
struct AttnCase {
  int n_head, n_head_kv, head_dim, page_size;
  std::vector<SpanShape> spans;
};

class CpuAttention : public ::testing::TestWithParam<std::tuple<AttnCase, SimdLevel>> {
 protected:
  void SetUp() override { force_simd_level(std::get<1>(GetParam())); }
  void TearDown() override { force_simd_level(best_simd_level()); }
};

TEST_P(CpuAttention, MatchesReferenceOnGatheredKeys) {
  const AttnCase c = std::get<0>(GetParam());
  const int hd = c.head_dim, ps = c.page_size;
  const int64_t kv_row = int64_t{c.n_head_kv} * hd;
  const int n_spans = static_cast<int>(c.spans.size());
  std::mt19937_64 rng(c.n_head * 1000 + hd + ps + n_spans);
  std::normal_distribution<float> nd(0.0f, 1.0f);

  // Slots out of order; each slot's pages drawn from a shuffled pool with spare pages between.
  const int n_slots = n_spans + 2;
  int max_pages = 0, total_pages = 0;
  for (const auto& s : c.spans) {
    const int pages = (s.n_past + s.count + ps - 1) / ps;
    max_pages = std::max(max_pages, pages);
    total_pages += pages;
  }
  const int pool_pages = total_pages * 2 + 3;
  std::vector<int32_t> order(pool_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> tables(size_t(n_slots) * max_pages, -1);
  std::vector<float> k_pages(size_t(pool_pages) * ps * kv_row, NAN),
      v_pages(size_t(pool_pages) * ps * kv_row, NAN);
  std::vector<Span> spans;
  int next_page = 0, row = 0;
  for (int s = 0; s < n_spans; ++s) {
    const int slot = n_spans - s;  // reversed; slots 0 and n_slots - 1 unused
    const int n_kv = c.spans[s].n_past + c.spans[s].count;
    for (int p = 0; p * ps < n_kv; ++p) tables[size_t(slot) * max_pages + p] = order[next_page++];
    // Only the slot's tokens get finite K/V; the rest of its last page stays NaN.
    for (int t = 0; t < n_kv; ++t) {
      const int64_t at =
          (int64_t{tables[size_t(slot) * max_pages + t / ps]} * ps + t % ps) * kv_row;
      for (int64_t e = 0; e < kv_row; ++e) {
        k_pages[at + e] = nd(rng);
        v_pages[at + e] = nd(rng);
      }
    }
    spans.push_back({slot, row, c.spans[s].count, c.spans[s].n_past});
    row += c.spans[s].count;
  }
  const int n = row;
  const int64_t q_stride = int64_t{c.n_head} * hd + 8;  // padded rows: stride is honoured
  std::vector<float> q(size_t(n) * q_stride);
  for (auto& x : q) x = nd(rng);
  const int64_t out_row = int64_t{c.n_head} * hd;
  std::vector<float> out(size_t(n) * out_row, NAN), want(size_t(n) * out_row, NAN);
  const float scale = 1.0f / std::sqrt(float(hd));

  attention(spans.data(), n_spans, q.data(), q_stride, k_pages.data(), v_pages.data(),
            tables.data(), max_pages, ps, out.data(), c.n_head, c.n_head_kv, hd, scale,
            shared_pool());

  for (const Span& s : spans) {
    const int n_kv = s.n_past + s.count;
    std::vector<float> k(size_t(n_kv) * kv_row), v(size_t(n_kv) * kv_row);
    for (int t = 0; t < n_kv; ++t) {
      const int64_t at =
          (int64_t{tables[size_t(s.slot) * max_pages + t / ps]} * ps + t % ps) * kv_row;
      std::copy_n(k_pages.begin() + at, kv_row, k.begin() + int64_t{t} * kv_row);
      std::copy_n(v_pages.begin() + at, kv_row, v.begin() + int64_t{t} * kv_row);
    }
    ref::attention(q.data() + int64_t{s.begin} * q_stride, q_stride, k.data(), v.data(),
                   want.data() + int64_t{s.begin} * out_row, s.count, n_kv, c.n_head, c.n_head_kv,
                   hd, scale);
  }
  const double err = rel_l2(out, want);
  EXPECT_LT(err, 1e-5);
  RecordProperty("rel_l2", sci(err));
}

INSTANTIATE_TEST_SUITE_P(
    Batches, CpuAttention,
    ::testing::Combine(
        ::testing::Values(AttnCase{4, 2, 64, 16, {{1, 0}}},              // first token
                          AttnCase{16, 2, 256, 64, {{1, 500}}},          // 35B decode
                          AttnCase{16, 2, 256, 64, {{63, 0}, {1, 70}}},  // 35B prefill
                          AttnCase{8, 2, 64, 16, {{1, 5}, {63, 0}, {1, 100}, {200, 17}}},
                          AttnCase{4, 4, 128, 16, {{65, 3}, {64, 64}}},  // no GQA
                          AttnCase{6, 2, 128, 64, {{130, 0}}},           // group 3
                          AttnCase{2, 1, 16, 16, {{33, 1}, {1, 0}}}),    // tiny head dim
        ::testing::ValuesIn(supported_simd_levels())));

}  // namespace
}  // namespace qwenrt::ops::cpu
