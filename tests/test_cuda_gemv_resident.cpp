// The one-row GEMV kernels (ops/cuda/gemv_resident.cu: resident and streamed) and the Q8_0
// superblock layout against ops::ref, and the streamed kernel against the resident one; the
// shared helpers and tolerances are tests/support/cuda_matmul.h's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/ref/kernels.h"
#include "support/cuda_matmul.h"
#include "support/scoped_env.h"

namespace qwenrt::ops::cuda {
namespace {

// ---- The resident GEMV (n = 1) and Q8_0 superblocks -------------------------------------------
// The types with a resident kernel, Q8_0 as the backend places it (superblocks) among them.
struct ResidentType {
  DType type;
  bool q8s;
  const char* name;
};
const ResidentType kResidentTypes[] = {{DType::Q4_K, false, "Q4_K"},
                                       {DType::Q5_K, false, "Q5_K"},
                                       {DType::IQ4_XS, false, "IQ4_XS"},
                                       {DType::Q8_0, true, "Q8_0 superblocks"}};

// Row lengths that give every slicing of a row (units = in / 32: 8 and 64 in one slice of one or
// two units a lane, 160 in two slices, 384 in four, 544 in eight with a ragged last slice).
const int64_t kResidentIns[] = {256, 2048, 5120, 12288, 17408};

TEST(CudaMatmulLaunchers, ResidentGemvMatchesReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(21);
  for (const ResidentType& t : kResidentTypes) {
    for (int64_t in : kResidentIns) {
      for (int64_t out : {1, 7, 515}) {
        const HostWeight hw = make_weight(t.type, in, out, 1, rng);
        const PlacedWeight pw = place_weight(hw, t.q8s);
        const std::vector<float> x = random_floats(in, rng);
        auto dx = to_device(x.data(), in * 4);
        auto dy = poisoned(out);
        DeviceBuffer ws(std::max<int64_t>(16, matmul_workspace_bytes(pw.m, 1)));
        matmul(pw.m, dx->f(), dy->f(), 1, ws.ptr, nullptr);
        std::vector<float> want(out);
        ref::matmul(Weight{"w", hw.view}, x.data(), want.data(), 1);
        const std::vector<float> got = to_host(*dy, out);
        EXPECT_LT(scaled_max_err(got, want, x, hw, 1, in, out), scaled_tol(t.type))
            << t.name << " in=" << in << " out=" << out;
        if (out >= 16) {
          EXPECT_LT(rel_l2(got, want), 2.5e-2) << t.name << " in=" << in;
        }
        // Two copies of x take the staged kernel: the same int8 activations and weights, so the
        // resident row may differ from it by summation order only.
        std::vector<float> x2(x);
        x2.insert(x2.end(), x.begin(), x.end());
        auto dx2 = to_device(x2.data(), 2 * in * 4);
        auto dy2 = poisoned(2 * out);
        DeviceBuffer ws2(matmul_workspace_bytes(pw.m, 2));
        matmul(pw.m, dx2->f(), dy2->f(), 2, ws2.ptr, nullptr);
        const std::vector<float> staged = to_host(*dy2, 2 * out);
        EXPECT_LT(scaled_max_err(got, std::vector<float>(staged.begin(), staged.begin() + out), x,
                                 hw, 1, in, out),
                  1e-5)
            << t.name << " in=" << in << " out=" << out << ": resident and staged kernels differ";
      }
    }
  }
}

// The streamed GEMV (weights landed in shared memory by bulk copies, the default on sm_90 for rows
// of 5120 and more) runs the resident kernel's integer dots and summation order; only the
// compiler's fused multiply-adds may differ. The single, group and SwiGLU modes must agree with
// QWENRT_CUDA_STREAM=0 (the resident kernel) to 1e-5 of the largest output (routed experts and rows
// under 5120 stay on the resident kernel). The tests above check the default path against the
// reference.
TEST(CudaMatmulLaunchers, StreamedGemvEqualsResident) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(24);
  for (const ResidentType& t : kResidentTypes) {
    for (int64_t in : {5120, 12288, 17408}) {
      const std::vector<float> x = random_floats(in, rng);
      auto dx = to_device(x.data(), in * 4);
      const int64_t outs[3] = {1, 515, 7};
      std::vector<HostWeight> hw;
      std::vector<PlacedWeight> pw;
      for (int i = 0; i < 3; ++i) {
        hw.push_back(make_weight(t.type, in, outs[i], 1, rng));
        pw.push_back(place_weight(hw[i], t.q8s));
      }
      const int64_t ff = 300;
      const HostWeight hg = make_weight(t.type, in, ff, 1, rng),
                       hu = make_weight(t.type, in, ff, 1, rng);
      const PlacedWeight pg = place_weight(hg, t.q8s), pu = place_weight(hu, t.q8s);
      // Everything one setting computes: a single matrix, a group of three, a dense SwiGLU.
      auto run = [&](const char* stream) {
        const testing_support::ScopedEnv env("QWENRT_CUDA_STREAM", stream);
        std::vector<float> all;
        auto take = [&](const DeviceBuffer& b, int64_t n) {
          const std::vector<float> v = to_host(b, n);
          all.insert(all.end(), v.begin(), v.end());
        };
        DeviceBuffer ws(std::max<int64_t>(16, matmul_workspace_bytes(pw[1].m, 1)));
        auto y = poisoned(outs[1]);
        matmul(pw[1].m, dx->f(), y->f(), 1, ws.ptr, nullptr);
        take(*y, outs[1]);
        std::vector<std::unique_ptr<DeviceBuffer>> ys;
        std::vector<Projection> p;
        for (int i = 0; i < 3; ++i) {
          ys.push_back(poisoned(outs[i]));
          p.push_back({.w = pw[i].m, .y = ys[i]->f()});
        }
        DeviceBuffer wsg(std::max<int64_t>(16, matmul_group_workspace_bytes(p.data(), 3, 1)));
        matmul_group(p.data(), 3, dx->f(), 1, wsg.ptr, nullptr);
        for (int i = 0; i < 3; ++i) take(*ys[i], outs[i]);
        auto ysw = poisoned(ff);
        matmul_swiglu(pg.m, pu.m, dx->f(), ysw->f(), 1, ws.ptr, nullptr);
        take(*ysw, ff);
        return all;
      };
      const std::vector<float> streamed = run("1"), resident = run("0");
      ASSERT_EQ(streamed.size(), resident.size());
      float largest = 0.0f;
      for (float v : resident) largest = std::isnan(v) ? largest : std::max(largest, std::fabs(v));
      size_t differ = 0;
      for (size_t i = 0; i < streamed.size(); ++i) {
        const bool nan_s = std::isnan(streamed[i]), nan_r = std::isnan(resident[i]);
        differ +=
            nan_s != nan_r || (!nan_s && std::fabs(streamed[i] - resident[i]) > 1e-5f * largest);
      }
      EXPECT_EQ(differ, 0u) << t.name << " in=" << in << ": " << differ << " of " << streamed.size()
                            << " outputs differ";
    }
  }
}

// Q8_0 superblocks through every path that reads Q8_0: the resident GEMV (n = 1), the staged
// GEMV (n <= 8), the chunked kernel (n > 8), a group, the embedding lookup, and the repack itself
// (its bytes are the GGUF bytes moved, checked here against the layout quant_blocks.cuh states).
TEST(CudaMatmulLaunchers, Q8SuperblocksMatchReferenceOnEveryPath) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(22);
  {
    const HostWeight hw = make_weight(DType::Q8_0, 512, 3, 1, rng);
    const PlacedWeight pw = place_weight(hw, true);
    std::vector<uint8_t> got(hw.bytes.size());
    ASSERT_EQ(cudaMemcpy(got.data(), pw.data->ptr, got.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t sb = 0; sb < got.size() / 272; ++sb) {
      const uint8_t* g = got.data() + 272 * sb;
      const uint8_t* b = hw.bytes.data() + 272 * sb;  // eight 34-byte GGUF blocks
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ(std::memcmp(g + 2 * j, b + 34 * j, 2), 0) << "scale of block " << j;
        ASSERT_EQ(std::memcmp(g + 16 + 32 * j, b + 34 * j + 2, 32), 0) << "quants of block " << j;
      }
    }
  }
  for (int64_t in : {256, 768, 5120}) {
    for (int64_t n : {1, 4, 9, 33}) {
      const int64_t out = 300;
      const HostWeight hw = make_weight(DType::Q8_0, in, out, 1, rng);
      const PlacedWeight pw = place_weight(hw, true);
      const std::vector<float> x = random_floats(n * in, rng);
      auto dx = to_device(x.data(), n * in * 4);
      auto dy = poisoned(n * out);
      DeviceBuffer ws(matmul_workspace_bytes(pw.m, n));
      matmul(pw.m, dx->f(), dy->f(), n, ws.ptr, nullptr);
      std::vector<float> want(n * out);
      ref::matmul(Weight{"w", hw.view}, x.data(), want.data(), n);
      const std::vector<float> got = to_host(*dy, n * out);
      EXPECT_LT(scaled_max_err(got, want, x, hw, n, in, out), scaled_tol(DType::Q8_0))
          << "in=" << in << " n=" << n;
      EXPECT_LT(rel_l2(got, want), 2.5e-2) << "in=" << in << " n=" << n;
    }
  }
  // The embedding lookup dequantises exactly.
  const int64_t dim = 768, vocab = 50;
  const HostWeight ht = make_weight(DType::Q8_0, dim, vocab, 1, rng);
  const PlacedWeight pt = place_weight(ht, true);
  const std::vector<int32_t> tokens = {0, 49, 7, 7, 23};
  const int64_t n = int64_t(tokens.size());
  auto dt = to_device(tokens.data(), n * 4);
  auto de = poisoned(n * dim);
  embed_rows(pt.m, static_cast<const int32_t*>(dt->ptr), n, de->f(), nullptr);
  std::vector<float> want(n * dim);
  ref::embed_rows(Weight{"t", ht.view}, tokens.data(), want.data(), n);
  EXPECT_LT(rel_l2(to_host(*de, n * dim), want), 1e-6);
}

// A group of same-type projections, a dense SwiGLU and routed experts at n = 1 (the resident
// kernel's other two modes), with an expert id out of range writing NaN rows and nothing else.
TEST(CudaMatmulLaunchers, ResidentGroupSwiGluAndExpertsMatchReference) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  for (const ResidentType& t : kResidentTypes) {
    for (int64_t in : {2048, 5120, 17408}) {
      const std::vector<float> x = random_floats(in, rng);
      auto dx = to_device(x.data(), in * 4);
      // Group of three.
      const int64_t outs[3] = {61, 515, 7};
      std::vector<HostWeight> hw;
      std::vector<PlacedWeight> pw;
      std::vector<std::unique_ptr<DeviceBuffer>> ys;
      std::vector<Projection> p;
      for (int i = 0; i < 3; ++i) {
        hw.push_back(make_weight(t.type, in, outs[i], 1, rng));
        pw.push_back(place_weight(hw[i], t.q8s));
        ys.push_back(poisoned(outs[i]));
        p.push_back({.w = pw[i].m, .y = ys[i]->f()});
      }
      DeviceBuffer ws(std::max<int64_t>(16, matmul_group_workspace_bytes(p.data(), 3, 1)));
      matmul_group(p.data(), 3, dx->f(), 1, ws.ptr, nullptr);
      for (int i = 0; i < 3; ++i) {
        std::vector<float> want(outs[i]);
        ref::matmul(Weight{"w", hw[i].view}, x.data(), want.data(), 1);
        EXPECT_LT(scaled_max_err(to_host(*ys[i], outs[i]), want, x, hw[i], 1, in, outs[i]),
                  scaled_tol(t.type))
            << t.name << " group projection " << i << " in=" << in;
      }
      // SwiGLU.
      const int64_t ff = 300;
      const HostWeight hg = make_weight(t.type, in, ff, 1, rng),
                       hu = make_weight(t.type, in, ff, 1, rng);
      const PlacedWeight pg = place_weight(hg, t.q8s), pu = place_weight(hu, t.q8s);
      std::vector<float> g(ff), u(ff);
      ref::matmul(Weight{"g", hg.view}, x.data(), g.data(), 1);
      ref::matmul(Weight{"u", hu.view}, x.data(), u.data(), 1);
      auto dy = poisoned(ff);
      matmul_swiglu(pg.m, pu.m, dx->f(), dy->f(), 1, ws.ptr, nullptr);
      EXPECT_LT(rel_l2(to_host(*dy, ff), silu_mul_ref(g, u)), 2.5e-2)
          << t.name << " swiglu in=" << in;
    }
    // Routed experts, gate and up as two views of one fused tensor, one id out of range.
    const int64_t dim = 2048, ff = 96;
    const int n_expert = 6, k = 4;
    const HostWeight hgu = make_weight(t.type, dim, 2 * ff, n_expert, rng);
    const PlacedWeight pgu = place_weight(hgu, t.q8s);
    const std::vector<float> x = random_floats(dim, rng);
    const std::vector<int32_t> ids = {4, 0, n_expert, 2};  // choice 2 is out of range
    auto dx = to_device(x.data(), dim * 4);
    auto dids = to_device(ids.data(), k * 4);
    auto dact = poisoned(k * ff);
    Matrix gate = pgu.m, up = pgu.m;
    gate.out = up.out = ff;
    up.data = static_cast<const uint8_t*>(pgu.data->ptr) + ff * hgu.row_bytes;
    DeviceBuffer ws(std::max<int64_t>(16, matmul_workspace_bytes(gate, k)));
    experts_swiglu(gate, up, static_cast<const int32_t*>(dids->ptr), k, dx->f(), dact->f(), 1,
                   ws.ptr, nullptr);
    const std::vector<float> got = to_host(*dact, k * ff);
    const Weight wgu{"gate_up", hgu.view};
    std::vector<float> gu(2 * ff), want(ff);
    for (int j = 0; j < k; ++j) {
      const std::vector<float> row(got.begin() + j * ff, got.begin() + (j + 1) * ff);
      if (ids[j] >= n_expert) {
        EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float v) { return std::isnan(v); }))
            << t.name << " choice " << j << " has a bad id: its row must be NaN";
        continue;
      }
      ref::matmul(wgu.expert(ids[j]), x.data(), gu.data(), 1);
      ref::silu_mul(gu.data(), gu.data() + ff, want.data(), ff);
      EXPECT_LT(rel_l2(row, want), 2.5e-2) << t.name << " experts choice " << j;
    }
  }
}

// Two settings of the tensor-core GEMV (gemv_mma.cu) that must give the same sums: env = a against
// env = b over a single matrix, a group of three (the middle one of type `mid`) and a dense
// SwiGLU, for 3..32 activation rows. Every output must be written (poisoned first) and agree to
// `tol` of the largest output. Outputs of 7, 61 and 515 rows end in partial 32-row blocks. The
// single matrix under setting a is also held to the reference at 8 rows.
void expect_mma_settings_agree(const char* env, const char* a, const char* b, const ResidentType& t,
                               DType mid, const std::vector<int64_t>& ns, float tol,
                               std::mt19937& rng) {
  for (int64_t in : {256 * 5, 5120, 17408}) {
    const int64_t outs[3] = {515, 7, 61}, ff = 300;
    std::vector<HostWeight> hw;
    std::vector<PlacedWeight> pw;
    for (int i = 0; i < 3; ++i) {
      hw.push_back(make_weight(i == 1 ? mid : t.type, in, outs[i], 1, rng));
      pw.push_back(place_weight(hw[i], t.q8s && hw[i].view.dtype == DType::Q8_0));
    }
    const HostWeight hg = make_weight(t.type, in, ff, 1, rng),
                     hu = make_weight(t.type, in, ff, 1, rng);
    const PlacedWeight pg = place_weight(hg, t.q8s), pu = place_weight(hu, t.q8s);
    for (int64_t n : ns) {
      const std::vector<float> x = random_floats(n * in, rng);
      auto dx = to_device(x.data(), n * in * 4);
      auto run = [&](const char* value) {
        const testing_support::ScopedEnv scoped(env, value);
        std::vector<float> all;
        auto take = [&](const DeviceBuffer& buf, int64_t count) {
          const std::vector<float> v = to_host(buf, count);
          all.insert(all.end(), v.begin(), v.end());
        };
        DeviceBuffer ws(matmul_workspace_bytes(pw[0].m, n));
        auto y = poisoned(n * outs[0]);
        matmul(pw[0].m, dx->f(), y->f(), n, ws.ptr, nullptr);
        take(*y, n * outs[0]);
        std::vector<std::unique_ptr<DeviceBuffer>> ys;
        std::vector<Projection> p;
        for (int i = 0; i < 3; ++i) {
          ys.push_back(poisoned(n * outs[i]));
          p.push_back({.w = pw[i].m, .y = ys[i]->f()});
        }
        DeviceBuffer wsg(matmul_group_workspace_bytes(p.data(), 3, n));
        matmul_group(p.data(), 3, dx->f(), n, wsg.ptr, nullptr);
        for (int i = 0; i < 3; ++i) take(*ys[i], n * outs[i]);
        DeviceBuffer wss(matmul_swiglu_workspace_bytes(pg.m, n));
        auto ysw = poisoned(n * ff);
        matmul_swiglu(pg.m, pu.m, dx->f(), ysw->f(), n, wss.ptr, nullptr);
        take(*ysw, n * ff);
        return all;
      };
      const std::vector<float> va = run(a), vb = run(b);
      ASSERT_EQ(va.size(), vb.size());
      float largest = 0.0f;
      for (float v : vb) largest = std::isnan(v) ? largest : std::max(largest, std::fabs(v));
      size_t differ = 0, unwritten = 0;
      for (size_t i = 0; i < va.size(); ++i) {
        unwritten += std::isnan(va[i]);
        differ +=
            std::isnan(va[i]) || std::isnan(vb[i]) || std::fabs(va[i] - vb[i]) > tol * largest;
      }
      EXPECT_EQ(unwritten, 0u) << t.name << " in=" << in << " n=" << n;
      EXPECT_EQ(differ, 0u) << t.name << " in=" << in << " n=" << n << ": " << differ << " of "
                            << va.size() << " outputs differ between " << env << "=" << a << " and "
                            << b;
      if (n == 8) {  // the single matrix against the reference
        std::vector<float> want(n * outs[0]);
        ref::matmul(Weight{"w", hw[0].view}, x.data(), want.data(), n);
        const std::vector<float> got(va.begin(), va.begin() + n * outs[0]);
        EXPECT_LT(rel_l2(got, want), 2.5e-2) << t.name << " in=" << in;
      }
    }
  }
}

// Two m-tiles a block (the default up to 16 rows for Q4_K and Q5_K: each superblock's activation
// fragments applied to 32 weight rows) against one (QWENRT_CUDA_MMA_MT=1): warp w takes the same
// superblocks in the same order and the warps' tiles are summed in the same order. 17 activation
// rows take one m-tile either way.
TEST(CudaMatmulLaunchers, MmaGemvTwoTilesEqualOne) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(26);
  const ResidentType types[] = {{DType::Q4_K, false, "Q4_K"}, {DType::Q5_K, false, "Q5_K"}};
  for (const ResidentType& t : types)
    expect_mma_settings_agree("QWENRT_CUDA_MMA_MT", "2", "1", t, t.type, {3, 8, 9, 16, 17}, 1e-5f,
                              rng);
}

// Activations read in the tile order (the default for Q4_K, Q5_K and Q6_K; Q8_0 with
// QWENRT_CUDA_MMA_TILED=2) against the row-major reads (QWENRT_CUDA_MMA_TILED=0): the same int8
// values and the same sums in the same order, so equal to 1e-6 of the largest output, for one to
// four n-tiles. The group's middle matrix is Q6_K (its own k16 tile order).
TEST(CudaMatmulLaunchers, MmaGemvTiledActsEqualRowMajor) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(27);
  const ResidentType types[] = {{DType::Q4_K, false, "Q4_K"},
                                {DType::Q5_K, false, "Q5_K"},
                                {DType::Q8_0, true, "Q8_0 superblocks"}};
  for (const ResidentType& t : types) {
    // Q8_0 reads the tile order only when asked (QWENRT_CUDA_MMA_TILED=2).
    expect_mma_settings_agree("QWENRT_CUDA_MMA_TILED", t.type == DType::Q8_0 ? "2" : "1", "0", t,
                              DType::Q6_K, {3, 8, 13, 16, 24, 32}, 1e-6f, rng);
  }
}

// The ring form (the default; =0 off: the weights landed in shared memory by bulk copies,
// persistent blocks) against the loads from global memory (=0): consumer warp w takes the old
// kernel's warp w's superblocks in the same order and the partial tiles meet in the same order,
// so the outputs are equal bit for bit (tolerance 0), for one to four n-tiles, one and two
// m-tiles, row- and tile-ordered activations. Q6_K's rows start 2-byte aligned (1280 wide: 1050
// bytes a row), so its copies start at the 16-byte boundary below and the 7-row matrix's last
// row ends past the last 16-byte boundary of the matrix (the bytes after it are loaded, not
// copied). Without sm_90 both settings run the same kernel.
TEST(CudaMatmulLaunchers, MmaGemvRingEqualsLoads) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(33);
  const ResidentType types[] = {{DType::Q4_K, false, "Q4_K"},
                                {DType::Q5_K, false, "Q5_K"},
                                {DType::Q6_K, false, "Q6_K"},
                                {DType::Q8_0, true, "Q8_0 superblocks"}};
  for (const ResidentType& t : types)
    expect_mma_settings_agree("QWENRT_CUDA_MMA_RING", "1", "0", t, DType::Q6_K,
                              {3, 8, 9, 16, 17, 24, 32}, 0.0f, rng);
}

}  // namespace
}  // namespace qwenrt::ops::cuda
