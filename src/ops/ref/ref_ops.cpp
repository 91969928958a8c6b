// The reference backend: the Ops interface on the scalar reference kernels (kernels.h), one
// sequence at a time, in host memory. Its blocks are the unfused sequences that define what a
// fast backend's fused kernels must compute. Frozen: fix it, never optimise it.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "core/error.h"
#include "ops/host_ops.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops {
namespace {

class RefOps final : public HostOps {
 public:
  const char* name() const override { return "ref"; }

  float* alloc(int64_t n_floats) override {
    // A deque of vectors: earlier allocations never move; NaN shows an unwritten element.
    buffers_.emplace_back(static_cast<size_t>(n_floats), std::nanf(""));
    return buffers_.back().data();
  }
  void reset_workspace() override { buffers_.clear(); }

  void embed(const Weight& table, float* out) override {
    ref::embed_rows(table, step_.tokens, out, step_.n);
  }
  void matmul(const Weight& w, const float* x, float* y, int64_t n) override {
    ref::matmul(w, x, y, n);
  }
  void rmsnorm(const float* x, const Weight& weight, float* out, int64_t rows, int64_t dim,
               float eps) override {
    ref::rmsnorm(x, ref::f32_data(weight), out, rows, dim, eps);
  }
  void rope_neox(float* x, int n_heads, int head_dim, int64_t token_stride, int n_rot,
                 float theta) override {
    ref::rope_neox(x, step_.positions, step_.n, n_heads, head_dim, token_stride, n_rot, theta);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    ref::silu_mul(gate, up, out, n);
  }
  void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                   int64_t cols) override {
    ref::sigmoid_mul(x, gate, gate_stride, out, rows, cols);
  }
  void add(const float* a, const float* b, float* out, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void attention(const AttentionArgs& a) override { ref::attention_spans(step_, a); }
  void deltanet(const DeltaNetArgs& a) override { ref::deltanet_spans(step_, a); }

  void moe(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert,
           int k) override {
    ref::moe_ffn(w, x, out, n, n_expert, k);
  }

  void sample(const float* logits, int64_t n_vocab, const SamplingRow* rows, int n_top,
              SampledToken* out) override {
    ref::sample_rows(step_, logits, n_vocab, rows, n_top, out);
  }

 private:
  std::deque<std::vector<float>> buffers_;
};

}  // namespace

std::unique_ptr<Ops> make_ref_ops() {
  return std::make_unique<RefOps>();
}

}  // namespace qwenrt::ops
