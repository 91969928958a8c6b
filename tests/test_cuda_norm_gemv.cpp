// A decode row's input norm formed inside the one-row GEMV that follows it (ops/cuda
// gemv_resident.cu with ResidentArgs::norm_w: matmul_group_norm, matmul_swiglu_norm; the cuda
// backend's add_rmsnorm_matmuls and add_rmsnorm_ffn_swiglu) against add_rmsnorm, then the plain
// launcher, on the same inputs: x, h and every output bit for bit (the same norm arithmetic,
// norm_row.cuh, and the same GEMV), and against the reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "support/cuda_matmul.h"
#include "support/scoped_env.h"
#include "support/weights.h"

namespace qwenrt::ops::cuda {
namespace {

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

std::vector<float> norm_weight(int64_t dim, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  std::vector<float> w(dim);
  for (auto& v : w) v = u(rng);
  return w;
}

// The inputs of one norm in front of a GEMV, twice on the device (one copy for each path).
struct NormCase {
  int64_t dim;
  std::vector<float> x, delta, w;
  std::unique_ptr<DeviceBuffer> x_a, x_b, d, dw, h_a, h_b, counter;
  NormCase(int64_t n, std::mt19937& rng)
      : dim(n), x(random_floats(n, rng)), delta(random_floats(n, rng)), w(norm_weight(n, rng)) {
    x_a = to_device(x.data(), dim * 4);
    x_b = to_device(x.data(), dim * 4);
    d = to_device(delta.data(), dim * 4);
    dw = to_device(w.data(), dim * 4);
    h_a = poisoned(dim);
    h_b = poisoned(dim);
    const uint32_t zero = 0;
    counter = to_device(&zero, 4);
  }
  NormIn norm_b() const {
    return {.x = x_b->f(),
            .delta = d->f(),
            .weight = dw->f(),
            .h = h_b->f(),
            .eps = 1e-6f,
            .counter = static_cast<unsigned*>(counter->ptr)};
  }
  // The reference's x + delta and h.
  std::vector<float> ref_h() const {
    std::vector<float> s(x), h(dim);
    for (int64_t i = 0; i < dim; ++i) s[i] += delta[i];
    ref::rmsnorm(s.data(), w.data(), h.data(), 1, dim, 1e-6f);
    return h;
  }
  uint32_t counter_value() const {
    uint32_t v = 1;
    cudaMemcpy(&v, counter->ptr, 4, cudaMemcpyDeviceToHost);
    return v;
  }
};

// The resident types (Q8_0 as the backend places it), rows of every width the norm layout takes
// (1..8 float4s a thread of 256), each with the streamed kernel (sm_90, rows of 5120 and more) and
// without it; a group of three projections and a SwiGLU pair; two launches in a row on the same
// counter (the second starts from the first's x).
TEST(CudaMatmulLaunchers, NormInGemvEqualsAddRmsnormThenGemv) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  const struct {
    DType type;
    bool q8s;
    const char* name;
  } types[] = {{DType::Q8_0, true, "Q8_0 superblocks"},
               {DType::Q4_K, false, "Q4_K"},
               {DType::Q5_K, false, "Q5_K"}};
  for (const auto& t : types) {
    for (int64_t dim : {1024, 2048, 3072, 5120, 8192}) {
      for (const char* stream : {"1", "0"}) {
        const testing_support::ScopedEnv env("QWENRT_CUDA_STREAM", stream);
        const std::string at =
            std::string(t.name) + " dim=" + std::to_string(dim) + " stream=" + stream;
        NormCase c(dim, rng);
        const int64_t outs[] = {515, 64, 7};
        std::vector<HostWeight> hw;
        std::vector<PlacedWeight> pw;
        for (int64_t out : outs) {
          hw.push_back(make_weight(t.type, dim, out, 1, rng));
          pw.push_back(place_weight(hw.back(), t.q8s));
        }
        std::vector<std::unique_ptr<DeviceBuffer>> y_a, y_b;
        Projection pa[3], pb[3];
        for (int i = 0; i < 3; ++i) {
          y_a.push_back(poisoned(outs[i]));
          y_b.push_back(poisoned(outs[i]));
          pa[i] = {pw[i].m, y_a[i]->f()};
          pb[i] = {pw[i].m, y_b[i]->f()};
        }
        DeviceBuffer ws(std::max<int64_t>(16, matmul_group_workspace_bytes(pa, 3, 1)));
        for (int round = 0; round < 2; ++round) {
          const std::string here = at + " round " + std::to_string(round);
          add_rmsnorm(c.x_a->f(), c.d->f(), c.dw->f(), c.h_a->f(), 1, dim, 1e-6f, nullptr);
          matmul_group(pa, 3, c.h_a->f(), 1, ws.ptr, nullptr);
          ASSERT_TRUE(matmul_group_norm(pb, 3, c.norm_b(), nullptr, false, nullptr)) << here;
          ASSERT_TRUE(matmul_group_norm(pb, 3, c.norm_b(), ws.ptr, true, nullptr)) << here;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << here;
          EXPECT_EQ(bits(to_host(*c.x_b, dim)), bits(to_host(*c.x_a, dim))) << "x, " << here;
          EXPECT_EQ(bits(to_host(*c.h_b, dim)), bits(to_host(*c.h_a, dim))) << "h, " << here;
          for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(bits(to_host(*y_b[i], outs[i])), bits(to_host(*y_a[i], outs[i])))
                << "y" << i << ", " << here;
          }
          EXPECT_EQ(c.counter_value(), 0u) << here;
          if (round == 0) {
            EXPECT_LT(rel_l2(to_host(*c.h_b, dim), c.ref_h()), 1e-6) << at;
            const std::vector<float> h = c.ref_h();
            std::vector<float> want(outs[0]);
            ref::matmul(Weight{"w", hw[0].view}, h.data(), want.data(), 1);
            EXPECT_LT(scaled_max_err(to_host(*y_b[0], outs[0]), want, h, hw[0], 1, dim, outs[0]),
                      scaled_tol(t.type))
                << at;
          }
        }
        // The SwiGLU pair (gate and up rows side by side) on the same norm.
        const int64_t ff = 1536;
        const HostWeight g = make_weight(t.type, dim, ff, 1, rng);
        const HostWeight u = make_weight(t.type, dim, ff, 1, rng);
        const PlacedWeight pg = place_weight(g, t.q8s), pu = place_weight(u, t.q8s);
        auto s_a = poisoned(ff), s_b = poisoned(ff);
        DeviceBuffer ws2(std::max<int64_t>(16, matmul_swiglu_workspace_bytes(pg.m, 1)));
        add_rmsnorm(c.x_a->f(), c.d->f(), c.dw->f(), c.h_a->f(), 1, dim, 1e-6f, nullptr);
        matmul_swiglu(pg.m, pu.m, c.h_a->f(), s_a->f(), 1, ws2.ptr, nullptr);
        ASSERT_TRUE(matmul_swiglu_norm(pg.m, pu.m, c.norm_b(), s_b->f(), ws2.ptr, true, nullptr))
            << at;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << at;
        EXPECT_EQ(bits(to_host(*c.x_b, dim)), bits(to_host(*c.x_a, dim))) << "swiglu x, " << at;
        EXPECT_EQ(bits(to_host(*c.h_b, dim)), bits(to_host(*c.h_a, dim))) << "swiglu h, " << at;
        EXPECT_EQ(bits(to_host(*s_b, ff)), bits(to_host(*s_a, ff))) << "swiglu y, " << at;
        EXPECT_EQ(c.counter_value(), 0u) << at;
      }
    }
  }
}

// Where the fused launch does not apply it launches nothing and says so: a row width the norm
// layout does not take (1280: not a multiple of 1024; 9216: over 8192), a type without a
// resident kernel (Q6_K), projections of different types.
TEST(CudaMatmulLaunchers, NormInGemvDeclinesWhatItCannotTake) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(43);
  const auto declines = [&](int64_t dim, DType a, DType b) {
    NormCase c(dim, rng);
    const HostWeight w1 = make_weight(a, dim, 96, 1, rng), w2 = make_weight(b, dim, 32, 1, rng);
    const PlacedWeight p1 = place_weight(w1, a == DType::Q8_0),
                       p2 = place_weight(w2, b == DType::Q8_0);
    auto y1 = poisoned(96), y2 = poisoned(32), s = poisoned(96);
    const Projection p[2] = {{p1.m, y1->f()}, {p2.m, y2->f()}};
    DeviceBuffer ws(std::max<int64_t>(16, matmul_group_workspace_bytes(p, 2, 1)));
    const bool group = matmul_group_norm(p, 2, c.norm_b(), ws.ptr, true, nullptr);
    const bool swiglu =
        a == b && matmul_swiglu_norm(p1.m, p1.m, c.norm_b(), s->f(), ws.ptr, true, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(bits(to_host(*c.x_b, dim)), bits(c.x)) << "x written, dim=" << dim;
    for (float v : to_host(*y1, 96)) EXPECT_TRUE(std::isnan(v)) << "y written, dim=" << dim;
    return !group && !swiglu;
  };
  EXPECT_TRUE(declines(1280, DType::Q8_0, DType::Q8_0));
  EXPECT_TRUE(declines(9216, DType::Q4_K, DType::Q4_K));
  EXPECT_TRUE(declines(2048, DType::Q6_K, DType::Q6_K));
  EXPECT_TRUE(declines(2048, DType::Q4_K, DType::Q8_0));
}

// The cuda backend's fused ops (QWENRT_CUDA_NORM_GEMV=1) against its two ops (add_rmsnorm, then
// matmuls / ffn_swiglu): one row takes the fused launch, three rows the two ops themselves; both
// equal bit for bit, and the dense FFN's output near the reference.
TEST(CudaMatmulLaunchers, AddRmsnormMatmulsAndFfnEqualTheirTwoOps) {
  if (!qwenrt::ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  using testing_support::quantized_tensor;
  std::mt19937 rng(47);
  const int64_t dim = 2048, ff = 1024;
  std::vector<testing_support::QuantTensor> t;
  t.push_back(quantized_tensor("norm", DType::F32, dim, 1, 1, 1.0f, rng));
  t.push_back(quantized_tensor("q", DType::Q8_0, dim, 768, 1, 0.05f, rng));
  t.push_back(quantized_tensor("k", DType::Q8_0, dim, 256, 1, 0.05f, rng));
  t.push_back(quantized_tensor("gate", DType::Q4_K, dim, ff, 1, 0.05f, rng));
  t.push_back(quantized_tensor("up", DType::Q4_K, dim, ff, 1, 0.05f, rng));
  t.push_back(quantized_tensor("down", DType::Q6_K, ff, dim, 1, 0.05f, rng));
  const testing_support::ScopedEnv on("QWENRT_CUDA_NORM_GEMV", "1");  // opt-in for now
  auto ops = make_cuda_ops();
  std::vector<Weight> w;
  for (const auto& q : t) w.push_back(ops->place(q.w));
  for (int64_t n : {1, 3}) {
    const int64_t nd = n * dim;
    const std::vector<float> x = random_floats(nd, rng), delta = random_floats(nd, rng);
    float* buf[12];
    for (float*& b : buf) b = ops->alloc(n * 1024 + nd);
    const std::vector<float> nan(n * 1024 + nd, kNaN);
    for (float* b : buf) ops->upload(nan.data(), b, n * 1024 + nd);
    for (int i : {0, 6}) ops->upload(x.data(), buf[i], nd);
    for (int i : {1, 7}) ops->upload(delta.data(), buf[i], nd);
    const auto fetch = [&](int i, int64_t count) {
      std::vector<float> v(count);
      ops->download(buf[i], v.data(), count);
      return bits(v);
    };
    // Projections: buffers 0..4 by the two ops, 6..10 by the one.
    ops->add_rmsnorm(buf[0], buf[1], w[0], buf[2], n, dim, 1e-6f);
    const Ops::Projection two[] = {{&w[1], buf[3]}, {&w[2], buf[4]}};
    ops->matmuls(buf[2], n, two);
    const Ops::Projection one[] = {{&w[1], buf[9]}, {&w[2], buf[10]}};
    ops->add_rmsnorm_matmuls({buf[6], buf[7], &w[0], buf[8], dim, 1e-6f}, n, one);
    EXPECT_EQ(fetch(6, nd), fetch(0, nd)) << "x, n=" << n;
    EXPECT_EQ(fetch(8, nd), fetch(2, nd)) << "h, n=" << n;
    EXPECT_EQ(fetch(9, n * 768), fetch(3, n * 768)) << "q, n=" << n;
    EXPECT_EQ(fetch(10, n * 256), fetch(4, n * 256)) << "k, n=" << n;
    // The dense FFN on top of the same x: out into buffers 5 and 11.
    ops->add_rmsnorm(buf[0], buf[1], w[0], buf[2], n, dim, 1e-6f);
    ops->ffn_swiglu(w[3], w[4], w[5], buf[2], buf[5], n);
    ops->add_rmsnorm_ffn_swiglu({buf[6], buf[7], &w[0], buf[8], dim, 1e-6f}, w[3], w[4], w[5],
                                buf[11], n);
    EXPECT_EQ(fetch(6, nd), fetch(0, nd)) << "ffn x, n=" << n;
    EXPECT_EQ(fetch(8, nd), fetch(2, nd)) << "ffn h, n=" << n;
    EXPECT_EQ(fetch(11, nd), fetch(5, nd)) << "ffn out, n=" << n;
    // Against the reference: x + 2 delta, its norm, the FFN.
    std::vector<float> rx(x), rh(nd), want(nd), mid_g(n * ff), mid_u(n * ff);
    for (int64_t i = 0; i < nd; ++i) rx[i] = (rx[i] + delta[i]) + delta[i];
    ref::rmsnorm(rx.data(), ref::f32_data(t[0].w), rh.data(), n, dim, 1e-6f);
    ref::matmul(t[3].w, rh.data(), mid_g.data(), n);
    ref::matmul(t[4].w, rh.data(), mid_u.data(), n);
    const std::vector<float> mid = silu_mul_ref(mid_g, mid_u);
    ref::matmul(t[5].w, mid.data(), want.data(), n);
    std::vector<float> got(nd);
    ops->download(buf[11], got.data(), nd);
    EXPECT_LT(rel_l2(got, want), 3e-2) << "ffn out against the reference, n=" << n;
    ops->reset_workspace();
  }
}

}  // namespace
}  // namespace qwenrt::ops::cuda
