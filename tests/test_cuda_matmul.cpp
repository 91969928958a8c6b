// The CUDA matmul kernels (ops/cuda/matmul.cu) against ops::ref: every type with a kernel, the
// GEMV (n <= 8), tensor-core GEMV (3..32), dense int8 GEMM (33..64) and chunked / GEMM (n > 8)
// paths, odd shapes, fresh random inputs, NaN-poisoned outputs. matmul and embed go through the
// public backend (make_cuda_ops); matmul_group, matmul_swiglu and the expert launchers are not
// reachable through Ops, so they are called directly on device buffers this file allocates.
//
// Tolerances (relative L2 error ||got - want|| / ||want||): int8-activation paths < 2.5e-2 per
// shape (1e-1 below 16 outputs) and < 1e-2 pooled over a type's shapes (activation rounding gives
// ~6e-3; a wrong decode gives ~1); fp32-activation paths (F32 / F16 / BF16 weights) < 1e-5.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"
#include "support/cuda_matmul.h"
#include "support/model_files.h"

namespace qwenrt::ops::cuda {
namespace {

struct OutN {
  int64_t out, n;
};
// Every n of the GEMV (1..8), tensor-core GEMV (3..32: one, two and four 8-row tiles, the last one
// partial), dense int8 GEMM (33, 40, 64 for Q4_K, Q5_K, Q6_K, Q8_0) and chunked (9) / cuBLAS GEMM
// (65, 200, and 33..64 for the other types) paths, odd outs.
const std::vector<OutN> kOutN = {{1, 1},    {7, 2},    {61, 3},   {300, 5},  {7, 8},
                                 {61, 9},   {300, 16}, {61, 17},  {300, 33}, {7, 40},
                                 {300, 64}, {61, 65},  {61, 200}, {1, 200}};

class CudaMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CudaMatmul, MatchesReferenceThroughOps) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const DType type = GetParam();
  auto ops = qwenrt::ops::make_cuda_ops();
  std::mt19937 rng(4321 + static_cast<int>(type));
  double num = 0, den = 0;
  for (int64_t in : ins_for(type)) {
    for (const OutN& s : kOutN) {
      const HostWeight hw = make_weight(type, in, s.out, 1, rng);
      const Weight host{"w", hw.view};
      const std::vector<float> x = random_floats(s.n * in, rng);
      std::vector<float> want(s.n * s.out);
      ref::matmul(host, x.data(), want.data(), s.n);

      const Weight placed = ops->place(host);
      float* dx = ops->alloc(s.n * in);
      float* dy = ops->alloc(s.n * s.out);
      const std::vector<float> nan(s.n * s.out, kNaN);
      ops->upload(x.data(), dx, s.n * in);
      ops->upload(nan.data(), dy, s.n * s.out);
      ops->matmul(placed, dx, dy, s.n);
      std::vector<float> got(s.n * s.out);
      ops->download(dy, got.data(), s.n * s.out);
      ops->reset_workspace();

      const double err = rel_l2(got, want);
      EXPECT_LT(scaled_max_err(got, want, x, hw, s.n, in, s.out), scaled_tol(type))
          << dtype_name(type) << " in=" << in << " out=" << s.out << " n=" << s.n;
      double ww = 0;
      for (float v : want) ww += double(v) * v;
      num += err * err * ww;
      den += ww;
    }
  }
  const double pooled = std::sqrt(num / den);
  EXPECT_LT(pooled, int8_path(type) ? 1e-2 : 1e-5) << dtype_name(type);
  std::printf("  %s pooled rel L2 %.2e\n", std::string(dtype_name(type)).c_str(), pooled);
}

// The launcher alone (no Ops): the same shapes, so a failure here is the kernel's, not the
// backend's placement or workspace.
TEST_P(CudaMatmul, LauncherMatchesReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const DType type = GetParam();
  std::mt19937 rng(8765 + static_cast<int>(type));
  for (int64_t in : ins_for(type)) {
    for (const OutN& s : kOutN) {
      const HostWeight hw = make_weight(type, in, s.out, 1, rng);
      const std::vector<float> x = random_floats(s.n * in, rng);
      std::vector<float> want(s.n * s.out);
      ref::matmul(Weight{"w", hw.view}, x.data(), want.data(), s.n);
      auto data = to_device(hw.bytes.data(), int64_t(hw.bytes.size()));
      auto dx = to_device(x.data(), s.n * in * 4);
      auto dy = poisoned(s.n * s.out);
      const Matrix w = device_matrix(hw, *data);
      DeviceBuffer ws(matmul_workspace_bytes(w, s.n));
      matmul(w, dx->f(), dy->f(), s.n, ws.ptr, nullptr);
      EXPECT_LT(scaled_max_err(to_host(*dy, s.n * s.out), want, x, hw, s.n, in, s.out),
                scaled_tol(type))
          << dtype_name(type) << " in=" << in << " out=" << s.out << " n=" << s.n;
    }
  }
}

TEST_P(CudaMatmul, EmbedMatchesReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const DType type = GetParam();
  std::mt19937 rng(99 + static_cast<int>(type));
  const int64_t dim = ins_for(type)[0], n_vocab = 61, n = 5;
  const HostWeight hw = make_weight(type, dim, n_vocab, 1, rng);
  const std::vector<int32_t> tokens = {60, 0, 17, 17, 42};
  std::vector<float> want(n * dim);
  ref::embed_rows(Weight{"table", hw.view}, tokens.data(), want.data(), n);

  // Directly through the launcher.
  {
    auto table = to_device(hw.bytes.data(), int64_t(hw.bytes.size()));
    auto ids = to_device(tokens.data(), n * 4);
    auto out = poisoned(n * dim);
    embed_rows(device_matrix(hw, *table), static_cast<const int32_t*>(ids->ptr), n, out->f(),
               nullptr);
    EXPECT_EQ(rel_l2(to_host(*out, n * dim), want), 0.0) << dtype_name(type) << " launcher";
  }
  // Through Ops (the step's tokens).
  auto ops = qwenrt::ops::make_cuda_ops();
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4};
  const Span span{.slot = 0, .begin = 0, .count = static_cast<int32_t>(n), .n_past = 0};
  const int32_t output_row = static_cast<int32_t>(n - 1);
  const StepLayout layout{.tokens = tokens.data(),
                          .positions = positions.data(),
                          .n = n,
                          .spans = &span,
                          .n_spans = 1,
                          .output_rows = &output_row,
                          .n_output_rows = 1};
  ops->begin_step(layout);
  const Weight placed = ops->place(Weight{"table", hw.view});
  float* out = ops->alloc(n * dim);
  const std::vector<float> nan(n * dim, kNaN);
  ops->upload(nan.data(), out, n * dim);
  ops->embed(placed, out);
  std::vector<float> got(n * dim);
  ops->download(out, got.data(), n * dim);
  // Dequantisation is exact arithmetic on the same values: equal up to fp32 rounding order.
  EXPECT_LT(rel_l2(got, want), 1e-6) << dtype_name(type) << " ops->embed";
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatmul,
                         ::testing::Values(DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS,
                                           DType::Q8_0, DType::Q4_0, DType::F32, DType::F16,
                                           DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaMatmulLaunchers, GroupOfMixedTypesInOneLaunch) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  const int64_t in = 256 * 3;
  // Q8_0 not in superblocks keeps the first set off the tensor-core GEMV; the others take it in
  // runs of one type (Q4_K q and k with a Q6_K v; three types).
  const DType sets[3][3] = {{DType::Q4_K, DType::Q6_K, DType::Q8_0},
                            {DType::Q4_K, DType::Q4_K, DType::Q6_K},
                            {DType::Q5_K, DType::Q6_K, DType::Q4_K}};
  const int64_t outs[3] = {61, 7, 300};
  for (const auto& types : sets) {
    for (int64_t n : {1, 5, 8, 9, 17, 33, 64}) {
      const std::vector<float> x = random_floats(n * in, rng);
      auto dx = to_device(x.data(), n * in * 4);
      std::vector<HostWeight> hw;
      std::vector<std::unique_ptr<DeviceBuffer>> data, ys;
      std::vector<Projection> p;
      for (int i = 0; i < 3; ++i) {
        hw.push_back(make_weight(types[i], in, outs[i], 1, rng));
        data.push_back(to_device(hw[i].bytes.data(), int64_t(hw[i].bytes.size())));
        ys.push_back(poisoned(n * outs[i]));
      }
      for (int i = 0; i < 3; ++i)
        p.push_back({.w = device_matrix(hw[i], *data[i]), .y = ys[i]->f()});
      DeviceBuffer ws(matmul_group_workspace_bytes(p.data(), 3, n));
      matmul_group(p.data(), 3, dx->f(), n, ws.ptr, nullptr);
      for (int i = 0; i < 3; ++i) {
        std::vector<float> want(n * outs[i]);
        ref::matmul(Weight{"w", hw[i].view}, x.data(), want.data(), n);
        EXPECT_LT(rel_l2(to_host(*ys[i], n * outs[i]), want), 2.5e-2)
            << "projection " << i << " (" << dtype_name(types[i]) << ") n=" << n;
      }
    }
  }
}

TEST(CudaMatmulLaunchers, SwiGluMatchesReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(12);
  const std::pair<DType, DType> pairs[] = {
      {DType::Q4_K, DType::Q4_K}, {DType::Q6_K, DType::Q5_K}, {DType::F16, DType::F16}};
  for (const auto& [tg, tu] : pairs) {
    for (int64_t n : {1, 3, 8, 17, 33, 64}) {
      const int64_t in = 256 * 3, ff = 61;
      const HostWeight hg = make_weight(tg, in, ff, 1, rng), hu = make_weight(tu, in, ff, 1, rng);
      const std::vector<float> x = random_floats(n * in, rng);
      std::vector<float> g(n * ff), u(n * ff);
      ref::matmul(Weight{"g", hg.view}, x.data(), g.data(), n);
      ref::matmul(Weight{"u", hu.view}, x.data(), u.data(), n);
      const std::vector<float> want = silu_mul_ref(g, u);

      auto dg = to_device(hg.bytes.data(), int64_t(hg.bytes.size()));
      auto du = to_device(hu.bytes.data(), int64_t(hu.bytes.size()));
      auto dx = to_device(x.data(), n * in * 4);
      auto dy = poisoned(n * ff);
      const Matrix mg = device_matrix(hg, *dg), mu = device_matrix(hu, *du);
      DeviceBuffer ws(matmul_swiglu_workspace_bytes(mg, n));
      matmul_swiglu(mg, mu, dx->f(), dy->f(), n, ws.ptr, nullptr);
      const double tol = int8_path(tg) ? 2.5e-2 : 1e-5;
      EXPECT_LT(rel_l2(to_host(*dy, n * ff), want), tol)
          << dtype_name(tg) << "/" << dtype_name(tu) << " n=" << n;
    }
  }
}

// Routed experts: gate/up separate or fused, then down with the weighted sum over k choices,
// against ref::matmul on Weight::expert views.
void check_experts(DType type, bool fused, int64_t dim, int64_t ff, int n_expert, int k, int64_t n,
                   std::mt19937& rng) {
  const HostWeight hgu = make_weight(type, dim, fused ? 2 * ff : ff, n_expert, rng);
  const HostWeight hu = make_weight(type, dim, ff, n_expert, rng);  // unused when fused
  const HostWeight hd = make_weight(type, ff, dim, n_expert, rng);
  const std::vector<float> x = random_floats(n * dim, rng);
  std::vector<int32_t> ids(n * k);
  std::vector<float> weights(n * k);
  std::uniform_real_distribution<float> uw(0.05f, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> order(n_expert);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = uw(rng);
    }
  }
  // Reference: act [n * k, ff] and y [n, dim].
  std::vector<float> act(n * k * ff), y(n * dim, 0.0f), g(2 * ff), u(ff), down(dim);
  const Weight wgu{"gate", hgu.view}, wu{"up", hu.view}, wd{"down", hd.view};
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int e = ids[t * k + j];
      ref::matmul(wgu.expert(e), x.data() + t * dim, g.data(), 1);
      if (fused)
        std::copy(g.begin() + ff, g.begin() + 2 * ff, u.begin());
      else
        ref::matmul(wu.expert(e), x.data() + t * dim, u.data(), 1);
      float* a = act.data() + (t * k + j) * ff;
      ref::silu_mul(g.data(), u.data(), a, ff);
    }
  }
  // The down reference reads the GPU's own act (below) so the two stages are checked apart.

  auto dgu = to_device(hgu.bytes.data(), int64_t(hgu.bytes.size()));
  auto du = to_device(hu.bytes.data(), int64_t(hu.bytes.size()));
  auto ddown = to_device(hd.bytes.data(), int64_t(hd.bytes.size()));
  auto dx = to_device(x.data(), n * dim * 4);
  auto dids = to_device(ids.data(), n * k * 4);
  auto dw = to_device(weights.data(), n * k * 4);
  auto dact = poisoned(n * k * ff);
  auto dy = poisoned(n * dim);
  Matrix gate = device_matrix(hgu, *dgu), up = device_matrix(hu, *du);
  if (fused) {
    gate.out = ff;  // two views into the fused tensor; expert_bytes stays the fused stride
    up = gate;
    up.data = static_cast<const uint8_t*>(dgu->ptr) + ff * hgu.row_bytes;
  }
  const Matrix dmat = device_matrix(hd, *ddown);
  DeviceBuffer ws(
      std::max(matmul_workspace_bytes(gate, n * k), matmul_workspace_bytes(dmat, n * k)));
  experts_swiglu(gate, up, static_cast<const int32_t*>(dids->ptr), k, dx->f(), dact->f(), n, ws.ptr,
                 nullptr);
  const std::vector<float> got_act = to_host(*dact, n * k * ff);
  EXPECT_LT(rel_l2(got_act, act), 2.5e-2)
      << "experts_swiglu " << dtype_name(type) << (fused ? " fused" : "") << " n=" << n;

  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      ref::matmul(wd.expert(ids[t * k + j]), got_act.data() + (t * k + j) * ff, down.data(), 1);
      for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += weights[t * k + j] * down[i];
    }
  }
  experts_down(dmat, static_cast<const int32_t*>(dids->ptr), dw->f(), k, dact->f(), dy->f(), n,
               ws.ptr, nullptr);
  EXPECT_LT(rel_l2(to_host(*dy, n * dim), y), 2.5e-2)
      << "experts_down " << dtype_name(type) << (fused ? " fused" : "") << " n=" << n;
}

TEST(CudaMatmulLaunchers, ExpertsMatchReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(13);
  for (int64_t n : {1, 3, 8, 17}) {
    check_experts(DType::Q4_K, false, 256 * 3, 256, 8, 3, n, rng);
    check_experts(DType::Q4_K, true, 256 * 3, 256, 8, 3, n, rng);
    check_experts(DType::Q6_K, false, 256, 256, 6, 2, n, rng);
    check_experts(DType::Q8_0, true, 32 * 5, 32 * 3, 5, 4, n, rng);
  }
}

// ---- MoE prefill: the grouped expert GEMMs -----------------------------------------------------
// The routed experts of many rows through order_by_expert + grouped_experts_swiglu / _down against
// the reference, per pair; `skew` sends every row to the first k experts (tiles of many pairs per
// expert), otherwise choices are random (some experts get no pair).
void check_grouped(DType type, bool q8s, bool fused, int64_t dim, int64_t ff, int n_expert, int k,
                   int64_t n, bool skew, std::mt19937& rng) {
  const std::string what = std::string(dtype_name(type)) + (q8s ? " superblocks" : "") +
                           (fused ? " fused" : "") + (skew ? " skewed" : "") +
                           " n=" + std::to_string(n) + " experts=" + std::to_string(n_expert);
  const HostWeight hgu = make_weight(type, dim, fused ? 2 * ff : ff, n_expert, rng);
  const HostWeight hu = make_weight(type, dim, ff, n_expert, rng);
  const HostWeight hd = make_weight(type, ff, dim, n_expert, rng);
  const std::vector<float> x = random_floats(n * dim, rng);
  std::vector<int32_t> ids(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> order(n_expert);
    std::iota(order.begin(), order.end(), 0);
    if (!skew) std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < k; ++j) ids[t * k + j] = order[j];
  }
  const Weight wgu{"gate", hgu.view}, wu{"up", hu.view}, wd{"down", hd.view};
  std::vector<float> act(n * k * ff), g(2 * ff), u(ff);
  for (int64_t p = 0; p < n * k; ++p) {
    const int e = ids[p];
    ref::matmul(wgu.expert(e), x.data() + (p / k) * dim, g.data(), 1);
    if (fused)
      std::copy(g.begin() + ff, g.begin() + 2 * ff, u.begin());
    else
      ref::matmul(wu.expert(e), x.data() + (p / k) * dim, u.data(), 1);
    ref::silu_mul(g.data(), u.data(), act.data() + p * ff, ff);
  }

  // Q8_0 is placed as superblocks only where rows are whole superblocks, as the backend does.
  const PlacedWeight pgu = place_weight(hgu, q8s && dim % 256 == 0),
                     pu = place_weight(hu, q8s && dim % 256 == 0),
                     pd = place_weight(hd, q8s && ff % 256 == 0);
  Matrix gate = pgu.m, up = pu.m;
  if (fused) {
    gate.out = ff;
    up = gate;
    up.data = static_cast<const uint8_t*>(pgu.m.data) + ff * pgu.m.row_bytes;
  }
  ASSERT_TRUE(grouped_experts_fit(gate) && grouped_experts_fit(pd.m)) << what;
  auto dx = to_device(x.data(), n * dim * 4);
  auto dids = to_device(ids.data(), n * k * 4);
  auto dact = poisoned(n * k * ff);
  auto dpairs = poisoned(n * k * dim);
  DeviceBuffer ws(expert_order_workspace_bytes(n * k, n_expert));
  const ExpertOrder order = order_by_expert(static_cast<const int32_t*>(dids->ptr), n * k, n_expert,
                                            grouped_tile_rows(), ws.ptr, nullptr);
  grouped_experts_swiglu(gate, up, order, k, dx->f(), dact->f(), nullptr);
  const std::vector<float> got_act = to_host(*dact, n * k * ff);
  EXPECT_LT(rel_l2(got_act, act), 2.5e-2) << "grouped swiglu " << what;

  // The order itself: a permutation of the pairs, expert by expert, with consistent starts.
  std::vector<int32_t> pairs(n * k), pair_start(n_expert + 1), tile_start(n_expert + 1);
  cudaMemcpy(pairs.data(), order.pairs, pairs.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(pair_start.data(), order.pair_start, pair_start.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(tile_start.data(), order.tile_start, tile_start.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<int32_t> sorted = pairs;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> all(n * k);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all) << what;
  EXPECT_EQ(pair_start[0], 0);
  EXPECT_EQ(pair_start[n_expert], n * k);
  int64_t tiles = 0;
  for (int e = 0; e < n_expert; ++e) {
    const int64_t count = std::count(ids.begin(), ids.end(), e);
    EXPECT_EQ(pair_start[e + 1] - pair_start[e], count) << what << " expert " << e;
    for (int32_t i = pair_start[e]; i < pair_start[e + 1]; ++i)
      EXPECT_EQ(ids[pairs[i]], e) << what << " position " << i;
    EXPECT_EQ(tile_start[e], tiles) << what << " expert " << e;
    tiles += (count + 31) / 32;
  }
  EXPECT_LE(tiles, order.max_tiles);

  std::vector<float> want_pairs(n * k * dim);
  for (int64_t p = 0; p < n * k; ++p)
    ref::matmul(wd.expert(ids[p]), got_act.data() + p * ff, want_pairs.data() + p * dim, 1);
  grouped_experts_down(pd.m, order, dact->f(), dpairs->f(), nullptr);
  EXPECT_LT(rel_l2(to_host(*dpairs, n * k * dim), want_pairs), 2.5e-2) << "grouped down " << what;
}

TEST(CudaMatmulLaunchers, GroupedExpertsMatchReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(29);
  for (int64_t n : {1, 33, 100}) {
    check_grouped(DType::Q4_K, false, false, 256 * 3, 256, 8, 3, n, false, rng);
    check_grouped(DType::Q4_K, false, true, 256 * 3, 512, 8, 3, n, true, rng);
  }
  check_grouped(DType::Q4_K, false, true, 512, 256, 64, 4, 257, false, rng);  // empty experts
  check_grouped(DType::Q5_K, false, false, 256, 256, 6, 2, 40, false, rng);
  check_grouped(DType::Q6_K, false, false, 256, 256, 6, 2, 40, true, rng);
  check_grouped(DType::IQ4_XS, false, false, 256, 256, 6, 2, 40, false, rng);
  check_grouped(DType::Q8_0, true, true, 512, 256, 5, 4, 50, false, rng);
  check_grouped(DType::Q8_0, true, false, 512, 192, 5, 4, 50, true, rng);
  check_grouped(DType::Q8_0, false, false, 192, 128, 5, 2, 50, true, rng);
  check_grouped(DType::Q4_0, false, false, 192, 128, 5, 2, 50, false, rng);
  check_grouped(DType::F32, false, false, 128, 64, 4, 2, 37, false, rng);
}

// The prefill GEMM path (past 64 rows, and from 32 for the types the dense int8 GEMM lacks:
// weights expanded, cuBLAS) on the shapes of a real layer slice, every type, against the
// reference.
TEST(CudaMatmulLaunchers, PrefillGemmMatchesReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS, DType::Q8_0, DType::Q4_0,
                     DType::F16, DType::BF16, DType::F32}) {
    for (bool q8s : {false, true}) {
      if (q8s && type != DType::Q8_0) continue;
      const int64_t in = 1024, out = 700, n = 77;  // past the dense int8 GEMM's 33..64
      const HostWeight hw = make_weight(type, in, out, 1, rng);
      const std::vector<float> x = random_floats(n * in, rng);
      std::vector<float> want(n * out);
      ref::matmul(Weight{"w", hw.view}, x.data(), want.data(), n);
      const PlacedWeight pw = place_weight(hw, q8s);
      auto dx = to_device(x.data(), n * in * 4);
      auto dy = poisoned(n * out);
      DeviceBuffer ws(matmul_workspace_bytes(pw.m, n));
      matmul(pw.m, dx->f(), dy->f(), n, ws.ptr, nullptr);
      const std::vector<float> got = to_host(*dy, n * out);
      EXPECT_LT(scaled_max_err(got, want, x, hw, n, in, out), scaled_tol(type))
          << dtype_name(type) << (q8s ? " superblocks" : "");
      EXPECT_LT(rel_l2(got, want), int8_path(type) ? 1e-2 : 1e-5)
          << dtype_name(type) << (q8s ? " superblocks" : "");
    }
  }
}

// The dense int8 GEMM (moe_mmq.cu's kernels over the rows in order: batched decode from 33 rows)
// (called directly, so for any n) with every tile size, its weights loaded into registers and
// staged through shared memory (bit for bit the same), against the reference: rows that leave a
// partial tile, outs that leave a partial block, SwiGLU pairs; types without the kernel are
// refused, launching nothing.
TEST(CudaMatmulLaunchers, DenseInt8GemmMatchesReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  const int64_t in = 512, out = 300;
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0}) {
    const HostWeight hw = make_weight(type, in, out, 1, rng);
    const PlacedWeight pw = place_weight(hw, type == DType::Q8_0);
    for (int64_t n : {33, 64, 77, 130}) {
      const std::vector<float> x = random_floats(n * in, rng);
      std::vector<float> want(n * out);
      ref::matmul(Weight{"w", hw.view}, x.data(), want.data(), n);
      auto dx = to_device(x.data(), n * in * 4);
      DeviceBuffer ws(matmul_workspace_bytes(pw.m, n));
      for (int tile : {16, 32, 64}) {
        auto dy = poisoned(n * out);
        ASSERT_TRUE(matmul_mmq(pw.m, dx->f(), dy->f(), n, ws.ptr, tile, nullptr))
            << dtype_name(type);
        const std::vector<float> got = to_host(*dy, n * out);
        EXPECT_LT(scaled_max_err(got, want, x, hw, n, in, out), scaled_tol(type))
            << dtype_name(type) << " n=" << n << " tile=" << tile;
        EXPECT_LT(rel_l2(got, want), 1e-2) << dtype_name(type) << " n=" << n << " tile=" << tile;
      }
    }
  }
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
    const int64_t ff = 192;
    const HostWeight hg = make_weight(type, in, ff, 1, rng), hu = make_weight(type, in, ff, 1, rng);
    const PlacedWeight pg = place_weight(hg, type == DType::Q8_0);
    const PlacedWeight pu = place_weight(hu, type == DType::Q8_0);
    for (int64_t n : {33, 100}) {
      const std::vector<float> x = random_floats(n * in, rng);
      std::vector<float> g(n * ff), u(n * ff);
      ref::matmul(Weight{"g", hg.view}, x.data(), g.data(), n);
      ref::matmul(Weight{"u", hu.view}, x.data(), u.data(), n);
      const std::vector<float> want = silu_mul_ref(g, u);
      auto dx = to_device(x.data(), n * in * 4);
      DeviceBuffer ws(matmul_swiglu_workspace_bytes(pg.m, n));
      for (int tile : {16, 32, 64}) {
        auto dy = poisoned(n * ff);
        ASSERT_TRUE(matmul_swiglu_mmq(pg.m, pu.m, dx->f(), dy->f(), n, ws.ptr, tile, nullptr))
            << dtype_name(type);
        const std::vector<float> got = to_host(*dy, n * ff);
        EXPECT_LT(rel_l2(got, want), 2.5e-2)
            << "swiglu " << dtype_name(type) << " n=" << n << " tile=" << tile;
      }
    }
  }
  // Through the launchers: a group's wide matrix takes the int8 GEMM (bit for bit the direct
  // call), its narrow one (fewer blocks than SMs) and its float one the cuBLAS GEMM; a wide SwiGLU
  // pair the int8 GEMM too. 8,448 = 132 x 64 rows: at least one block an SM on any GPU of up to
  // 528 SMs at 64 rows.
  {
    const int64_t n = 64, in2 = 256, wide = 8448, narrow = 48, ff = 4224;
    const HostWeight hw = make_weight(DType::Q4_K, in2, wide, 1, rng);
    const HostWeight hn = make_weight(DType::Q8_0, in2, narrow, 1, rng);
    const HostWeight hf = make_weight(DType::F32, in2, 7, 1, rng);
    const PlacedWeight pw = place_weight(hw, false), pn = place_weight(hn, true);
    const PlacedWeight pf = place_weight(hf, false);
    const std::vector<float> x = random_floats(n * in2, rng);
    auto dx = to_device(x.data(), n * in2 * 4);
    auto yw = poisoned(n * wide), yn = poisoned(n * narrow), yf = poisoned(n * 7);
    auto direct = poisoned(n * wide);
    const Projection p[3] = {
        {.w = pw.m, .y = yw->f()}, {.w = pn.m, .y = yn->f()}, {.w = pf.m, .y = yf->f()}};
    DeviceBuffer ws(matmul_group_workspace_bytes(p, 3, n));
    matmul_group(p, 3, dx->f(), n, ws.ptr, nullptr);
    const std::vector<float> got_wide = to_host(*yw, n * wide);
    ASSERT_TRUE(matmul_mmq(pw.m, dx->f(), direct->f(), n, ws.ptr, 0, nullptr));
    EXPECT_EQ(0, std::memcmp(got_wide.data(), to_host(*direct, n * wide).data(), n * wide * 4))
        << "the group's wide matrix did not take the int8 GEMM";
    const HostWeight* hws[3] = {&hw, &hn, &hf};
    const int64_t outs[3] = {wide, narrow, 7};
    const std::vector<float> gots[3] = {got_wide, to_host(*yn, n * narrow), to_host(*yf, n * 7)};
    for (int i = 0; i < 3; ++i) {
      std::vector<float> want(n * outs[i]);
      ref::matmul(Weight{"w", hws[i]->view}, x.data(), want.data(), n);
      EXPECT_LT(rel_l2(gots[i], want), i == 2 ? 1e-5 : 1e-2) << "group projection " << i;
    }
    const HostWeight hg = make_weight(DType::Q4_K, in2, ff, 1, rng);
    const HostWeight hu = make_weight(DType::Q4_K, in2, ff, 1, rng);
    const PlacedWeight pg = place_weight(hg, false), pu = place_weight(hu, false);
    std::vector<float> g(n * ff), u(n * ff);
    ref::matmul(Weight{"g", hg.view}, x.data(), g.data(), n);
    ref::matmul(Weight{"u", hu.view}, x.data(), u.data(), n);
    DeviceBuffer sws(matmul_swiglu_workspace_bytes(pg.m, n));
    auto sy = poisoned(n * ff), sdirect = poisoned(n * ff);
    matmul_swiglu(pg.m, pu.m, dx->f(), sy->f(), n, sws.ptr, nullptr);
    const std::vector<float> got = to_host(*sy, n * ff);
    ASSERT_TRUE(matmul_swiglu_mmq(pg.m, pu.m, dx->f(), sdirect->f(), n, sws.ptr, 0, nullptr));
    EXPECT_EQ(0, std::memcmp(got.data(), to_host(*sdirect, n * ff).data(), n * ff * 4))
        << "the wide SwiGLU pair did not take the int8 GEMM";
    EXPECT_LT(rel_l2(got, silu_mul_ref(g, u)), 2.5e-2);
  }
  // Refused: IQ4_XS, Q8_0 not in superblocks, a SwiGLU pair of two types, an ff not a multiple
  // of 64 (the output must stay untouched: poisoned).
  const int64_t n = 40;
  const std::vector<float> x = random_floats(n * in, rng);
  auto dx = to_device(x.data(), n * in * 4);
  for (const auto& [type, q8s] : {std::pair{DType::IQ4_XS, false}, std::pair{DType::Q8_0, false}}) {
    const HostWeight hw = make_weight(type, in, out, 1, rng);
    const PlacedWeight pw = place_weight(hw, q8s);
    DeviceBuffer ws(matmul_workspace_bytes(pw.m, n));
    auto dy = poisoned(n * out);
    EXPECT_FALSE(matmul_mmq(pw.m, dx->f(), dy->f(), n, ws.ptr, 0, nullptr)) << dtype_name(type);
    const std::vector<float> got = to_host(*dy, n * out);
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return std::isnan(v); }));
  }
  const HostWeight h4 = make_weight(DType::Q4_K, in, 192, 1, rng);
  const HostWeight h6 = make_weight(DType::Q6_K, in, 192, 1, rng);
  const HostWeight h4odd = make_weight(DType::Q4_K, in, 96, 1, rng);
  const PlacedWeight p4 = place_weight(h4, false), p6 = place_weight(h6, false);
  const PlacedWeight p4odd = place_weight(h4odd, false);
  DeviceBuffer ws(matmul_swiglu_workspace_bytes(p4.m, n));
  auto dy = poisoned(n * 192);
  EXPECT_FALSE(matmul_swiglu_mmq(p4.m, p6.m, dx->f(), dy->f(), n, ws.ptr, 0, nullptr));
  EXPECT_FALSE(matmul_swiglu_mmq(p4odd.m, p4odd.m, dx->f(), dy->f(), n, ws.ptr, 0, nullptr));
  const std::vector<float> got = to_host(*dy, n * 192);
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return std::isnan(v); }));
}

TEST(CudaMatmulLaunchers, WorkspaceGrowsWithRows) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Matrix w{.dtype = DType::Q4_K, .in = 2048, .out = 512, .row_bytes = 2048 / 256 * 144};
  EXPECT_GE(matmul_workspace_bytes(w, 1), 2048 + 2048 / 32 * 4);
  EXPECT_GE(matmul_workspace_bytes(w, 8), 8 * (2048 + 2048 / 32 * 4));
  const Matrix f{.dtype = DType::F16, .in = 37, .out = 5, .row_bytes = 74};
  EXPECT_EQ(matmul_workspace_bytes(f, 8), 0);
  EXPECT_TRUE(has_kernel(DType::IQ4_XS));
  EXPECT_FALSE(has_kernel(DType::Q3_K));
}

}  // namespace
}  // namespace qwenrt::ops::cuda
