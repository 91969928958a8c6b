// The CPU DeltaNet kernels against ops::ref on fresh random inputs: conv1d + SiLU over spans, the
// delta rule in both forms (each compared with BOTH ref forms, outputs and final states), and the
// whole core (deltanet_decode / deltanet_prefill) against the unfused ref sequence of
// arch/blocks.cpp deltanet_block. Shapes with Hk != Hv, spans of 1 / 63 / 64 / 65 / 200 tokens,
// mixes with slots out of order, at every SIMD level this machine runs. Outputs start NaN; slots
// not in the batch must keep their state bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ops/cpu/common.h"
#include "ops/cpu/deltanet.h"
#include "ops/ref/kernels.h"
#include "support/op_data.h"

namespace qwenrt::ops::cpu {
namespace {

std::string sci(double x) {
  return fmt::format("{:.2e}", x);
}

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));  // NaN anywhere fails EXPECT_LT
}
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return rel_l2(a.data(), b.data(), std::min(a.size(), b.size()));
}

using testing_support::randn;

ThreadPool& shared_pool() {
  static ThreadPool* pool = new ThreadPool(2);  // never destroyed: tests only need it alive
  return *pool;
}

// Spans of the given counts, rows in order, slots out of order among n_slots = counts + 2.
std::vector<Span> make_spans(const std::vector<int>& counts, int* n_rows, int* n_slots) {
  std::vector<Span> spans;
  *n_slots = static_cast<int>(counts.size()) + 2;
  int row = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    const int slot = static_cast<int>(counts.size() - s);  // reversed; slots 0, last unused
    spans.push_back({slot, row, counts[s], 7 * static_cast<int>(s)});
    row += counts[s];
  }
  *n_rows = row;
  return spans;
}

// Slots the batch does not touch must keep their state bit for bit.
void expect_other_slots_unchanged(const std::vector<Span>& spans, int n_slots, size_t per_slot,
                                  const std::vector<float>& before,
                                  const std::vector<float>& after) {
  for (int slot = 0; slot < n_slots; ++slot) {
    if (std::any_of(spans.begin(), spans.end(), [&](const Span& s) { return s.slot == slot; })) {
      continue;
    }
    EXPECT_TRUE(std::equal(before.begin() + slot * per_slot, before.begin() + (slot + 1) * per_slot,
                           after.begin() + slot * per_slot))
        << "slot " << slot;
  }
}

struct DeltaCase {
  std::string kernel;  // conv | recurrent | chunked | core
  int hk, hv, d;
  std::vector<int> counts;    // span lengths
  bool sigmoid_gate = false;  // qwen4exp's output gate
};

class CpuDeltaNet : public ::testing::TestWithParam<std::tuple<DeltaCase, SimdLevel>> {
 protected:
  void SetUp() override { force_simd_level(std::get<1>(GetParam())); }
  void TearDown() override { force_simd_level(best_simd_level()); }
};

constexpr int kConvK = 4;
constexpr float kEps = 1e-6f;

void run_conv(const DeltaCase& c, std::mt19937_64& rng) {
  int n, n_slots;
  const auto spans = make_spans(c.counts, &n, &n_slots);
  const int64_t C = 2 * c.hk * c.d + c.hv * c.d + 5;  // +5: a channel tail shorter than a vector
  const int64_t x_stride = C + 3;
  auto x = randn(n * x_stride, rng), kernel = randn(C * kConvK, rng, 0.5f);
  auto state = randn(n_slots * (kConvK - 1) * C, rng);
  std::vector<float> state_ref = state, out(n * C, NAN), want(n * C, NAN);
  conv1d_silu(spans.data(), static_cast<int>(spans.size()), x.data(), x_stride, kernel.data(),
              kConvK, state.data(), out.data(), C, shared_pool());
  for (const Span& s : spans) {
    ref::conv1d_silu(x.data() + s.begin * x_stride, x_stride,
                     state_ref.data() + s.slot * (kConvK - 1) * C, kernel.data(), kConvK,
                     want.data() + s.begin * C, s.count, C);
  }
  EXPECT_LT(rel_l2(out, want), 1e-6);
  EXPECT_LT(rel_l2(state, state_ref), 1e-7);  // the state is a copy of inputs: exact
  expect_other_slots_unchanged(spans, n_slots, (kConvK - 1) * C, state_ref, state);
}

void run_delta(const DeltaCase& c, std::mt19937_64& rng) {
  int n, n_slots;
  const auto spans = make_spans(c.counts, &n, &n_slots);
  const int D = c.d, hk = c.hk, hv = c.hv;
  const int64_t nk = int64_t{hk} * D, nv = int64_t{hv} * D;
  auto q = randn(n * nk, rng), k = randn(n * nk, rng), v = randn(n * nv, rng);
  ref::l2norm(q.data(), n * hk, D, D, kEps);
  ref::l2norm(k.data(), n * hk, D, D, kEps);
  std::vector<float> g(n * hv), beta(n * hv);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& x : g) x = -3.0f * u(rng);
  for (auto& x : beta) x = u(rng);
  const size_t per_slot = size_t(hv) * D * D;
  const auto state0 = randn(n_slots * per_slot, rng, 0.5f);
  std::vector<float> state = state0, out(n * nv, NAN);
  const GatedDeltaBatch b{.q = q.data(),
                          .k = k.data(),
                          .v = v.data(),
                          .q_stride = nk,
                          .k_stride = nk,
                          .v_stride = nv,
                          .g = g.data(),
                          .beta = beta.data(),
                          .delta_state = state.data(),
                          .out = out.data(),
                          .n_k_heads = hk,
                          .n_v_heads = hv,
                          .head_dim = D};
  const int n_spans = static_cast<int>(spans.size());
  if (c.kernel == "chunked") {
    gated_delta_chunked(b, spans.data(), n_spans, shared_pool());
  } else {
    gated_delta_recurrent(b, spans.data(), n_spans, shared_pool());
  }
  for (bool chunked_ref : {false, true}) {
    std::vector<float> s_ref = state0, o_ref(n * nv, NAN);
    for (const Span& s : spans) {
      const GatedDeltaArgs a{.q = q.data() + s.begin * nk,
                             .k = k.data() + s.begin * nk,
                             .v = v.data() + s.begin * nv,
                             .q_stride = nk,
                             .k_stride = nk,
                             .v_stride = nv,
                             .g = g.data() + s.begin * hv,
                             .beta = beta.data() + s.begin * hv,
                             .state = s_ref.data() + s.slot * per_slot,
                             .out = o_ref.data() + s.begin * nv,
                             .n = s.count,
                             .n_k_heads = hk,
                             .n_v_heads = hv,
                             .head_dim = D};
      chunked_ref ? ref::gated_delta_chunked(a) : ref::gated_delta_recurrent(a);
    }
    const double eo = rel_l2(out, o_ref), es = rel_l2(state, s_ref);
    EXPECT_LT(eo, 1e-5) << (chunked_ref ? "vs ref chunked" : "vs ref recurrent");
    EXPECT_LT(es, 1e-5) << (chunked_ref ? "vs ref chunked" : "vs ref recurrent");
    ::testing::Test::RecordProperty(chunked_ref ? "vs_ref_chunked" : "vs_ref_recurrent",
                                    sci(eo) + " / state " + sci(es));
  }
  EXPECT_GT(rel_l2(state, state0), 1e-2);  // the state moved
  expect_other_slots_unchanged(spans, n_slots, per_slot, state0, state);
}

void run_core(const DeltaCase& c, std::mt19937_64& rng) {
  int n, n_slots;
  const auto spans = make_spans(c.counts, &n, &n_slots);
  const int D = c.d, hk = c.hk, hv = c.hv;
  const int64_t nk = int64_t{hk} * D, nv = int64_t{hv} * D, C = 2 * nk + nv;
  auto qkv = randn(n * C, rng), z = randn(n * nv, rng), alpha = randn(n * hv, rng),
       beta = randn(n * hv, rng);
  auto kernel = randn(C * kConvK, rng, 0.5f), dt_bias = randn(hv, rng), norm = randn(D, rng);
  std::vector<float> a = randn(hv, rng, 0.5f);
  for (auto& x : a) x = -std::exp(x);
  const size_t conv_per_slot = (kConvK - 1) * C, delta_per_slot = size_t(hv) * D * D;
  const auto conv0 = randn(n_slots * conv_per_slot, rng),
             delta0 = randn(n_slots * delta_per_slot, rng, 0.5f);
  std::vector<float> conv = conv0, delta = delta0, out(n * nv, NAN);
  const DeltaNetLayerArgs layer{.conv_kernel = kernel.data(),
                                .conv_k = kConvK,
                                .dt_bias = dt_bias.data(),
                                .a = a.data(),
                                .norm = norm.data(),
                                .eps = kEps,
                                .n_k_heads = hk,
                                .n_v_heads = hv,
                                .head_dim = D,
                                .conv_state = conv.data(),
                                .delta_state = delta.data(),
                                .sigmoid_gate = c.sigmoid_gate};
  const int n_spans = static_cast<int>(spans.size());
  const bool all_decode =
      std::all_of(c.counts.begin(), c.counts.end(), [](int x) { return x == 1; });
  if (all_decode && c.kernel == "core") {
    deltanet_decode(layer, spans.data(), n_spans, qkv.data(), z.data(), alpha.data(), beta.data(),
                    out.data(), shared_pool());
  } else {
    std::vector<float> ws(deltanet_prefill_workspace_floats(layer, n), NAN);
    deltanet_prefill(layer, spans.data(), n_spans, qkv.data(), z.data(), alpha.data(), beta.data(),
                     out.data(), ws.data(), shared_pool());
  }
  // The unfused reference, span by span, as arch/blocks.cpp deltanet_block runs it.
  std::vector<float> conv_ref = conv0, delta_ref = delta0, want(n * nv, NAN);
  for (const Span& s : spans) {
    const int m = s.count;
    std::vector<float> mixed(m * C), q(m * nk), k(m * nk), g(m * hv), b(m * hv), o(m * nv);
    ref::conv1d_silu(qkv.data() + s.begin * C, C, conv_ref.data() + s.slot * conv_per_slot,
                     kernel.data(), kConvK, mixed.data(), m, C);
    for (int t = 0; t < m; ++t) {
      std::copy_n(mixed.begin() + t * C, nk, q.begin() + t * nk);
      std::copy_n(mixed.begin() + t * C + nk, nk, k.begin() + t * nk);
    }
    ref::l2norm(q.data(), m * hk, D, D, kEps);
    ref::l2norm(k.data(), m * hk, D, D, kEps);
    std::copy_n(alpha.begin() + s.begin * hv, m * hv, g.begin());
    std::copy_n(beta.begin() + s.begin * hv, m * hv, b.begin());
    ref::deltanet_gates(g.data(), b.data(), dt_bias.data(), a.data(), m, hv);
    ref::gated_delta_recurrent({.q = q.data(),
                                .k = k.data(),
                                .v = mixed.data() + 2 * nk,
                                .q_stride = nk,
                                .k_stride = nk,
                                .v_stride = C,
                                .g = g.data(),
                                .beta = b.data(),
                                .state = delta_ref.data() + s.slot * delta_per_slot,
                                .out = o.data(),
                                .n = m,
                                .n_k_heads = hk,
                                .n_v_heads = hv,
                                .head_dim = D});
    ref::rmsnorm(o.data(), norm.data(), o.data(), m * hv, D, kEps);
    if (c.sigmoid_gate) {
      ref::sigmoid_mul(o.data(), z.data() + s.begin * nv, nv, want.data() + s.begin * nv, m, nv);
    } else {
      ref::silu_mul(z.data() + s.begin * nv, o.data(), want.data() + s.begin * nv, m * nv);
    }
  }
  const double eo = rel_l2(out, want), ed = rel_l2(delta, delta_ref);
  EXPECT_LT(eo, 1e-5);
  EXPECT_LT(ed, 1e-5);
  EXPECT_LT(rel_l2(conv, conv_ref), 1e-7);
  ::testing::Test::RecordProperty("rel_l2", sci(eo) + " / state " + sci(ed));
  expect_other_slots_unchanged(spans, n_slots, conv_per_slot, conv0, conv);
  expect_other_slots_unchanged(spans, n_slots, delta_per_slot, delta0, delta);
}

TEST_P(CpuDeltaNet, MatchesReference) {
  const DeltaCase& c = std::get<0>(GetParam());
  std::mt19937_64 rng(c.hk * 100 + c.hv * 10 + c.d + c.counts.size() * 7 + c.counts[0]);
  if (c.kernel == "conv") {
    run_conv(c, rng);
  } else if (c.kernel == "recurrent" || c.kernel == "chunked") {
    run_delta(c, rng);
  } else {
    run_core(c, rng);  // "core": deltanet_decode when every span is one token; "prefill": always
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuDeltaNet,
    ::testing::Combine(
        ::testing::Values(
            DeltaCase{"conv", 2, 4, 16, {1}}, DeltaCase{"conv", 2, 6, 16, {1, 2, 1, 200}},
            DeltaCase{"conv", 16, 32, 128, {63, 1, 5}}, DeltaCase{"recurrent", 2, 4, 16, {1}},
            DeltaCase{"recurrent", 2, 6, 32, {1, 63, 1, 200}},
            DeltaCase{"recurrent", 16, 32, 128, {1, 1, 3}}, DeltaCase{"chunked", 2, 4, 16, {1}},
            DeltaCase{"chunked", 2, 4, 16, {63}}, DeltaCase{"chunked", 2, 6, 16, {64}},
            DeltaCase{"chunked", 2, 4, 32, {65}}, DeltaCase{"chunked", 1, 3, 32, {200}},
            DeltaCase{"chunked", 2, 6, 16, {1, 63, 1, 200}}, DeltaCase{"chunked", 4, 8, 128, {130}},
            DeltaCase{"core", 2, 4, 16, {1}}, DeltaCase{"core", 2, 6, 32, {1, 1, 1}},
            DeltaCase{"core", 16, 32, 128, {1, 1}}, DeltaCase{"prefill", 2, 4, 16, {65}},
            DeltaCase{"prefill", 2, 6, 32, {1, 63, 1, 200}}, DeltaCase{"prefill", 2, 4, 16, {1, 1}},
            DeltaCase{"prefill", 16, 32, 128, {70, 1}}, DeltaCase{"core", 2, 4, 32, {1, 1}, true},
            DeltaCase{"prefill", 2, 6, 32, {1, 63, 1, 200}, true}),
        ::testing::ValuesIn(supported_simd_levels())));

}  // namespace
}  // namespace qwenrt::ops::cpu
