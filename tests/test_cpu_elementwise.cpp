// The CPU backend's elementwise/norm kernels against ops::ref on fresh random inputs, odd sizes
// (tails shorter than a vector), sizes large enough to split over the pool, at every SIMD level
// this machine runs. Outputs start as NaN so an unwritten element fails.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ops/cpu/common.h"
#include "ops/cpu/elementwise.h"
#include "ops/ref/kernels.h"
#include "support/model_files.h"
#include "support/op_data.h"

namespace qwenrt::ops::cpu {
namespace {

std::string sci(double x) {
  return fmt::format("{:.2e}", x);
}

using testing_support::rel_l2;

using testing_support::randn;

// Two threads, so the split paths run; built once and never destroyed (tests only need it alive).
ThreadPool& shared_pool() {
  static ThreadPool* pool = new ThreadPool(2);
  return *pool;
}

// One elementwise case: which op, its shape, and the SIMD level to force.
struct EwCase {
  std::string op;  // rmsnorm | add_rmsnorm | l2norm | rope | silu_mul | sigmoid_mul | add
  int64_t rows, dim;
  int extra;  // l2norm: extra stride; rope: n_rot; sigmoid_mul: extra gate stride
};

class CpuElementwise : public ::testing::TestWithParam<std::tuple<EwCase, SimdLevel>> {
 protected:
  void SetUp() override { force_simd_level(std::get<1>(GetParam())); }
  void TearDown() override { force_simd_level(best_simd_level()); }
  ThreadPool& pool = shared_pool();
};

TEST_P(CpuElementwise, MatchesReference) {
  const EwCase c = std::get<0>(GetParam());
  std::mt19937_64 rng(c.rows * 131 + c.dim * 7 + c.extra);
  const int64_t n = c.rows * c.dim;
  const float eps = 1e-6f;
  std::vector<float> got, want;
  double tol = 1e-6;
  if (c.op == "rmsnorm") {
    auto x = randn(n, rng, 3.0f), w = randn(c.dim, rng);
    got.assign(n, NAN);
    want.assign(n, NAN);
    rmsnorm(x.data(), w.data(), got.data(), c.rows, c.dim, eps, pool);
    ref::rmsnorm(x.data(), w.data(), want.data(), c.rows, c.dim, eps);
  } else if (c.op == "add_rmsnorm") {
    auto x = randn(n, rng), mixed = randn(n, rng), w = randn(c.dim, rng);
    std::vector<float> x_ref = x, h(n, NAN);
    want.assign(n, NAN);
    add_rmsnorm(x.data(), mixed.data(), w.data(), h.data(), c.rows, c.dim, eps, pool);
    for (int64_t i = 0; i < n; ++i) x_ref[i] += mixed[i];
    ref::rmsnorm(x_ref.data(), w.data(), want.data(), c.rows, c.dim, eps);
    EXPECT_EQ(x, x_ref);  // the residual sum is exact: one float add per element either way
    got = h;
  } else if (c.op == "l2norm") {
    const int64_t stride = c.dim + c.extra;
    auto x = randn(c.rows * stride, rng);
    x[0] = 1e-9f;  // a near-zero first element: the rest of row 0 sets its norm
    if (c.rows > 1) std::fill(x.begin() + stride, x.begin() + stride + c.dim, 1e-9f);  // eps floor
    want = got = x;
    l2norm(got.data(), c.rows, c.dim, stride, eps, pool);
    ref::l2norm(want.data(), c.rows, c.dim, stride, eps);
    EXPECT_EQ(std::vector<float>(got.begin() + c.dim, got.begin() + stride),
              std::vector<float>(x.begin() + c.dim, x.begin() + stride));  // gap untouched
  } else if (c.op == "rope") {
    const int n_heads = 3, n_rot = c.extra, head_dim = static_cast<int>(c.dim);
    const int64_t token_stride = int64_t{n_heads} * head_dim + 5;
    auto x = randn(c.rows * token_stride, rng);
    std::vector<int32_t> pos(c.rows);
    std::uniform_int_distribution<int32_t> p(0, 300000);
    for (auto& v : pos) v = p(rng);
    want = got = x;
    rope_neox(got.data(), pos.data(), c.rows, n_heads, head_dim, token_stride, n_rot, 1e7f, pool);
    ref::rope_neox(want.data(), pos.data(), c.rows, n_heads, head_dim, token_stride, n_rot, 1e7f);
    // Float cos/sin tables from double angles, float products: about 1 ulp per element.
    tol = 2e-7;
    for (int64_t t = 0; t < c.rows; ++t) {  // the dims past n_rot pass through bit-identical
      for (int h = 0; h < n_heads; ++h) {
        for (int d = n_rot; d < head_dim; ++d) {
          const int64_t i = t * token_stride + int64_t{h} * head_dim + d;
          ASSERT_EQ(got[i], x[i]);
        }
      }
    }
  } else if (c.op == "silu_mul") {
    auto g = randn(n, rng, 4.0f), u = randn(n, rng);
    got.assign(n, NAN);
    want.assign(n, NAN);
    silu_mul(g.data(), u.data(), got.data(), n, pool);
    ref::silu_mul(g.data(), u.data(), want.data(), n);
  } else if (c.op == "sigmoid_mul") {
    const int64_t gs = c.dim + c.extra;
    auto x = randn(n, rng), g = randn(c.rows * gs, rng, 4.0f);
    got.assign(n, NAN);
    want.assign(n, NAN);
    sigmoid_mul(x.data(), g.data(), gs, got.data(), c.rows, c.dim, pool);
    ref::sigmoid_mul(x.data(), g.data(), gs, want.data(), c.rows, c.dim);
  } else if (c.op == "add") {
    auto a = randn(n, rng), b = randn(n, rng);
    got.assign(n, NAN);
    add(a.data(), b.data(), got.data(), n, pool);
    want.resize(n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    tol = 0;
  } else {
    FAIL() << "unknown op " << c.op;
  }
  const double err = rel_l2(got, want);
  EXPECT_LE(err, tol) << c.op << " rows " << c.rows << " dim " << c.dim;
  RecordProperty("rel_l2", sci(err));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuElementwise,
    ::testing::Combine(
        ::testing::Values(EwCase{"rmsnorm", 1, 1, 0}, EwCase{"rmsnorm", 3, 17, 0},
                          EwCase{"rmsnorm", 5, 256, 0}, EwCase{"rmsnorm", 40, 2048, 0},
                          EwCase{"add_rmsnorm", 3, 33, 0}, EwCase{"add_rmsnorm", 20, 4096, 0},
                          EwCase{"l2norm", 7, 128, 3}, EwCase{"l2norm", 5, 19, 1},
                          EwCase{"l2norm", 300, 128, 0}, EwCase{"rope", 9, 256, 64},
                          EwCase{"rope", 4, 20, 20}, EwCase{"rope", 200, 128, 128},
                          EwCase{"rope", 3, 64, 38}, EwCase{"silu_mul", 1, 77, 0},
                          EwCase{"silu_mul", 50, 1999, 0}, EwCase{"sigmoid_mul", 3, 21, 21},
                          EwCase{"sigmoid_mul", 33, 4096, 4096}, EwCase{"add", 1, 5, 0},
                          EwCase{"add", 70, 1025, 0}),
        ::testing::ValuesIn(supported_simd_levels())));

}  // namespace
}  // namespace qwenrt::ops::cpu
