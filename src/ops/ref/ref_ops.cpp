// The reference backend: the Ops interface on the scalar reference kernels (kernels.h), one
// sequence at a time, in host memory. Its blocks are the unfused sequences that define what a
// fast backend's fused kernels must compute. Frozen: fix it, never optimise it.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops {
namespace {

class RefOps final : public Ops {
 public:
  const char* name() const override { return "ref"; }

  float* alloc(int64_t n_floats) override {
    // A deque of vectors: earlier allocations never move; NaN shows an unwritten element.
    buffers_.emplace_back(static_cast<size_t>(n_floats), std::nanf(""));
    return buffers_.back().data();
  }
  void reset_workspace() override { buffers_.clear(); }
  void* alloc_buffer(int64_t bytes) override {
    void* p = std::calloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 1);
    if (!p) fail("ref backend: out of memory allocating {} bytes", bytes);
    return p;
  }
  void free_buffer(void* buffer) override { std::free(buffer); }
  void copy(void* dst, const void* src, int64_t bytes) override { std::memmove(dst, src, bytes); }
  void fill_zero(void* dst, int64_t bytes) override { std::memset(dst, 0, bytes); }
  void upload(const float* host, float* dst, int64_t n) override { std::memcpy(dst, host, n * 4); }
  void download(const float* src, float* host, int64_t n) override {
    std::memcpy(host, src, n * 4);
  }

  void begin_step(const StepLayout& layout) override { step_ = layout; }

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
  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memmove(dst + r * dst_stride, src + r * src_stride, cols * 4);
  }
  void gather_output_rows(const float* x, int64_t dim, float* out) override {
    for (int64_t i = 0; i < step_.n_output_rows; ++i)
      std::memcpy(out + i * dim, x + step_.output_rows[i] * dim, dim * 4);
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
  StepLayout step_;
  std::deque<std::vector<float>> buffers_;
};

}  // namespace

std::unique_ptr<Ops> make_ref_ops() {
  return std::make_unique<RefOps>();
}

}  // namespace qwenrt::ops
