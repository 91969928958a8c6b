// The CPU backend's matmul (ops/cpu/matmul.h) against ops::ref::matmul, on every ISA level this
// machine supports, odd shapes, fresh random inputs and NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/matmul_gemm.h"
#include "ops/cpu/quant_dot.h"
#include "ops/cpu/repack.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"
#include "support/model_files.h"
#include "support/weights.h"

namespace qwenrt::ops::cpu {
namespace {

// Random weights with realistic per-row scales (a spread of magnitudes, a few outliers) quantised
// with quant/'s reference quantisers; rows laid out [in, out] as GGUF stores them.
struct TestWeight {
  std::vector<uint8_t> bytes;
  TensorView view;
};
TestWeight make_weight(DType type, int64_t in, int64_t out, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> row_scale(0.005f, 0.05f);
  std::vector<float> values(in * out);
  for (int64_t r = 0; r < out; ++r) {
    const float s = row_scale(rng);
    for (int64_t i = 0; i < in; ++i) {
      float v = normal(rng) * s;
      if (rng() % 97 == 0) v *= 6;  // outliers, as trained weights have
      values[r * in + i] = v;
    }
  }
  TestWeight w;
  const auto& tr = traits(type);
  w.bytes.resize(in / tr.block_elems * tr.block_bytes * out);
  quant::quantize(type, values.data(), w.bytes.data(), in * out);
  w.view = TensorView::contiguous(type, 2, {in, out, 1, 1}, w.bytes.data());
  return w;
}

std::vector<float> random_activations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

using testing_support::rel_l2;

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa <= detected_isa()) out.push_back(isa);
  return out;
}

// Restores the detected ISA when a test ends.
struct IsaGuard {
  explicit IsaGuard(Isa isa) { set_isa_for_testing(isa); }
  ~IsaGuard() { set_isa_for_testing(detected_isa()); }
};

bool int8_path(DType t) {
  switch (t) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
      return true;
    default:
      return false;
  }
}

struct Shape {
  int64_t in, out, n;
};

// Runs every shape on every ISA level; returns the worst (per ISA) rel L2 pooled over the shapes.
// int8-activation paths: pooled < 1e-2 and each shape < 2.5e-2 (a shape with few outputs
// is one noisy sample of the ~6e-3 activation-rounding error; a bug gives ~1); fp32 paths < 1e-5.
double check_type(DType type, const std::vector<Shape>& shapes, ThreadPool& pool) {
  std::mt19937 rng(1234 + static_cast<int>(type));
  Scratch scratch;
  Context ctx{pool, scratch};
  const bool int8 = int8_path(type);
  const double tol = int8 ? 1e-2 : 1e-5, shape_tol = int8 ? 2.5e-2 : 1e-5;
  const std::vector<Isa> isas = supported_isas();
  std::vector<double> num(isas.size()), den(isas.size());
  for (const Shape& s : shapes) {
    const TestWeight w = make_weight(type, s.in, s.out, rng);
    const std::vector<float> x = random_activations(s.n * s.in, rng);
    std::vector<float> want(s.n * s.out);
    ref::matmul(Weight{"w", w.view}, x.data(), want.data(), s.n);
    for (size_t i = 0; i < isas.size(); ++i) {
      IsaGuard guard(isas[i]);
      std::vector<float> got(s.n * s.out, std::numeric_limits<float>::quiet_NaN());
      matmul(w.view, x.data(), got.data(), s.n, ctx);
      const double err = rel_l2(got, want);  // NaN (an unwritten element) fails the check
      EXPECT_LT(err, shape_tol) << dtype_name(type) << " " << isa_name(isas[i]) << " in=" << s.in
                                << " out=" << s.out << " n=" << s.n;
      if (!(err < shape_tol)) return err;
      double ww = 0;
      for (float v : want) ww += double(v) * v;
      num[i] += err * err * ww;
      den[i] += ww;
    }
  }
  double worst = 0;
  for (size_t i = 0; i < isas.size(); ++i) {
    const double pooled = std::sqrt(num[i] / den[i]);
    EXPECT_LT(pooled, tol) << dtype_name(type) << " " << isa_name(isas[i]);
    worst = std::max(worst, pooled);
  }
  return worst;
}

// n covers every token-tile tail of the panel path (n % 8 = 1 .. 7) and the GEMV path (n < 4).
const std::vector<Shape> kKQuantShapes = {
    {512, 16, 4},    {256, 23, 6},  {512, 9, 10}, {256, 5, 11}, {256, 40, 13},
    {256, 17, 14},   {256, 1, 8},   {512, 33, 1}, {512, 7, 3},  {768, 33, 63},
    {256, 200, 200}, {1024, 48, 9}, {512, 37, 17}};
const std::vector<Shape> kBlock32Shapes = {{32, 1, 8},    {64, 33, 1},     {96, 7, 3},
                                           {352, 33, 63}, {160, 200, 200}, {256, 48, 9},
                                           {544, 21, 17}};
const std::vector<Shape> kFloatShapes = {
    {1, 1, 1}, {37, 7, 3}, {100, 33, 63}, {64, 200, 200}, {300, 5, 17}};

class CpuMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CpuMatmul, MatchesReferenceOnEveryIsa) {
  ThreadPool pool(2);
  const DType t = GetParam();
  const auto& bs = traits(t).block_elems;
  const auto& shapes = bs == 256 ? kKQuantShapes : bs == 32 ? kBlock32Shapes : kFloatShapes;
  const double worst = check_type(t, shapes, pool);
  RecordProperty("worst_rel_l2", std::to_string(worst));
  std::printf("  %s worst rel L2 %.2e\n", std::string(dtype_name(t)).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(FastTypes, CpuMatmul,
                         ::testing::Values(DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS,
                                           DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::F32,
                                           DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
// Types without a fast kernel go through quant::dequantize of rows into fp32.
INSTANTIATE_TEST_SUITE_P(DequantisedTypes, CpuMatmul,
                         ::testing::Values(DType::Q2_K, DType::Q3_K, DType::Q4_1, DType::Q5_1,
                                           DType::IQ4_NL),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The panel layout (repack.h) the cpu backend places Q4_K / Q6_K / Q8_0 weights in: against the
// reference on every batch size of the fused few-token kernels (1..8, in passes of 4) and of the
// tiles (9, 17, 63), on a prefix of the rows that ends inside a panel, and bit for bit against
// the row layout's panel GEMM where both unpack the same codes into the same tiles (n > 8).
using testing_support::panel_copy;

// The activation quantiser gives the same bytes at every ISA level: random rows, rows with
// values exactly half-way between two codes (round half to even), all-zero blocks, one block of
// a single large value, in both int8 formats.
TEST(CpuMatmul, ActivationQuantisationIsTheSameBytesAtEveryLevel) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t in = 256 * 3;
  std::vector<float> x(in);
  for (auto& v : x) v = normal(rng);
  for (int64_t i = 256; i < 512; ++i) x[i] = 0.0f;  // a zero block (and 8 zero 32-blocks)
  // Block 3: amax 127 makes id 1, so k + 0.5 lands half-way between codes.
  for (int64_t i = 512; i < 768; ++i) x[i] = static_cast<float>(i % 64) - 31.5f;
  x[700] = 127.0f;
  for (ActFormat f : {ActFormat::kQ8K, ActFormat::kQ8_32}) {
    const int64_t bytes = act_row_bytes(f, in);
    std::vector<uint8_t> want(bytes), got(bytes);
    {
      IsaGuard guard(Isa::kScalar);
      quantize_act_row(f, x.data(), in, want.data());
    }
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (isa > detected_isa()) continue;
      IsaGuard guard(isa);
      std::fill(got.begin(), got.end(), 0xAB);
      quantize_act_row(f, x.data(), in, got.data());
      EXPECT_EQ(got, want) << isa_name(isa) << (f == ActFormat::kQ8K ? " Q8_K" : " Q8_0");
    }
  }
}

TEST(CpuMatmul, PanelLayoutMatchesReferenceAndRowLayout) {
  if (detected_isa() < Isa::kAvx512) GTEST_SKIP() << "the panel layout needs AVX-512 VNNI";
  ThreadPool pool(2);
  Scratch scratch;
  Context ctx{pool, scratch};
  std::mt19937 rng(4242);
  struct Case {
    DType type;
    int64_t in, out, rows;  // rows: the view's rows (a prefix of out)
  };
  const std::vector<Case> cases = {
      {DType::Q4_K, 256, 16, 16}, {DType::Q4_K, 1024, 48, 48}, {DType::Q4_K, 512, 64, 37},
      {DType::Q6_K, 256, 32, 32}, {DType::Q6_K, 768, 48, 41},  {DType::Q6_K, 1280, 16, 16},
      {DType::Q8_0, 32, 16, 16},  {DType::Q8_0, 352, 48, 48},  {DType::Q8_0, 1024, 64, 50}};
  for (const Case& c : cases) {
    const TestWeight w = make_weight(c.type, c.in, c.out, rng);
    ASSERT_TRUE(can_repack(w.view));
    const auto p = panel_copy(w.view);
    TensorView rows_view = w.view, panel_view = p.view;
    rows_view.ne[1] = panel_view.ne[1] = c.rows;
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 17, 63}) {
      const std::vector<float> x = random_activations(n * c.in, rng);
      std::vector<float> want(n * c.rows);
      ref::matmul(Weight{"w", rows_view}, x.data(), want.data(), n);
      std::vector<float> got(n * c.rows, std::numeric_limits<float>::quiet_NaN());
      matmul(panel_view, x.data(), got.data(), n, ctx);
      EXPECT_LT(rel_l2(got, want), 2.5e-2)
          << dtype_name(c.type) << " in=" << c.in << " rows=" << c.rows << " n=" << n;
      if (n > kPanelStreamTokens) {
        std::vector<float> row_layout(n * c.rows);
        matmul(rows_view, x.data(), row_layout.data(), n, ctx);
        EXPECT_EQ(got, row_layout) << dtype_name(c.type) << " in=" << c.in << " n=" << n;
        // The fused kernels (3 tokens) round as the tiles do: the first 3 rows are the same.
        std::vector<float> three(3 * c.rows);
        matmul(panel_view, x.data(), three.data(), 3, ctx);
        EXPECT_TRUE(std::equal(three.begin(), three.end(), got.begin()))
            << dtype_name(c.type) << " in=" << c.in << ": 3 tokens differ from " << n;
      }
    }
  }
}

TEST(CpuMatmul, OnlyMatmulTypesWithWholePanelsAreRepacked) {
  std::mt19937 rng(5);
  const bool avx512 = detected_isa() >= Isa::kAvx512;
  EXPECT_EQ(can_repack(make_weight(DType::Q4_K, 256, 32, rng).view), avx512);
  EXPECT_FALSE(can_repack(make_weight(DType::Q4_K, 256, 24, rng).view));  // not whole panels
  EXPECT_FALSE(can_repack(make_weight(DType::Q5_K, 256, 32, rng).view));  // no fused kernel
  EXPECT_FALSE(can_repack(make_weight(DType::F32, 64, 32, rng).view));
  if (!avx512) return;
  const TestWeight w = make_weight(DType::Q6_K, 256, 32, rng);
  const auto p = panel_copy(w.view);
  EXPECT_FALSE(can_repack(p.view));  // already placed
  // The reference kernels refuse the placed form instead of reading it as rows.
  std::vector<float> x(256), y(32);
  EXPECT_THROW(ref::matmul(Weight{"w", p.view}, x.data(), y.data(), 1), Error);
}

// The backend repacks a tensor in slices of panels (dropping each slice's file pages as it goes):
// slices of any size, written by several parts each, give the bytes of one whole pass.
TEST(CpuMatmul, PanelsWrittenInSlicesEqualOnePass) {
  if (detected_isa() < Isa::kAvx512) GTEST_SKIP() << "the panel layout needs AVX-512 VNNI";
  std::mt19937 rng(77);
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
    const TestWeight w = make_weight(type, 512, 80, rng);  // 5 panels
    const auto whole = panel_copy(w.view);
    const int64_t panels = panel_count(w.view), bytes = w.view.nb[2] * w.view.ne[2];
    ASSERT_EQ(panels, 5);
    ASSERT_EQ(panel_bytes(w.view) * panels, bytes);
    for (int64_t slice : {1, 2, 3, 5}) {
      std::vector<uint8_t> sliced(static_cast<size_t>(bytes), 0xCD);
      for (int64_t i0 = 0; i0 < panels; i0 += slice)
        for (int part = 0; part < 2; ++part)
          write_panels(w.view, sliced.data(), part, 2, i0, std::min(panels, i0 + slice));
      EXPECT_EQ(std::memcmp(sliced.data(), whole.view.data, static_cast<size_t>(bytes)), 0)
          << dtype_name(type) << " in slices of " << slice;
    }
    std::vector<uint8_t> out(static_cast<size_t>(bytes));
    EXPECT_THROW(write_panels(w.view, out.data(), 0, 1, 3, 6), Error);  // past the last panel
  }
}

TEST(CpuMatmul, SecondCallDoesNotGrowScratch) {
  ThreadPool pool(2);
  Scratch scratch;
  Context ctx{pool, scratch};
  std::mt19937 rng(7);
  const TestWeight w = make_weight(DType::Q4_K, 512, 64, rng);
  const std::vector<float> x = random_activations(32 * 512, rng);
  std::vector<float> y(32 * 64);
  for (int64_t n : {32, 1}) matmul(w.view, x.data(), y.data(), n, ctx);
  const size_t act = scratch.act.capacity();
  std::vector<size_t> per_thread;
  for (auto& b : scratch.per_thread) per_thread.push_back(b.capacity());
  for (int64_t n : {1, 32, 5}) matmul(w.view, x.data(), y.data(), n, ctx);
  EXPECT_EQ(scratch.act.capacity(), act);
  for (size_t i = 0; i < per_thread.size(); ++i)
    EXPECT_EQ(scratch.per_thread[i].capacity(), per_thread[i]);
}

TEST(ThreadPoolRun, EveryPartRunsOnceOnItsOwnIndex) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 2000; ++round) {
      const int parts = 1 + round % (threads + 1);  // includes a request above size()
      std::vector<std::atomic<int>> hits(threads);
      std::atomic<int> seen_parts{0};
      pool.run(parts, [&](int p, int np) {
        hits[p]++;
        seen_parts = np;
      });
      const int expect = std::min(parts, threads);
      EXPECT_EQ(seen_parts.load(), expect);
      for (int p = 0; p < threads; ++p) ASSERT_EQ(hits[p].load(), p < expect ? 1 : 0);
    }
  }
}

TEST(ThreadPoolRun, RethrowsAPartsException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.run(2,
                        [](int p, int) {
                          if (p == 1) throw std::runtime_error("part 1");
                        }),
               std::runtime_error);
  int ran = 0;
  pool.run(1, [&](int, int) { ++ran; });
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace qwenrt::ops::cpu
