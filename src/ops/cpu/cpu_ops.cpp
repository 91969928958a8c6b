// The CPU backend: the Ops interface on the SIMD kernels of this folder, run on a fixed thread
// pool, with a workspace arena that stops allocating after the first step of a shape.
// Blocks without a fast kernel yet run the reference kernels (ops/ref/kernels.h) span by span.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops {
namespace {

// Physical cores: hardware threads divided by the SMT width where Linux reports it.
int physical_cores() {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  int smt = 1;
  if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) {
      // "0,64" or "0-1": two siblings; "0": one.
      for (const char* p = buf; *p; ++p) smt += (*p == ',' || *p == '-') ? 1 : 0;
    }
    std::fclose(f);
  }
  return std::max(1, static_cast<int>(hw) / smt);
}

// A bump allocator over 64-byte aligned blocks. A step that outgrows the current block gets a
// new one; the next reset merges them into one block of the total, so after the first step of
// a shape every alloc is a pointer bump.
class Arena {
 public:
  ~Arena() {
    for (auto& b : blocks_) std::free(b.data);
  }
  void* take(int64_t bytes) {
    bytes = (std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
    if (blocks_.empty() || blocks_.back().used + bytes > blocks_.back().size) {
      const int64_t size =
          std::max<int64_t>(bytes, blocks_.empty() ? 1 << 20 : 2 * blocks_.back().size);
      void* p = std::aligned_alloc(64, static_cast<size_t>(size));
      if (!p) fail("cpu backend: out of memory allocating a {}-byte workspace", size);
      blocks_.push_back({static_cast<uint8_t*>(p), size, 0});
    }
    Block& b = blocks_.back();
    void* p = b.data + b.used;
    b.used += bytes;
    high_water_ += bytes;
    return p;
  }
  void reset() {
    if (blocks_.size() > 1) {
      int64_t total = 0;
      for (auto& b : blocks_) {
        total += b.size;
        std::free(b.data);
      }
      blocks_.clear();
      void* p = std::aligned_alloc(64, static_cast<size_t>(total));
      if (!p) fail("cpu backend: out of memory allocating a {}-byte workspace", total);
      blocks_.push_back({static_cast<uint8_t*>(p), total, 0});
    }
    if (!blocks_.empty()) blocks_.back().used = 0;
    high_water_ = 0;
  }

 private:
  struct Block {
    uint8_t* data;
    int64_t size;
    int64_t used;
  };
  std::vector<Block> blocks_;
  int64_t high_water_ = 0;
};

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int n_threads) : pool_(n_threads > 0 ? n_threads : physical_cores()) {}
  const char* name() const override { return "cpu"; }

  float* alloc(int64_t n_floats) override {
    return static_cast<float*>(arena_.take(n_floats * int64_t{sizeof(float)}));
  }
  void reset_workspace() override { arena_.reset(); }
  void* alloc_buffer(int64_t bytes) override {
    // calloc of large sizes maps fresh zero pages: pools cost memory only where written.
    void* p = std::calloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 1);
    if (!p) fail("cpu backend: out of memory allocating {} bytes", bytes);
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
  ThreadPool pool_;
  Arena arena_;
  StepLayout step_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int n_threads) {
  return std::make_unique<CpuOps>(n_threads);
}

}  // namespace qwenrt::ops
