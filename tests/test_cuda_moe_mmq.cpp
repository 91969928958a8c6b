// MoE prefill on int8 tensor cores (moe_mmq.cu): the routed experts of many rows, gate / up and
// down, against the reference per pair, in every tile size, weight type and routing shape (many
// pairs an expert, experts without pairs, tiles left partial). Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/ref/kernels.h"
#include "support/cuda_matmul.h"
#include "support/model_files.h"

namespace qwenrt::ops::cuda {
namespace {

using testing_support::rel_l2;

// Two int8 activation roundings (x, then the hidden rows), as the cpu and cuda MoE blocks have
// (tests/test_cuda_moe.cpp); a wrong pair, expert or row gives errors of order 1.
constexpr double kTol = 3e-2;

struct Case {
  DType gate_up, down;
  bool fused;
  int64_t dim, ff;
  int n_expert, k;
  int64_t n;
  bool skew;  // every row to the first k experts: full tiles of one expert
  int tile_rows;
};

void check(const Case& c, std::mt19937& rng) {
  const std::string what =
      std::string(dtype_name(c.gate_up)) + "/" + std::string(dtype_name(c.down)) +
      (c.fused ? " fused" : "") + (c.skew ? " skewed" : "") + " n=" + std::to_string(c.n) +
      " experts=" + std::to_string(c.n_expert) + " tiles of " + std::to_string(c.tile_rows);
  const int64_t n_pairs = c.n * c.k;
  const HostWeight hgu = make_weight(c.gate_up, c.dim, c.fused ? 2 * c.ff : c.ff, c.n_expert, rng);
  const HostWeight hu = make_weight(c.gate_up, c.dim, c.ff, c.n_expert, rng);
  const HostWeight hd = make_weight(c.down, c.ff, c.dim, c.n_expert, rng);
  const std::vector<float> x = random_floats(c.n * c.dim, rng);
  std::vector<int32_t> ids(n_pairs);
  for (int64_t t = 0; t < c.n; ++t) {
    std::vector<int32_t> order(c.n_expert);
    std::iota(order.begin(), order.end(), 0);
    if (!c.skew) std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < c.k; ++j) ids[t * c.k + j] = order[j];
  }
  // The reference per pair: down_e(silu(gate_e x) * up_e x).
  const Weight wgu{"gate", hgu.view}, wu{"up", hu.view}, wd{"down", hd.view};
  std::vector<float> want(n_pairs * c.dim), g(2 * c.ff), u(c.ff), h(c.ff);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int e = ids[p];
    ref::matmul(wgu.expert(e), x.data() + (p / c.k) * c.dim, g.data(), 1);
    if (c.fused)
      std::copy(g.begin() + c.ff, g.begin() + 2 * c.ff, u.begin());
    else
      ref::matmul(wu.expert(e), x.data() + (p / c.k) * c.dim, u.data(), 1);
    ref::silu_mul(g.data(), u.data(), h.data(), c.ff);
    ref::matmul(wd.expert(e), h.data(), want.data() + p * c.dim, 1);
  }

  const PlacedWeight pgu = place_weight(hgu, c.gate_up == DType::Q8_0),
                     pu = place_weight(hu, c.gate_up == DType::Q8_0),
                     pd = place_weight(hd, c.down == DType::Q8_0);
  Matrix gate = pgu.m, up = pu.m;
  if (c.fused) {
    gate.out = c.ff;
    up = gate;
    up.data = static_cast<const uint8_t*>(pgu.m.data) + c.ff * pgu.m.row_bytes;
  }
  ASSERT_TRUE(mmq_experts_fit(gate, up, pd.m)) << what;
  auto dx = to_device(x.data(), c.n * c.dim * 4);
  auto dids = to_device(ids.data(), n_pairs * 4);
  auto dy = poisoned(n_pairs * c.dim);
  DeviceBuffer order_ws(expert_order_workspace_bytes(n_pairs, c.n_expert));
  DeviceBuffer ws(mmq_experts_workspace_bytes(c.n, c.dim, n_pairs, c.ff));
  const ExpertOrder order = order_by_expert(static_cast<const int32_t*>(dids->ptr), n_pairs,
                                            c.n_expert, c.tile_rows, order_ws.ptr, nullptr);
  EXPECT_EQ(order.tile_rows, c.tile_rows);
  mmq_experts(gate, up, pd.m, order, c.k, dx->f(), c.n, dy->f(), ws.ptr, nullptr);
  const std::vector<float> got = to_host(*dy, n_pairs * c.dim);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << what;
  const double err = rel_l2(got, want);
  EXPECT_LT(err, kTol) << what;
  // Every pair's row, not only the whole: a pair left unwritten is NaN, a wrong one far off.
  double worst = 0;
  for (int64_t p = 0; p < n_pairs; ++p) {
    const std::vector<float> gp(got.begin() + p * c.dim, got.begin() + (p + 1) * c.dim);
    const std::vector<float> wp(want.begin() + p * c.dim, want.begin() + (p + 1) * c.dim);
    const double e = rel_l2(gp, wp);
    worst = std::isnan(e) ? 1e9 : std::max(worst, e);
  }
  EXPECT_LT(worst, 3 * kTol) << what;
  std::printf("  mmq experts %s: rel L2 %.2e, worst pair %.2e\n", what.c_str(), err, worst);
}

TEST(CudaMoeMmq, GroupedInt8ExpertsMatchTheReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  // The 35B-A3B's types (Q4_K gate / up, Q6_K down) in every tile size, random and skewed.
  for (int tile : {16, 32, 64}) {
    for (int64_t n : {1, 37, 150}) {
      check({DType::Q4_K, DType::Q6_K, false, 512, 256, 8, 3, n, false, tile}, rng);
      check({DType::Q4_K, DType::Q6_K, true, 512, 512, 8, 3, n, true, tile}, rng);
    }
  }
  // 64 experts top 4 over 257 rows: some experts get no pair, tiles end part full.
  check({DType::Q4_K, DType::Q4_K, true, 512, 256, 64, 4, 257, false, 16}, rng);
  check({DType::Q4_K, DType::Q4_K, true, 512, 256, 64, 4, 257, false, 64}, rng);
  check({DType::Q5_K, DType::Q5_K, false, 256, 256, 6, 2, 90, false, 32}, rng);
  check({DType::Q6_K, DType::Q4_K, false, 768, 256, 6, 2, 90, true, 64}, rng);
  check({DType::Q8_0, DType::Q8_0, false, 512, 256, 5, 4, 70, false, 32}, rng);
  check({DType::Q8_0, DType::Q6_K, true, 256, 512, 5, 4, 70, true, 64}, rng);
}

TEST(CudaMoeMmq, FitsOnlyTypesAndShapesItHasKernelsFor) {
  Matrix q4{.dtype = DType::Q4_K,
            .in = 512,
            .out = 256,
            .n_expert = 8,
            .row_bytes = 288,
            .expert_bytes = 288 * 256,
            .data = reinterpret_cast<const void*>(uintptr_t{4096})};
  Matrix down = q4;
  down.in = 256;
  down.out = 512;
  down.row_bytes = 144;
  down.expert_bytes = 144 * 512;
  EXPECT_TRUE(mmq_experts_fit(q4, q4, down));
  Matrix iq = q4;
  iq.dtype = DType::IQ4_XS;
  EXPECT_FALSE(mmq_experts_fit(iq, iq, down));
  Matrix q8 = q4;
  q8.dtype = DType::Q8_0;  // not repacked into superblocks
  EXPECT_FALSE(mmq_experts_fit(q8, q8, down));
  Matrix narrow = q4;
  narrow.out = 96;  // hidden columns not a multiple of 64
  Matrix narrow_down = down;
  narrow_down.in = 96;
  EXPECT_FALSE(mmq_experts_fit(narrow, narrow, narrow_down));
  EXPECT_EQ(mmq_tile_rows(4096 * 8, 256), 64);
  EXPECT_EQ(mmq_tile_rows(512 * 8, 256), 16);
  EXPECT_EQ(mmq_tile_rows(100 * 8, 32), 32);
}

}  // namespace
}  // namespace qwenrt::ops::cuda
