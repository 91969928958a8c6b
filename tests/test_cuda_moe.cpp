// The cuda backend's MoE block (ops->moe: router, top-k, routed SwiGLU experts, shared expert and
// its gate) against ref::moe_ffn on random quantised weights. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"
#include "support/cuda_matmul.h"
#include "support/model_files.h"
#include "support/scoped_env.h"
#include "support/weights.h"

namespace qwenrt::ops {
namespace {

using Tensor = testing_support::QuantTensor;
using testing_support::quantized_tensor;

struct MoeCase {
  int n_expert, k;
  int64_t dim, ff, sff;
  bool fused, shared;
  DType gate_up, down, shared_gate_up, shared_down;
};

using testing_support::rel_l2;

// Two int8 activation roundings (x, then the hidden rows), as on the cpu backend
// (tests/test_cpu_moe.cpp measured 1.6e-2 .. 1.9e-2 there); a wrong row or expert gives > 1e-1.
constexpr double kTol = 3e-2;

// The first `count` floats of b as their bit patterns (bit-for-bit comparisons).
std::vector<uint32_t> device_bits(const cuda::DeviceBuffer& b, int64_t count) {
  std::vector<uint32_t> v(count);
  EXPECT_EQ(cudaMemcpy(v.data(), b.ptr, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A case's random weights: `tensors` owns their bytes, `host` views them.
struct CaseWeights {
  std::vector<Tensor> tensors;
  MoeWeights host;
};
CaseWeights case_weights(const MoeCase& c, std::mt19937& rng) {
  CaseWeights cw;
  cw.tensors.reserve(10);
  auto add = [&](const char* name, DType t, int64_t in, int64_t out, int64_t n_mat, float s) {
    cw.tensors.push_back(quantized_tensor(name, t, in, out, n_mat, s, rng));
    return cw.tensors.back().w;
  };
  MoeWeights& host = cw.host;
  host.router = add("router", DType::F32, c.dim, c.n_expert, 1, 0.2f);
  if (c.fused) {
    host.gate_up_exps = add("gate_up_exps", c.gate_up, c.dim, 2 * c.ff, c.n_expert, 0.05f);
  } else {
    host.gate_exps = add("gate_exps", c.gate_up, c.dim, c.ff, c.n_expert, 0.05f);
    host.up_exps = add("up_exps", c.gate_up, c.dim, c.ff, c.n_expert, 0.05f);
  }
  host.down_exps = add("down_exps", c.down, c.ff, c.dim, c.n_expert, 0.05f);
  if (c.shared) {
    host.shared_gate_inp = add("shared_gate_inp", DType::F32, c.dim, 1, 1, 0.1f);
    host.shared_gate = add("shared_gate", c.shared_gate_up, c.dim, c.sff, 1, 0.05f);
    host.shared_up = add("shared_up", c.shared_gate_up, c.dim, c.sff, 1, 0.05f);
    host.shared_down = add("shared_down", c.shared_down, c.sff, c.dim, 1, 0.05f);
  }
  return cw;
}

// Every tensor of host placed on ops.
MoeWeights placed(Ops& ops, const MoeWeights& host) {
  MoeWeights dev = host;
  for (Weight* w : {&dev.router, &dev.gate_exps, &dev.up_exps, &dev.gate_up_exps, &dev.down_exps,
                    &dev.shared_gate_inp, &dev.shared_gate, &dev.shared_up, &dev.shared_down}) {
    *w = ops.place(*w);
  }
  return dev;
}

void check_case(const MoeCase& c) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7 + c.n_expert * 3 + c.k);
  const CaseWeights cw = case_weights(c, rng);
  const MoeWeights& host = cw.host;
  auto ops = make_cuda_ops();
  const MoeWeights dev = placed(*ops, host);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 3, 8, 40, 130}) {  // 40, 130: the int8 grouped experts (from 16 rows)
    std::vector<float> x(n * c.dim);
    for (auto& v : x) v = normal(rng);
    std::vector<float> want(n * c.dim, 0.0f);
    ref::moe_ffn(host, x.data(), want.data(), n, c.n_expert, c.k);
    float* dx = ops->alloc(n * c.dim);
    float* dy = ops->alloc(n * c.dim);
    const std::vector<float> nan(n * c.dim, std::numeric_limits<float>::quiet_NaN());
    ops->upload(x.data(), dx, n * c.dim);
    ops->upload(nan.data(), dy, n * c.dim);
    ops->moe(dev, dx, dy, n, c.n_expert, c.k);
    std::vector<float> got(n * c.dim);
    ops->download(dy, got.data(), n * c.dim);
    ops->reset_workspace();
    const double err = rel_l2(got, want);
    EXPECT_LT(err, kTol) << c.n_expert << " experts top-" << c.k << " n=" << n;
    std::printf("  cuda moe %d experts top-%d n=%ld: rel L2 %.2e\n", c.n_expert, c.k,
                static_cast<long>(n), err);
  }
}

TEST(CudaMoe, EightExpertsTop3SeparateGateUp) {
  check_case(
      {8, 3, 256, 256, 256, false, true, DType::Q4_K, DType::Q6_K, DType::Q4_K, DType::Q4_K});
}

TEST(CudaMoe, FusedGateUpWithSharedInOtherFormats) {
  check_case({8, 3, 256, 256, 512, true, true, DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_K});
}

// The 35B-A3B's routing shape: 256 experts, top 8, Q4_K experts and a Q8_0 shared expert.
TEST(CudaMoe, TwoHundredFiftySixExpertsTop8) {
  check_case(
      {256, 8, 512, 256, 256, false, true, DType::Q4_K, DType::Q4_K, DType::Q8_0, DType::Q8_0});
}

// The routing kernel alone against ref::moe_route: the same ids (ties to the lower id: logits of
// few distinct values put ties at the top-k boundary of most rows), weights within the rounding
// of a differently ordered double sum, the shared expert's gate against a host dot; a row with a
// NaN logit routes nowhere (ids -1, NaN weights) rather than to stale ids.
TEST(CudaMoe, RouteMatchesReferenceIncludingTies) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  for (const auto& [n_expert, k] :
       {std::pair{32, 8}, std::pair{256, 8}, std::pair{512, 10}, std::pair{600, 4}}) {
    const int64_t n = 37, dim = 96;
    std::vector<float> logits(n * n_expert), x(n * dim), gate(dim);
    for (auto& v : logits) v = static_cast<float>(rng() % 5) * 0.5f;
    for (auto& v : x) v = static_cast<float>(rng() % 1000) / 500.0f - 1.0f;
    for (auto& v : gate) v = static_cast<float>(rng() % 1000) / 5000.0f - 0.1f;
    logits[5 * n_expert + 3] = std::numeric_limits<float>::quiet_NaN();  // row 5
    std::vector<int32_t> want_ids(n * k);
    std::vector<float> want_w(n * k);
    ref::moe_route(logits.data(), n, n_expert, k, want_ids.data(), want_w.data());
    const bool shared = n_expert <= 512;  // the block kernels take the gate
    auto d_logits = cuda::to_device(logits.data(), logits.size() * 4);
    auto d_x = cuda::to_device(x.data(), x.size() * 4);
    auto d_gate = cuda::to_device(gate.data(), gate.size() * 4);
    auto d_ids = cuda::poisoned(n * k), d_w = cuda::poisoned(n * k), d_scale = cuda::poisoned(n);
    cuda::moe_route(d_logits->f(), n, n_expert, k, static_cast<int32_t*>(d_ids->ptr), d_w->f(),
                    d_x->f(), shared ? d_gate->f() : nullptr, dim, d_scale->f(), nullptr);
    const std::vector<float> w = cuda::to_host(*d_w, n * k), scale = cuda::to_host(*d_scale, n);
    std::vector<int32_t> ids(n * k);
    ASSERT_EQ(cudaMemcpy(ids.data(), d_ids->ptr, n * k * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t r = 0; r < n; ++r) {
      for (int j = 0; j < k; ++j) {
        const int64_t i = r * k + j;
        if (r == 5 && n_expert <= 512) {
          EXPECT_EQ(ids[i], -1) << n_expert << " experts, NaN row, choice " << j;
          EXPECT_TRUE(std::isnan(w[i]));
          continue;
        }
        if (r == 5) continue;  // the generic kernel's NaN handling is not pinned here
        EXPECT_EQ(ids[i], want_ids[i]) << n_expert << " experts, row " << r << " choice " << j;
        EXPECT_NEAR(w[i], want_w[i], 1e-6 * std::fabs(want_w[i])) << n_expert << " row " << r;
      }
      if (shared) {
        double dot = 0;
        for (int64_t i = 0; i < dim; ++i) dot += double(x[r * dim + i]) * gate[i];
        EXPECT_NEAR(scale[r], 1.0 / (1.0 + std::exp(-dot)), 1e-6) << "shared gate, row " << r;
      }
    }
  }
}

// The routing's fast way (QWENRT_CUDA_ROUTE_FAST=1: the top k on the float logits, routing.cuh)
// against the other way and the reference, on rows made to reach both: normal logits (the fast
// way's rows), the top two a float ulp apart, one expert far ahead (the others' probabilities
// tiny but unequal), most probabilities underflowing to 0 (unequal logits, equal probabilities:
// the fast way must hand the row over), denormal logits beside 0, -0 beside +0, few distinct
// values (ties to the lower id), -inf logits, a NaN row. Ids and weights bit for bit between
// the two ways; ids equal to ref::moe_route's and weights within the rounding of its
// differently ordered sum. 2..512 experts, k from 1 to 31 and k equal to the expert count.
TEST(CudaMoe, RouteFastPathMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kKinds = 10;
  for (const auto& [n_expert, k] :
       {std::pair{32, 8}, std::pair{64, 4}, std::pair{128, 8}, std::pair{256, 8}, std::pair{256, 1},
        std::pair{512, 10}, std::pair{512, 31}, std::pair{20, 20}, std::pair{2, 1}}) {
    const int64_t n = 4 * kKinds;
    std::vector<float> logits(n * n_expert);
    for (int64_t r = 0; r < n; ++r) {
      float* l = logits.data() + r * n_expert;
      const int kind = static_cast<int>(r % kKinds);
      for (int e = 0; e < n_expert; ++e) l[e] = normal(rng);
      const int a = static_cast<int>(rng() % n_expert), b = static_cast<int>(rng() % n_expert);
      switch (kind) {
        case 0:
          break;  // normal logits
        case 1:   // the top two a float ulp apart
          l[a] = 6.0f;
          l[b] = std::nextafter(6.0f, 7.0f);
          break;
        case 2:
          l[a] = 60.0f;
          break;  // one far ahead
        case 3:   // most probabilities underflow to 0
          for (int e = 0; e < n_expert; ++e) l[e] = -800.0f - static_cast<float>(rng() % 4000);
          l[a] = 0.0f;
          break;
        case 4:  // denormal logits beside 0, all on top
          for (int e = 0; e < n_expert; ++e) l[e] = -10.0f + 0.1f * normal(rng);
          for (int e = 0; e < std::min(n_expert, 12); ++e) {
            l[(a + e) % n_expert] =
                e % 3 == 0 ? 0.0f : std::numeric_limits<float>::denorm_min() * e;
          }
          break;
        case 5:  // -0 beside +0 on top
          for (int e = 0; e < n_expert; ++e) l[e] = -3.0f - std::fabs(normal(rng));
          for (int e = 0; e < std::min(n_expert, 9); ++e)
            l[(a + e) % n_expert] = e % 2 ? -0.0f : 0.0f;
          break;
        case 6:  // few distinct values: ties at the top-k boundary
          for (int e = 0; e < n_expert; ++e) l[e] = static_cast<float>(rng() % 5) * 0.5f;
          break;
        case 7:  // -inf logits (probability 0) beside finite ones
          for (int e = 0; e < n_expert; e += 2) l[e] = -std::numeric_limits<float>::infinity();
          break;
        case 8:
          l[a] = std::numeric_limits<float>::quiet_NaN();
          break;  // routes nowhere
        default:  // wide logits
          for (int e = 0; e < n_expert; ++e) l[e] *= 30.0f;
          break;
      }
    }
    std::vector<int32_t> want_ids(n * k);
    std::vector<float> want_w(n * k);
    ref::moe_route(logits.data(), n, n_expert, k, want_ids.data(), want_w.data());
    auto d_logits = cuda::to_device(logits.data(), logits.size() * 4);
    const auto route = [&](const char* fast) {
      testing_support::ScopedEnv env("QWENRT_CUDA_ROUTE_FAST", fast);
      EXPECT_EQ(cuda::route_fast(), fast[0] == '1');
      auto d_ids = cuda::poisoned(n * k), d_w = cuda::poisoned(n * k);
      cuda::moe_route(d_logits->f(), n, n_expert, k, static_cast<int32_t*>(d_ids->ptr), d_w->f(),
                      nullptr, nullptr, 0, nullptr, nullptr);
      return std::pair{device_bits(*d_ids, n * k), device_bits(*d_w, n * k)};
    };
    const auto [fast_ids, fast_w] = route("1");
    const auto [slow_ids, slow_w] = route("0");
    const std::string at = std::to_string(n_expert) + " experts, top " + std::to_string(k);
    EXPECT_EQ(fast_ids, slow_ids) << at;
    EXPECT_EQ(fast_w, slow_w) << at;
    for (int64_t r = 0; r < n; ++r) {
      for (int j = 0; j < k; ++j) {
        const int64_t i = r * k + j;
        float w;
        std::memcpy(&w, &fast_w[i], 4);
        if (r % kKinds == 8) {  // the NaN row
          EXPECT_EQ(static_cast<int32_t>(fast_ids[i]), -1) << at << ", NaN row " << r;
          EXPECT_TRUE(std::isnan(w)) << at << ", NaN row " << r;
          continue;
        }
        EXPECT_EQ(static_cast<int32_t>(fast_ids[i]), want_ids[i])
            << at << ", row " << r << " (kind " << r % kKinds << ") choice " << j;
        EXPECT_NEAR(w, want_w[i], 1e-6 * std::fabs(want_w[i])) << at << ", row " << r;
      }
    }
  }
}

// The fused norm and routing kernel (Ops::add_rmsnorm_moe's decode path) against the kernels it
// replaces, on the same device: x and h bit for bit as add_rmsnorm writes them, logits against a
// host double dot of that h, ids, weights and the shared gate bit for bit as moe_route computes
// them from the kernel's own logits; its row counters are zero again after each launch, so a
// second launch (a graph replay) gives the same. Rows 1..16, two widths, 64 and 256 experts.
TEST(CudaMoe, NormFoldedIntoRoutingEqualsTheKernelsItReplaces) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    int64_t dim;
    int n_expert, k;
    bool gate;
  };
  for (const char* split : {"1", "4"}) {  // a warp a router row, or four (opt-in)
    const testing_support::ScopedEnv env("QWENRT_CUDA_ROUTE_SPLIT", split);
    for (const Shape& sh :
         {Shape{2048, 256, 8, true}, Shape{1024, 64, 4, false}, Shape{4096, 256, 8, true}}) {
      for (int64_t n : {1, 2, 7, 16}) {
        const int64_t dim = sh.dim;
        const int n_expert = sh.n_expert, k = sh.k;
        std::vector<float> x(n * dim), delta(n * dim), norm(dim), router(n_expert * dim), gate(dim);
        for (auto& v : x) v = normal(rng);
        for (auto& v : delta) v = normal(rng);
        for (auto& v : norm) v = 1.0f + 0.1f * normal(rng);
        for (auto& v : router) v = 0.05f * normal(rng);
        for (auto& v : gate) v = 0.05f * normal(rng);
        auto d_norm = cuda::to_device(norm.data(), dim * 4);
        auto d_router = cuda::to_device(router.data(), router.size() * 4);
        auto d_gate = cuda::to_device(gate.data(), dim * 4);
        auto d_delta = cuda::to_device(delta.data(), n * dim * 4);
        // The kernels it replaces: add_rmsnorm, then moe_route on our logits.
        auto want_x = cuda::to_device(x.data(), n * dim * 4);
        auto want_h = cuda::poisoned(n * dim);
        cuda::add_rmsnorm(want_x->f(), d_delta->f(), d_norm->f(), want_h->f(), n, dim, 1e-6f,
                          nullptr);
        auto counters = cuda::to_device(std::vector<unsigned>(cuda::kNormRouteMaxRows, 0).data(),
                                        cuda::kNormRouteMaxRows * 4);
        auto got_x = cuda::to_device(x.data(), n * dim * 4);
        auto got_h = cuda::poisoned(n * dim), logits = cuda::poisoned(n * n_expert);
        auto ids = cuda::poisoned(n * k), weights = cuda::poisoned(n * k),
             scale = cuda::poisoned(n);
        cuda::NormRouteArgs a{};
        a.x = got_x->f();
        a.delta = d_delta->f();
        a.norm = d_norm->f();
        a.eps = 1e-6f;
        a.h = got_h->f();
        a.n = n;
        a.dim = dim;
        a.router = d_router->f();
        a.n_expert = n_expert;
        a.k = k;
        a.logits = logits->f();
        a.counters = static_cast<unsigned*>(counters->ptr);
        a.ids = static_cast<int32_t*>(ids->ptr);
        a.weights = weights->f();
        a.gate_inp = sh.gate ? d_gate->f() : nullptr;
        a.shared_scale = scale->f();
        ASSERT_TRUE(cuda::norm_route_fits(a)) << dim << " wide, " << n << " rows";
        cuda::moe_norm_route(a, nullptr);
        auto want_ids = cuda::poisoned(n * k), want_w = cuda::poisoned(n * k);
        auto want_scale = cuda::poisoned(n);
        cuda::moe_route(logits->f(), n, n_expert, k, static_cast<int32_t*>(want_ids->ptr),
                        want_w->f(), want_h->f(), sh.gate ? d_gate->f() : nullptr, dim,
                        want_scale->f(), nullptr);
        const std::string at = std::to_string(dim) + " wide, " + std::to_string(n_expert) +
                               " experts, " + std::to_string(n) + " rows, split " + split;
        EXPECT_EQ(device_bits(*got_x, n * dim), device_bits(*want_x, n * dim)) << "x, " << at;
        EXPECT_EQ(device_bits(*got_h, n * dim), device_bits(*want_h, n * dim)) << "h, " << at;
        EXPECT_EQ(device_bits(*ids, n * k), device_bits(*want_ids, n * k)) << "ids, " << at;
        EXPECT_EQ(device_bits(*weights, n * k), device_bits(*want_w, n * k)) << "weights, " << at;
        if (sh.gate) {
          EXPECT_EQ(device_bits(*scale, n), device_bits(*want_scale, n)) << "shared gate, " << at;
        }
        EXPECT_EQ(device_bits(*counters, cuda::kNormRouteMaxRows),
                  std::vector<uint32_t>(cuda::kNormRouteMaxRows, 0))
            << "counters, " << at;
        const std::vector<float> h = cuda::to_host(*got_h, n * dim);
        const std::vector<float> got_logits = cuda::to_host(*logits, n * n_expert);
        double worst = 0;
        for (int64_t r = 0; r < n; ++r) {
          for (int e = 0; e < n_expert; ++e) {
            double dot = 0, mag = 0;
            for (int64_t i = 0; i < dim; ++i) {
              dot += double(h[r * dim + i]) * router[e * dim + i];
              mag += std::fabs(double(h[r * dim + i]) * router[e * dim + i]);
            }
            worst = std::max(worst, std::fabs(got_logits[r * n_expert + e] - dot) / mag);
          }
        }
        EXPECT_LT(worst, 1e-6) << "logits, " << at;
        // Again on the same buffers (a replay): x moves on by delta once more, the rest follows.
        const std::vector<uint32_t> first_ids = device_bits(*ids, n * k);
        ASSERT_EQ(cudaMemcpy(got_x->ptr, x.data(), n * dim * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
        cuda::moe_norm_route(a, nullptr);
        EXPECT_EQ(device_bits(*got_x, n * dim), device_bits(*want_x, n * dim)) << "x again, " << at;
        EXPECT_EQ(device_bits(*ids, n * k), first_ids) << "ids again, " << at;
      }
    }
  }
}

// Ops::add_rmsnorm_moe on the cuda backend (the fused kernel up to kNormRouteMaxRows rows, the two
// ops above) against add_rmsnorm then moe on the same backend and against the reference.
TEST(CudaMoe, AddRmsnormMoeEqualsItsTwoOps) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(29);
  const MoeCase c{256,  8,           1024,        256,         256,        false,
                  true, DType::Q4_K, DType::Q4_K, DType::Q8_0, DType::Q8_0};
  CaseWeights cw = case_weights(c, rng);
  const MoeWeights& host = cw.host;
  cw.tensors.push_back(quantized_tensor("norm", DType::F32, c.dim, 1, 1, 1.0f, rng));
  const Weight norm_host = cw.tensors.back().w;
  auto ops = make_cuda_ops();
  const MoeWeights dev = placed(*ops, host);
  const Weight norm = ops->place(norm_host);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 3, 16, 17}) {  // 17: past the fused kernel's rows
    const int64_t nd = n * c.dim;
    std::vector<float> x(nd), delta(nd);
    for (auto& v : x) v = normal(rng);
    for (auto& v : delta) v = normal(rng);
    // Reference: x += delta, h = rmsnorm(x) * norm, then the MoE block.
    std::vector<float> ref_x = x, ref_h(nd), want(nd);
    for (int64_t i = 0; i < nd; ++i) ref_x[i] += delta[i];
    ref::rmsnorm(ref_x.data(), ref::f32_data(norm_host), ref_h.data(), n, c.dim, 1e-6f);
    ref::moe_ffn(host, ref_h.data(), want.data(), n, c.n_expert, c.k);
    float* buf[8];
    for (float*& b : buf) b = ops->alloc(nd);
    const std::vector<float> nan(nd, std::numeric_limits<float>::quiet_NaN());
    for (int i : {0, 4}) ops->upload(x.data(), buf[i], nd);
    for (int i : {1, 5}) ops->upload(delta.data(), buf[i], nd);
    for (int i : {2, 3, 6, 7}) ops->upload(nan.data(), buf[i], nd);
    ops->add_rmsnorm(buf[0], buf[1], norm, buf[2], n, c.dim, 1e-6f);
    ops->moe(dev, buf[2], buf[3], n, c.n_expert, c.k);
    ops->add_rmsnorm_moe({buf[4], buf[5], &norm, buf[6], c.dim, 1e-6f}, dev, buf[7], n, c.n_expert,
                         c.k);
    // x, h and out of the two ops (buffers 0, 2, 3) and of the one (4, 6, 7).
    const auto fetch = [&](int i) {
      std::vector<float> v(nd);
      ops->download(buf[i], v.data(), nd);
      return v;
    };
    const std::vector<float> out = fetch(7);
    EXPECT_EQ(fetch(4), fetch(0)) << "x, n=" << n;
    EXPECT_EQ(fetch(6), fetch(2)) << "h, n=" << n;
    // The logits' sums run in another order: weights within float rounding, the same experts.
    EXPECT_LT(rel_l2(out, fetch(3)), 1e-5) << "out, n=" << n;
    EXPECT_LT(rel_l2(out, want), kTol) << "out against the reference, n=" << n;
    EXPECT_LT(rel_l2(fetch(6), ref_h), 1e-6) << "h against the reference, n=" << n;
    ops->reset_workspace();
  }
}

// The routed down with the weighted sum and the shared expert in one launch
// (experts_down_combine) against the two launches it replaces (experts_down_pairs, then
// moe_combine_pairs) on the same inputs: the same int8 activations and weights, the sum over
// the pairs in another order (so within float rounding, not bit for bit). A token with an
// expert id out of range (a NaN route) gives a NaN row; tokens 1..16, Q4_K and Q8_0 downs,
// with and without a shared expert.
TEST(CudaMoe, DownCombinedEqualsDownPairsThenCombine) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n_expert = 32, k = 8;
  const int64_t ff = 512, dim = 1024;
  for (DType t : {DType::Q4_K, DType::Q8_0}) {
    const cuda::HostWeight w = cuda::make_weight(t, ff, dim, n_expert, rng);
    const cuda::PlacedWeight down = cuda::place_weight(w, t == DType::Q8_0);
    for (int64_t n : {1, 3, 16}) {
      for (bool with_shared : {true, false}) {
        std::vector<float> mid(n * k * ff), weights(n * k), shared(n * dim), scale(n);
        std::vector<int32_t> ids(n * k);
        for (auto& v : mid) v = normal(rng);
        for (auto& v : weights) v = 0.25f * std::fabs(normal(rng));
        for (auto& v : shared) v = normal(rng);
        for (auto& v : scale) v = 0.5f + 0.1f * normal(rng);
        for (auto& v : ids) v = static_cast<int32_t>(rng() % n_expert);
        if (n == 3) ids[1 * k + 5] = -1;  // token 1 routes nowhere
        auto d_mid = cuda::to_device(mid.data(), mid.size() * 4);
        auto d_w = cuda::to_device(weights.data(), weights.size() * 4);
        auto d_shared = cuda::to_device(shared.data(), shared.size() * 4);
        auto d_scale = cuda::to_device(scale.data(), scale.size() * 4);
        auto d_ids = cuda::to_device(ids.data(), ids.size() * 4);
        const auto* id_ptr = static_cast<const int32_t*>(d_ids->ptr);
        const float* sh = with_shared ? d_shared->f() : nullptr;
        auto pairs = cuda::poisoned(n * k * dim), want = cuda::poisoned(n * dim);
        auto got = cuda::poisoned(n * dim);
        ASSERT_TRUE(cuda::experts_down_pairs(down.m, id_ptr, k, d_mid->f(), pairs->f(), n, nullptr,
                                             nullptr));
        cuda::moe_combine_pairs(pairs->f(), d_w->f(), k, sh, d_scale->f(), want->f(), n, dim,
                                nullptr);
        ASSERT_TRUE(cuda::experts_down_combine(down.m, id_ptr, d_w->f(), k, d_mid->f(), sh,
                                               d_scale->f(), got->f(), n, nullptr))
            << dtype_name(t);
        const std::vector<float> a = cuda::to_host(*got, n * dim),
                                 b = cuda::to_host(*want, n * dim);
        for (int64_t r = 0; r < n; ++r) {
          const std::vector<float> ga(a.begin() + r * dim, a.begin() + (r + 1) * dim);
          const std::vector<float> gb(b.begin() + r * dim, b.begin() + (r + 1) * dim);
          const std::string at = std::string(dtype_name(t)) + ", " + std::to_string(n) +
                                 " tokens, token " + std::to_string(r) +
                                 (with_shared ? ", shared" : "");
          if (n == 3 && r == 1) {
            for (int64_t i = 0; i < dim; ++i) ASSERT_TRUE(std::isnan(ga[i])) << at << " col " << i;
            continue;
          }
          EXPECT_LT(rel_l2(ga, gb), 1e-5) << at;
        }
      }
    }
  }
}

// A decode row's routed and shared experts in two launches (cuda::moe_row: gate / up beside the
// shared gate / up, then the routed down summed over the pairs beside the shared down, adding
// into out) against the four launches of the two-stream path on the same inputs: the hidden rows
// bit for bit (the same kernel body a row), out within float rounding (the shared expert added
// by a second atomic add, not in the routed store); an expert id out of range gives a NaN row.
// Other pairings are refused (nothing launched).
TEST(CudaMoe, OneDecodeRowInTwoLaunchesEqualsTheTwoStreamPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n_expert = 10, k = 8;
  const int64_t dim = 2048, ff = 512, sff = 512;
  // The one pairing it takes (routed Q4_K, shared Q8_0), then two it leaves to the two-stream
  // path (Q8_0 throughout measured slower; Q4_K throughout not measured).
  const std::tuple<DType, DType, bool> pairings[] = {{DType::Q4_K, DType::Q8_0, true},
                                                     {DType::Q8_0, DType::Q8_0, false},
                                                     {DType::Q4_K, DType::Q4_K, false}};
  for (const auto& [routed, shared_t, taken] : pairings) {
    const bool rq8 = routed == DType::Q8_0, sq8 = shared_t == DType::Q8_0;
    const cuda::PlacedWeight gate =
        cuda::place_weight(cuda::make_weight(routed, dim, ff, n_expert, rng), rq8);
    const cuda::PlacedWeight up =
        cuda::place_weight(cuda::make_weight(routed, dim, ff, n_expert, rng), rq8);
    const cuda::PlacedWeight down =
        cuda::place_weight(cuda::make_weight(routed, ff, dim, n_expert, rng), rq8);
    const cuda::PlacedWeight sg =
        cuda::place_weight(cuda::make_weight(shared_t, dim, sff, 1, rng), sq8);
    const cuda::PlacedWeight su =
        cuda::place_weight(cuda::make_weight(shared_t, dim, sff, 1, rng), sq8);
    const cuda::PlacedWeight sd =
        cuda::place_weight(cuda::make_weight(shared_t, sff, dim, 1, rng), sq8);
    for (bool nan_route : {false, true}) {
      const std::string at = std::string(dtype_name(routed)) + " routed, " +
                             std::string(dtype_name(shared_t)) + " shared" +
                             (nan_route ? ", NaN route" : "");
      std::vector<float> h(dim), weights(k), scale{0.6f};
      std::vector<int32_t> ids(k);
      for (auto& v : h) v = normal(rng);
      for (auto& v : weights) v = 0.25f * std::fabs(normal(rng));
      for (int j = 0; j < k; ++j) ids[j] = static_cast<int32_t>((j * 3 + 1) % n_expert);
      if (nan_route) ids[5] = -1;
      auto d_h = cuda::to_device(h.data(), dim * 4);
      auto d_w = cuda::to_device(weights.data(), k * 4);
      auto d_scale = cuda::to_device(scale.data(), 4);
      auto d_ids = cuda::to_device(ids.data(), k * 4);
      const auto* id_ptr = static_cast<const int32_t*>(d_ids->ptr);
      auto mid = cuda::poisoned(k * ff), smid = cuda::poisoned(sff), out = cuda::poisoned(dim);
      const cuda::MoeRow row{.gate = gate.m,
                             .up = up.m,
                             .down = down.m,
                             .shared_gate = sg.m,
                             .shared_up = su.m,
                             .shared_down = sd.m,
                             .ids = id_ptr,
                             .weights = d_w->f(),
                             .k = k,
                             .h = d_h->f(),
                             .mid = mid->f(),
                             .shared_mid = smid->f(),
                             .shared_scale = d_scale->f(),
                             .out = out->f()};
      if (!taken) {
        EXPECT_FALSE(cuda::moe_row(row, false, nullptr)) << at << ": should keep two streams";
        EXPECT_FALSE(cuda::moe_row(row, true, nullptr)) << at;
        break;
      }
      ASSERT_TRUE(cuda::moe_row(row, false, nullptr)) << at << ": no pair of kernels";
      ASSERT_TRUE(cuda::moe_row(row, true, nullptr)) << at;
      // The two-stream path's launches, one after another.
      const int64_t ws_bytes =
          std::max({cuda::matmul_workspace_bytes(gate.m, k), cuda::matmul_workspace_bytes(sd.m, 1),
                    cuda::matmul_swiglu_workspace_bytes(sg.m, 1)});
      auto ws = std::make_unique<cuda::DeviceBuffer>(ws_bytes);
      auto want_mid = cuda::poisoned(k * ff), want_smid = cuda::poisoned(sff);
      auto sout = cuda::poisoned(dim), want = cuda::poisoned(dim);
      cuda::experts_swiglu(gate.m, up.m, id_ptr, k, d_h->f(), want_mid->f(), 1, ws->ptr, nullptr);
      cuda::matmul_swiglu(sg.m, su.m, d_h->f(), want_smid->f(), 1, ws->ptr, nullptr);
      cuda::matmul(sd.m, want_smid->f(), sout->f(), 1, ws->ptr, nullptr);
      ASSERT_TRUE(cuda::experts_down_combine(down.m, id_ptr, d_w->f(), k, want_mid->f(), sout->f(),
                                             d_scale->f(), want->f(), 1, nullptr))
          << at;
      const auto bits = [](const std::vector<float>& v) {
        std::vector<uint32_t> b(v.size());
        std::memcpy(b.data(), v.data(), v.size() * 4);
        return b;
      };
      const std::vector<float> got_mid = cuda::to_host(*mid, k * ff);
      const std::vector<float> got_out = cuda::to_host(*out, dim);
      EXPECT_EQ(bits(got_mid), bits(cuda::to_host(*want_mid, k * ff))) << at << ": routed hidden";
      EXPECT_EQ(bits(cuda::to_host(*smid, sff)), bits(cuda::to_host(*want_smid, sff)))
          << at << ": shared hidden";
      if (nan_route) {
        for (int64_t i = 0; i < dim; ++i) ASSERT_TRUE(std::isnan(got_out[i])) << at << " col " << i;
        continue;
      }
      EXPECT_LT(rel_l2(got_out, cuda::to_host(*want, dim)), 1e-6) << at;
      // Out again: the second launch adds into what the first zeroed, so a rerun gives the same.
      ASSERT_TRUE(cuda::moe_row(row, true, nullptr)) << at;
      EXPECT_EQ(bits(cuda::to_host(*out, dim)), bits(got_out)) << at << ": a second run";
    }
  }
}

// Experts [in, out, n_mat] of `distinct` random ones repeated (a router over many experts without
// quantising them all).
cuda::HostWeight tiled_experts(DType t, int64_t in, int64_t out, int64_t n_mat, int64_t distinct,
                               std::mt19937& rng) {
  cuda::HostWeight w = cuda::make_weight(t, in, out, distinct, rng);
  const std::vector<uint8_t> one = w.bytes;
  w.bytes.clear();
  for (int64_t i = 0; i < n_mat / distinct; ++i)
    w.bytes.insert(w.bytes.end(), one.begin(), one.end());
  w.view = TensorView::contiguous(t, 3, {in, out, n_mat, 1}, w.bytes.data());
  return w;
}

// A decode row's whole MoE FFN in one launch (moe_fused.cu: the FFN input's add and norm, the
// router, the routing, both experts' gate / up and down) against the launches it replaces
// (moe_norm_route, then the row's two launches) on the same inputs: x, h, logits, ids, weights,
// the shared gate, both hidden rows and out bit for bit (the same arithmetic a value); the
// barriers' counters zero again after a launch, so a second launch (a graph replay) gives the
// same; a NaN in the row routes nowhere in both. The 35B-A3B's shapes (2048 wide, 256 experts,
// 8 a token, experts 512 wide, routed Q4_K, shared Q8_0; the only width the two-launch path
// takes). The fused kernel is off by default (QWENRT_CUDA_MOE_FUSED=1 here).
TEST(CudaMoe, FusedDecodeRowEqualsTheLaunchesItReplaces) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n_expert = 256, k = 8;
  const int64_t ff = 512, sff = 512;
  testing_support::ScopedEnv fused("QWENRT_CUDA_MOE_FUSED", "1");
  const int64_t dim = 2048;
  const cuda::PlacedWeight gate =
      cuda::place_weight(tiled_experts(DType::Q4_K, dim, ff, n_expert, 8, rng), false);
  const cuda::PlacedWeight up =
      cuda::place_weight(tiled_experts(DType::Q4_K, dim, ff, n_expert, 8, rng), false);
  const cuda::PlacedWeight down =
      cuda::place_weight(tiled_experts(DType::Q4_K, ff, dim, n_expert, 8, rng), false);
  const cuda::PlacedWeight sg =
      cuda::place_weight(cuda::make_weight(DType::Q8_0, dim, sff, 1, rng), true);
  const cuda::PlacedWeight su =
      cuda::place_weight(cuda::make_weight(DType::Q8_0, dim, sff, 1, rng), true);
  const cuda::PlacedWeight sd =
      cuda::place_weight(cuda::make_weight(DType::Q8_0, sff, dim, 1, rng), true);
  std::vector<float> norm(dim), router(n_expert * dim), gate_inp(dim);
  for (auto& v : norm) v = 1.0f + 0.1f * normal(rng);
  for (auto& v : router) v = 0.05f * normal(rng);
  for (auto& v : gate_inp) v = 0.05f * normal(rng);
  auto d_norm = cuda::to_device(norm.data(), dim * 4);
  auto d_router = cuda::to_device(router.data(), router.size() * 4);
  auto d_gate_inp = cuda::to_device(gate_inp.data(), dim * 4);
  for (bool nan_row : {false, true}) {
    std::vector<float> x(dim), delta(dim);
    for (auto& v : x) v = normal(rng);
    for (auto& v : delta) v = normal(rng);
    if (nan_row) delta[77] = std::numeric_limits<float>::quiet_NaN();
    auto d_delta = cuda::to_device(delta.data(), dim * 4);
    // One path's buffers and arguments.
    struct Path {
      std::unique_ptr<cuda::DeviceBuffer> x, h, logits, ids, weights, scale, counters, mid, smid,
          out;
      cuda::NormRouteArgs a{};
      cuda::MoeRow row{};
    };
    const auto make_path = [&]() {
      Path p;
      p.x = cuda::to_device(x.data(), dim * 4);
      p.h = cuda::poisoned(dim);
      p.logits = cuda::poisoned(n_expert);
      p.ids = cuda::poisoned(k);
      p.weights = cuda::poisoned(k);
      p.scale = cuda::poisoned(1);
      p.counters = cuda::to_device(std::vector<unsigned>(cuda::kNormRouteMaxRows, 0).data(),
                                   cuda::kNormRouteMaxRows * 4);
      p.mid = cuda::poisoned(k * ff);
      p.smid = cuda::poisoned(sff);
      p.out = cuda::poisoned(dim);
      p.a.x = p.x->f();
      p.a.delta = d_delta->f();
      p.a.norm = d_norm->f();
      p.a.eps = 1e-6f;
      p.a.h = p.h->f();
      p.a.n = 1;
      p.a.dim = dim;
      p.a.router = d_router->f();
      p.a.n_expert = n_expert;
      p.a.k = k;
      p.a.logits = p.logits->f();
      p.a.counters = static_cast<unsigned*>(p.counters->ptr);
      p.a.ids = static_cast<int32_t*>(p.ids->ptr);
      p.a.weights = p.weights->f();
      p.a.gate_inp = d_gate_inp->f();
      p.a.shared_scale = p.scale->f();
      p.row = cuda::MoeRow{.gate = gate.m,
                           .up = up.m,
                           .down = down.m,
                           .shared_gate = sg.m,
                           .shared_up = su.m,
                           .shared_down = sd.m,
                           .ids = p.a.ids,
                           .weights = p.a.weights,
                           .k = k,
                           .h = p.a.h,
                           .mid = p.mid->f(),
                           .shared_mid = p.smid->f(),
                           .shared_scale = p.a.shared_scale,
                           .out = p.out->f()};
      return p;
    };
    const std::string at = std::to_string(dim) + " wide" + (nan_row ? ", a NaN in the row" : "");
    Path want = make_path();
    cuda::moe_norm_route(want.a, nullptr);
    ASSERT_TRUE(cuda::moe_row(want.row, true, nullptr)) << at;
    Path got = make_path();
    ASSERT_TRUE(cuda::moe_row(got.row, false, nullptr, &got.a)) << at << ": no fused kernel";
    ASSERT_TRUE(cuda::moe_row(got.row, true, nullptr, &got.a)) << at;
    EXPECT_EQ(device_bits(*got.x, dim), device_bits(*want.x, dim)) << at << ": x";
    EXPECT_EQ(device_bits(*got.h, dim), device_bits(*want.h, dim)) << at << ": h";
    EXPECT_EQ(device_bits(*got.logits, n_expert), device_bits(*want.logits, n_expert))
        << at << ": logits";
    EXPECT_EQ(device_bits(*got.ids, k), device_bits(*want.ids, k)) << at << ": ids";
    EXPECT_EQ(device_bits(*got.weights, k), device_bits(*want.weights, k)) << at << ": weights";
    EXPECT_EQ(device_bits(*got.scale, 1), device_bits(*want.scale, 1)) << at << ": shared gate";
    EXPECT_EQ(device_bits(*got.mid, k * ff), device_bits(*want.mid, k * ff))
        << at << ": routed hidden";
    EXPECT_EQ(device_bits(*got.smid, sff), device_bits(*want.smid, sff)) << at << ": shared hidden";
    const std::vector<float> out = cuda::to_host(*got.out, dim);
    if (nan_row) {
      for (int64_t i = 0; i < dim; ++i) ASSERT_TRUE(std::isnan(out[i])) << at << " col " << i;
      const std::vector<uint32_t> none(k, 0xffffffffu);  // ids -1
      EXPECT_EQ(device_bits(*got.ids, k), none) << at << ": routes nowhere";
    } else {
      EXPECT_EQ(device_bits(*got.out, dim), device_bits(*want.out, dim)) << at << ": out";
      const float mag = std::fabs(out[0]) + std::fabs(out[dim / 2]);
      EXPECT_TRUE(std::isfinite(mag) && mag > 0) << at << ": out is " << out[0];
    }
    EXPECT_EQ(device_bits(*got.counters, cuda::kNormRouteMaxRows),
              std::vector<uint32_t>(cuda::kNormRouteMaxRows, 0))
        << at << ": counters";
    // Again on the same buffers (a replay): x back to its start, the same results.
    ASSERT_EQ(cudaMemcpy(got.x->ptr, x.data(), dim * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(cuda::moe_row(got.row, true, nullptr, &got.a)) << at;
    EXPECT_EQ(device_bits(*got.x, dim), device_bits(*want.x, dim)) << at << ": x again";
    EXPECT_EQ(device_bits(*got.out, dim), device_bits(*want.out, dim)) << at << ": out again";
  }
}

}  // namespace
}  // namespace qwenrt::ops
