// The CUDA backend's elementwise and norm ops (ops/cuda/elementwise.cu through make_cuda_ops())
// against ops::ref on fresh random inputs: rmsnorm on short (one warp per row) and long (one block
// per row) rows, in place too; add_rmsnorm; rope at scattered positions with n_rot < head_dim and
// a token stride past the heads; attention_heads (the fused head prologue) against the reference
// sequence and bit for bit against the unfused ops; silu_mul / add on aligned (float4) and
// unaligned sizes and pointers; sigmoid_mul with a gate stride; copy_2d; gather_output_rows.
// Outputs start as NaN so an unwritten element fails; elements an op must not touch are compared
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "support/model_files.h"
#include "support/op_data.h"

namespace qwenrt::ops {
namespace {

std::string sci(double x) {
  return fmt::format("{:.2e}", x);
}

using testing_support::rel_l2;

using testing_support::randn;

// One backend for every test of this file, never destroyed (tearing a CUDA context down after
// main returns is not worth the trouble); each test resets its workspace.
Ops& gpu() {
  static Ops* ops = make_cuda_ops().release();
  return *ops;
}

// Device copies of host data, and back. `pad` extra floats in front let a test hand the op a
// pointer that is not 16-byte aligned.
float* to_device(const std::vector<float>& host, int64_t pad = 0) {
  float* p = gpu().alloc(static_cast<int64_t>(host.size()) + pad) + pad;
  gpu().upload(host.data(), p, static_cast<int64_t>(host.size()));
  return p;
}
std::vector<float> to_host(const float* device, size_t n) {
  std::vector<float> host(n);
  gpu().download(device, host.data(), static_cast<int64_t>(n));
  return host;
}
std::vector<float> nans(size_t n) {
  return std::vector<float>(n, NAN);
}

Weight f32_weight(const std::vector<float>& data) {
  return Weight{.name = "test.weight",
                .view = TensorView::contiguous(
                    DType::F32, 1, {static_cast<int64_t>(data.size()), 1, 1, 1}, data.data())};
}

// A step whose row i is slot i's single token at positions[i] (what rope and the row gathers
// read), with a dummy page table; the arrays live as long as this object.
struct OneRowSpans {
  std::vector<int32_t> tokens, positions, output_rows, page_tables;
  std::vector<Span> spans;
  StepLayout layout() const {
    return {.tokens = tokens.data(),
            .positions = positions.data(),
            .n = static_cast<int64_t>(tokens.size()),
            .spans = spans.data(),
            .n_spans = static_cast<int>(spans.size()),
            .output_rows = output_rows.data(),
            .n_output_rows = static_cast<int64_t>(output_rows.size()),
            .page_tables = page_tables.data(),
            .page_table_stride = 1};
  }
};
OneRowSpans one_row_spans(const std::vector<int32_t>& positions,
                          const std::vector<int32_t>& output_rows) {
  OneRowSpans s{.tokens = std::vector<int32_t>(positions.size(), 0),
                .positions = positions,
                .output_rows = output_rows,
                .page_tables = std::vector<int32_t>(positions.size(), 0)};
  for (size_t i = 0; i < positions.size(); ++i) {
    const int32_t row = static_cast<int32_t>(i);
    s.spans.push_back({.slot = row, .begin = row, .count = 1, .n_past = positions[i]});
  }
  return s;
}

// One case: the op, its shape and one op-specific number.
struct EwCase {
  std::string op;  // rmsnorm | rmsnorm_inplace | add_rmsnorm | rope | silu_mul | silu_mul_alias |
                   // sigmoid_mul | add | copy_2d | gather
  int64_t rows, dim;
  int extra;  // rope: n_rot; sigmoid_mul / copy_2d: extra stride; silu_mul / add: pointer pad
};

class CudaElementwise : public ::testing::TestWithParam<EwCase> {};

TEST_P(CudaElementwise, MatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const EwCase c = GetParam();
  Ops& ops = gpu();
  ops.reset_workspace();
  std::mt19937_64 rng(c.rows * 131 + c.dim * 7 + c.extra + c.op.size());
  const int64_t n = c.rows * c.dim;
  const float eps = 1e-6f;
  std::vector<float> got, want;
  // fp32 sums of squares over <= 8192 elements against ref's double ones: ~1e-7 relative; the
  // transcendental ops (expf) differ from the host's by an ulp or two.
  double tol = 2e-6;
  if (c.op == "rmsnorm" || c.op == "rmsnorm_inplace") {
    const auto x = randn(n, rng, 3.0f), w = randn(c.dim, rng);
    const Weight weight = ops.place(f32_weight(w));
    float* dx = to_device(x);
    float* dout = c.op == "rmsnorm" ? to_device(nans(n)) : dx;
    ops.rmsnorm(dx, weight, dout, c.rows, c.dim, eps);
    got = to_host(dout, n);
    want = nans(n);
    ref::rmsnorm(x.data(), w.data(), want.data(), c.rows, c.dim, eps);
    if (c.op == "rmsnorm") {
      EXPECT_EQ(to_host(dx, n), x);  // the input is left alone
    }
  } else if (c.op == "add_rmsnorm") {
    const auto x = randn(n, rng), delta = randn(n, rng), w = randn(c.dim, rng);
    const Weight weight = ops.place(f32_weight(w));
    float* dx = to_device(x);
    float* dout = to_device(nans(n));
    ops.add_rmsnorm(dx, to_device(delta), weight, dout, c.rows, c.dim, eps);
    std::vector<float> sum = x;
    for (int64_t i = 0; i < n; ++i) sum[i] += delta[i];
    EXPECT_EQ(to_host(dx, n), sum);  // the residual sum is one float add per element: exact
    got = to_host(dout, n);
    want = nans(n);
    ref::rmsnorm(sum.data(), w.data(), want.data(), c.rows, c.dim, eps);
  } else if (c.op == "rope") {
    const int n_heads = 3, n_rot = c.extra, head_dim = static_cast<int>(c.dim);
    const int64_t token_stride = int64_t{n_heads} * head_dim + 5;  // 5 floats no head owns
    const auto x = randn(c.rows * token_stride, rng);
    std::vector<int32_t> pos(c.rows);
    std::uniform_int_distribution<int32_t> p(0, 300000);
    for (auto& v : pos) v = p(rng);
    const OneRowSpans step = one_row_spans(pos, {});
    ops.begin_step(step.layout());
    float* dx = to_device(x);
    ops.rope_neox(dx, n_heads, head_dim, token_stride, n_rot, 1e7f);
    got = to_host(dx, x.size());
    want = x;
    ref::rope_neox(want.data(), pos.data(), c.rows, n_heads, head_dim, token_stride, n_rot, 1e7f);
    // Both form the angle and rotate in double; only the libraries' pow / sincos differ.
    tol = 1e-6;
    for (int64_t t = 0; t < c.rows; ++t) {  // unrotated dims and the row gap: bit-identical
      for (int64_t i = 0; i < token_stride; ++i) {
        const bool rotated = i < int64_t{n_heads} * head_dim && i % head_dim < n_rot;
        if (!rotated) {
          ASSERT_EQ(got[t * token_stride + i], x[t * token_stride + i]) << t << " " << i;
        }
      }
    }
  } else if (c.op == "attention_heads") {
    // n tokens of 5 query heads (query and gate halves) and 2 key heads; the fused kernel against
    // the reference sequence, and bit for bit against this backend's unfused ops.
    const int n_head = 5, n_head_kv = 2, hd = static_cast<int>(c.dim), n_rot = c.extra;
    const int64_t nq = c.rows * n_head * hd, nk = c.rows * n_head_kv * hd;
    const auto q_gate = randn(2 * nq, rng, 3.0f), k = randn(nk, rng), qw = randn(hd, rng),
               kw = randn(hd, rng);
    std::vector<int32_t> pos(c.rows);
    std::uniform_int_distribution<int32_t> p(0, 300000);
    for (auto& v : pos) v = p(rng);
    const OneRowSpans step = one_row_spans(pos, {});
    ops.begin_step(step.layout());
    const Weight q_norm = ops.place(f32_weight(qw)), k_norm = ops.place(f32_weight(kw));
    auto run = [&](bool fused) {
      Ops::AttentionHeadsArgs a{.q_gate = to_device(q_gate),
                                .q_norm = &q_norm,
                                .k_norm = &k_norm,
                                .q = to_device(nans(nq)),
                                .gate = to_device(nans(nq)),
                                .k = to_device(k),
                                .n = c.rows,
                                .n_head = n_head,
                                .n_head_kv = n_head_kv,
                                .head_dim = hd,
                                .n_rot = n_rot,
                                .rope_theta = 1e7f,
                                .eps = eps};
      if (fused) {
        ops.attention_heads(a);
      } else {
        ops.Ops::attention_heads(a);
      }
      std::vector<float> out = to_host(a.q, nq), g = to_host(a.gate, nq), kk = to_host(a.k, nk);
      out.insert(out.end(), g.begin(), g.end());
      out.insert(out.end(), kk.begin(), kk.end());
      return out;
    };
    got = run(true);
    EXPECT_EQ(got, run(false)) << "the fused kernel equals the unfused ops bit for bit";
    std::vector<float> q(nq), g(nq), kr = k;
    for (int64_t r = 0; r < c.rows * n_head; ++r) {
      std::copy_n(q_gate.begin() + r * 2 * hd, hd, q.begin() + r * hd);
      std::copy_n(q_gate.begin() + r * 2 * hd + hd, hd, g.begin() + r * hd);
    }
    ref::rmsnorm(q.data(), qw.data(), q.data(), c.rows * n_head, hd, eps);
    ref::rmsnorm(kr.data(), kw.data(), kr.data(), c.rows * n_head_kv, hd, eps);
    ref::rope_neox(q.data(), pos.data(), c.rows, n_head, hd, n_head * hd, n_rot, 1e7f);
    ref::rope_neox(kr.data(), pos.data(), c.rows, n_head_kv, hd, n_head_kv * hd, n_rot, 1e7f);
    want = q;
    want.insert(want.end(), g.begin(), g.end());
    want.insert(want.end(), kr.begin(), kr.end());
    tol = 2e-6;
  } else if (c.op == "silu_mul" || c.op == "silu_mul_alias") {
    const auto g = randn(n, rng, 4.0f), u = randn(n, rng);
    float* dg = to_device(g, c.extra);
    float* du = to_device(u, c.extra);
    float* dout = c.op == "silu_mul" ? to_device(nans(n), c.extra) : dg;  // out may alias gate
    ops.silu_mul(dg, du, dout, n);
    got = to_host(dout, n);
    want = nans(n);
    ref::silu_mul(g.data(), u.data(), want.data(), n);
  } else if (c.op == "add") {
    const auto a = randn(n, rng), b = randn(n, rng);
    float* dout = to_device(nans(n), c.extra);
    ops.add(to_device(a, c.extra), to_device(b, c.extra), dout, n);
    got = to_host(dout, n);
    want.resize(n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    tol = 0;
  } else if (c.op == "sigmoid_mul") {
    const int64_t gs = c.dim + c.extra;
    const auto x = randn(n, rng), g = randn(c.rows * gs, rng, 4.0f);
    float* dout = to_device(nans(n));
    ops.sigmoid_mul(to_device(x), to_device(g), gs, dout, c.rows, c.dim);
    got = to_host(dout, n);
    want = nans(n);
    ref::sigmoid_mul(x.data(), g.data(), gs, want.data(), c.rows, c.dim);
  } else if (c.op == "copy_2d") {
    const int64_t src_stride = c.dim + c.extra, dst_stride = c.dim + 2 * c.extra + 1;
    const auto src = randn(c.rows * src_stride, rng), dst0 = randn(c.rows * dst_stride, rng);
    float* ddst = to_device(dst0);
    ops.copy_2d(to_device(src), src_stride, ddst, dst_stride, c.rows, c.dim);
    got = to_host(ddst, dst0.size());
    want = dst0;  // the columns past dim keep their values
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.dim; ++i) want[r * dst_stride + i] = src[r * src_stride + i];
    tol = 0;
  } else if (c.op == "gather") {
    const auto x = randn(n, rng);
    std::vector<int32_t> rows;  // ascending, as the engine lists output rows
    for (int64_t r = 0; r < c.rows; ++r)
      if (r % 3 != 1 || r == c.rows - 1) rows.push_back(static_cast<int32_t>(r));
    const OneRowSpans step = one_row_spans(std::vector<int32_t>(c.rows, 4), rows);
    ops.begin_step(step.layout());
    float* dout = to_device(nans(rows.size() * c.dim));
    ops.gather_output_rows(to_device(x), c.dim, dout);
    got = to_host(dout, rows.size() * c.dim);
    for (int32_t r : rows)
      want.insert(want.end(), x.begin() + r * c.dim, x.begin() + (r + 1) * c.dim);
    tol = 0;
  } else {
    FAIL() << "unknown op " << c.op;
  }
  const double err = rel_l2(got, want);
  EXPECT_LE(err, tol) << c.op << " rows " << c.rows << " dim " << c.dim;
  RecordProperty("rel_l2", sci(err));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaElementwise,
    ::testing::Values(EwCase{"rmsnorm", 1, 1, 0}, EwCase{"rmsnorm", 3, 17, 0},
                      EwCase{"rmsnorm", 37, 64, 0}, EwCase{"rmsnorm", 5, 256, 0},
                      EwCase{"rmsnorm", 6, 257, 0}, EwCase{"rmsnorm", 40, 2048, 0},
                      EwCase{"rmsnorm", 3, 5120, 0}, EwCase{"rmsnorm", 2, 8191, 0},
                      EwCase{"rmsnorm_inplace", 300, 128, 0}, EwCase{"rmsnorm_inplace", 7, 5120, 0},
                      EwCase{"add_rmsnorm", 3, 33, 0}, EwCase{"add_rmsnorm", 20, 4096, 0},
                      EwCase{"add_rmsnorm", 2, 5120, 0}, EwCase{"rope", 9, 256, 64},
                      EwCase{"rope", 4, 20, 20}, EwCase{"rope", 200, 128, 128},
                      EwCase{"rope", 3, 64, 38}, EwCase{"attention_heads", 1, 256, 64},
                      EwCase{"attention_heads", 7, 256, 256}, EwCase{"attention_heads", 3, 96, 30},
                      EwCase{"attention_heads", 40, 64, 0}, EwCase{"silu_mul", 1, 77, 0},
                      EwCase{"silu_mul", 50, 2000, 0}, EwCase{"silu_mul", 50, 2000, 1},
                      EwCase{"silu_mul_alias", 3, 1024, 0}, EwCase{"sigmoid_mul", 3, 21, 21},
                      EwCase{"sigmoid_mul", 33, 4096, 4096}, EwCase{"add", 1, 5, 0},
                      EwCase{"add", 70, 1024, 0}, EwCase{"add", 70, 1025, 3},
                      EwCase{"copy_2d", 5, 13, 3}, EwCase{"copy_2d", 70000, 3, 1},
                      EwCase{"gather", 1, 9, 0}, EwCase{"gather", 70, 1000, 0}),
    [](const ::testing::TestParamInfo<EwCase>& info) {
      return fmt::format("{}_{}x{}_{}", info.param.op, info.param.rows, info.param.dim,
                         info.param.extra);
    });

}  // namespace
}  // namespace qwenrt::ops
