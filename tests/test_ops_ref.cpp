// The reference backend against hand-worked math, and its two DeltaNet forms against each other on
// odd shapes (outputs and final states), fresh random inputs each case.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/ref/kernels.h"
#include "support/model_files.h"
#include "support/op_data.h"

namespace qwenrt::ops::ref {
namespace {

using testing_support::rel_l2;

using testing_support::randn;

TEST(RefOps, RmsnormMatchesHandMath) {
  std::vector<float> x = {3, 4}, w = {1, 2}, out(2, NAN);
  rmsnorm(x.data(), w.data(), out.data(), 1, 2, 0.0f);
  const float inv = 1.0f / std::sqrt(12.5f);  // mean(9, 16) = 12.5
  EXPECT_FLOAT_EQ(out[0], 3 * inv);
  EXPECT_FLOAT_EQ(out[1], 8 * inv);
}

TEST(RefOps, L2normUsesEpsFloor) {
  std::vector<float> x = {3, 4, 1e-9f, 0};
  l2norm(x.data(), 2, 2, 2, 1e-6f);
  EXPECT_FLOAT_EQ(x[0], 0.6f);
  EXPECT_FLOAT_EQ(x[1], 0.8f);
  EXPECT_NEAR(x[2], 1e-3f, 1e-9f);  // divided by eps, not by the tiny norm
}

TEST(RefOps, RopeRotatesOnlyLeadingDims) {
  // one head of 6 dims, n_rot 4: pairs (0,2) and (1,3) rotate, dims 4,5 pass through.
  std::vector<float> x = {1, 1, 0, 0, 7, 8};
  const int32_t pos = 3;
  rope_neox(x.data(), &pos, 1, 1, 6, 6, 4, 10000.0f);
  const double a0 = 3.0, a1 = 3.0 * std::pow(10000.0, -0.5);
  EXPECT_NEAR(x[0], std::cos(a0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(a0), 1e-6);
  EXPECT_NEAR(x[1], std::cos(a1), 1e-6);
  EXPECT_NEAR(x[3], std::sin(a1), 1e-6);
  EXPECT_EQ(x[4], 7);
  EXPECT_EQ(x[5], 8);
}

TEST(RefOps, AttentionIsCausalAndGrouped) {
  // 2 query heads share 1 kv head; head dim 1. Keys equal, so weights are uniform over the
  // visible prefix: query i averages v[0..i].
  std::vector<float> q = {1, 2, 1, 2, 1, 2}, k = {1, 1, 1}, v = {3, 6, 9}, out(6, NAN);
  attention(q.data(), 2, k.data(), v.data(), out.data(), 3, 3, 2, 1, 1, 1.0f);
  EXPECT_FLOAT_EQ(out[0], 3);
  EXPECT_FLOAT_EQ(out[1], 3);
  EXPECT_FLOAT_EQ(out[2], 4.5f);
  EXPECT_FLOAT_EQ(out[5], 6);
  // Two new queries after one cached key see 2 and 3 keys.
  std::vector<float> out2(4, NAN);
  attention(q.data(), 2, k.data(), v.data(), out2.data(), 2, 3, 2, 1, 1, 1.0f);
  EXPECT_FLOAT_EQ(out2[0], 4.5f);
  EXPECT_FLOAT_EQ(out2[2], 6);
}

TEST(RefOps, ConvKeepsTheLastInputsAsState) {
  // one channel, kernel [1, 2, 3] (oldest input first): y_t = x_{t-2} + 2 x_{t-1} + 3 x_t
  std::vector<float> kernel = {1, 2, 3}, state = {0, 0}, x = {1, 2, 3}, out(3, NAN);
  conv1d_silu(x.data(), 1, state.data(), kernel.data(), 3, out.data(), 3, 1);
  auto silu = [](float v) { return v / (1 + std::exp(-v)); };
  EXPECT_FLOAT_EQ(out[0], silu(3));
  EXPECT_FLOAT_EQ(out[1], silu(2 + 6));
  EXPECT_FLOAT_EQ(out[2], silu(1 + 4 + 9));
  EXPECT_EQ(state, (std::vector<float>{2, 3}));
}

TEST(RefOps, MoeRouteRenormalisesTopK) {
  std::vector<float> logits = {0, std::log(3.0f), std::log(2.0f), -50};
  int32_t ids[2];
  float w[2];
  moe_route(logits.data(), 1, 4, 2, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], 0.6f, 1e-6);
  EXPECT_NEAR(w[1], 0.4f, 1e-6);
}

TEST(RefOps, DeltanetGates) {
  std::vector<float> alpha = {0.5f}, beta = {0.0f}, bias = {0.25f}, a = {-2.0f};
  deltanet_gates(alpha.data(), beta.data(), bias.data(), a.data(), 1, 1);
  EXPECT_NEAR(alpha[0], -2.0 * std::log1p(std::exp(0.75)), 1e-6);
  EXPECT_FLOAT_EQ(beta[0], 0.5f);
}

// One recurrent step by hand: S = e^g S0 + k (beta (v - e^g S0^T k))^T; o = S^T q / sqrt(D).
TEST(RefOps, GatedDeltaOneStepByHand) {
  const int D = 2;
  std::vector<float> q = {1, 0}, k = {0.6f, 0.8f}, v = {1, 2}, g = {std::log(0.5f)}, beta = {0.5f};
  std::vector<float> S = {1, 2, 3, 4}, out(2, NAN);  // S[key][value]
  gated_delta_recurrent({.q = q.data(),
                         .k = k.data(),
                         .v = v.data(),
                         .q_stride = D,
                         .k_stride = D,
                         .v_stride = D,
                         .g = g.data(),
                         .beta = beta.data(),
                         .state = S.data(),
                         .out = out.data(),
                         .n = 1,
                         .n_k_heads = 1,
                         .n_v_heads = 1,
                         .head_dim = D});
  // decayed S0 = [[0.5, 1], [1.5, 2]]; S0^T k = [0.5*0.6 + 1.5*0.8, 1*0.6 + 2*0.8] = [1.5, 2.2]
  // d = 0.5 * ([1, 2] - [1.5, 2.2]) = [-0.25, -0.1]; S = S0 + k d^T
  const float S00 = 0.5f - 0.6f * 0.25f, S01 = 1 - 0.6f * 0.1f;
  EXPECT_NEAR(S[0], S00, 1e-6);
  EXPECT_NEAR(S[1], S01, 1e-6);
  EXPECT_NEAR(S[2], 1.5f - 0.8f * 0.25f, 1e-6);
  EXPECT_NEAR(S[3], 2 - 0.8f * 0.1f, 1e-6);
  EXPECT_NEAR(out[0], S00 / std::sqrt(2.0f), 1e-6);  // q = e_0 reads row 0
  EXPECT_NEAR(out[1], S01 / std::sqrt(2.0f), 1e-6);
}

struct DeltaCase {
  int n, hk, hv, d;
};

class GatedDeltaForms : public ::testing::TestWithParam<DeltaCase> {};

TEST_P(GatedDeltaForms, ChunkedEqualsRecurrent) {
  const DeltaCase c = GetParam();
  const int n = c.n, hk = c.hk, hv = c.hv, D = c.d;  // plain ints: lambdas below capture them
  std::mt19937_64 rng(1000 + n * 7 + hv);
  auto q = randn(size_t(n) * hk * D, rng), k = randn(size_t(n) * hk * D, rng),
       v = randn(size_t(n) * hv * D, rng);
  l2norm(q.data(), n * hk, D, D, 1e-6f);
  l2norm(k.data(), n * hk, D, D, 1e-6f);
  std::vector<float> g(size_t(n) * hv), beta(size_t(n) * hv);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& x : g) x = -3.0f * u(rng);
  for (auto& x : beta) x = u(rng);
  const auto state0 = randn(size_t(hv) * D * D, rng, 0.5f);
  std::vector<float> s_rec = state0, s_chk = state0;
  std::vector<float> o_rec(size_t(n) * hv * D, NAN), o_chk(size_t(n) * hv * D, NAN);
  auto args = [&](std::vector<float>& s, std::vector<float>& o) {
    return GatedDeltaArgs{.q = q.data(),
                          .k = k.data(),
                          .v = v.data(),
                          .q_stride = hk * D,
                          .k_stride = hk * D,
                          .v_stride = hv * D,
                          .g = g.data(),
                          .beta = beta.data(),
                          .state = s.data(),
                          .out = o.data(),
                          .n = n,
                          .n_k_heads = hk,
                          .n_v_heads = hv,
                          .head_dim = D};
  };
  gated_delta_recurrent(args(s_rec, o_rec));
  gated_delta_chunked(args(s_chk, o_chk));
  EXPECT_LT(rel_l2(o_chk, o_rec), 1e-6);
  EXPECT_LT(rel_l2(s_chk, s_rec), 1e-6);
  // The state moved: the comparison above is not between two untouched copies.
  EXPECT_GT(rel_l2(s_rec, state0), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(OddShapes, GatedDeltaForms,
                         ::testing::Values(DeltaCase{1, 1, 1, 8}, DeltaCase{63, 2, 6, 16},
                                           DeltaCase{64, 2, 4, 16}, DeltaCase{75, 1, 3, 32},
                                           DeltaCase{130, 2, 2, 8}));

}  // namespace
}  // namespace qwenrt::ops::ref
