// The CPU backend: the Ops interface on the SIMD kernels of this folder (each tested against
// ops/ref), run on a fixed thread pool, with a workspace arena that stops allocating after the
// first step of a shape. Weights stay in the mapped file, as the kernels read GGUF blocks as they
// are. Shapes no kernel covers fall back to the reference kernels (named at each fallback).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "core/error.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/deltanet.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/qsa.h"
#include "ops/cpu/repack.h"
#include "ops/cpu/sampling.h"
#include "ops/host_ops.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops {
namespace {

static_assert(sizeof(cpu::Span) == sizeof(Span) &&
                  offsetof(cpu::Span, slot) == offsetof(Span, slot) &&
                  offsetof(cpu::Span, begin) == offsetof(Span, begin) &&
                  offsetof(cpu::Span, count) == offsetof(Span, count) &&
                  offsetof(cpu::Span, n_past) == offsetof(Span, n_past) &&
                  offsetof(cpu::Span, keep_states) == offsetof(Span, keep_states),
              "the kernels read the step's spans in place");

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
  // The current block and its fill; release goes back to it if no block was added since (else
  // the memory stays until the next reset merges the blocks).
  int64_t mark() const {
    if (blocks_.empty()) return 0;
    return (static_cast<int64_t>(blocks_.size()) << 40) | blocks_.back().used;
  }
  void release(int64_t mark) {
    if (blocks_.empty() || (mark >> 40) != static_cast<int64_t>(blocks_.size())) return;
    blocks_.back().used = mark & ((int64_t{1} << 40) - 1);
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

// The weights place() repacks: GGUF views of a type the panel kernels read (repack.h), except
// the tables read by rows (token embeddings) and routed experts (measured: the 35B-A3B shape's
// decode fell 46.1 -> 40.7 tok/s with its experts in panels; kept as rows until the expert
// tasks' prefetch is bounded; bench/results/cpu-panels.md).
bool is_row_table(const std::string& name) {
  return name.find("token_embd") != std::string::npos;
}

// QWENRT_CPU_REPACK=0 keeps the weights in the mapped file as GGUF rows (for measurements).
bool repack_enabled() {
  const char* v = std::getenv("QWENRT_CPU_REPACK");
  return !(v && std::string(v) == "0");
}

// QWENRT_CPU_HUGEPAGES=0 leaves the repacked weights on whatever pages the allocator gives.
bool hugepages_enabled() {
  const char* v = std::getenv("QWENRT_CPU_HUGEPAGES");
  return !(v && std::string(v) == "0");
}

class CpuOps final : public HostOps {
 public:
  explicit CpuOps(int n_threads)
      : pool_(n_threads > 0 ? n_threads : physical_cores()),
        repack_(repack_enabled()),
        hugepages_(hugepages_enabled()) {}
  ~CpuOps() override {
    for (void* p : placed_) std::free(p);
  }
  CpuOps(const CpuOps&) = delete;
  CpuOps& operator=(const CpuOps&) = delete;
  static constexpr int64_t kPrefetchRows = 4;
  // QWENRT_EXPERT_POLICY=lfu: least often used instead of least recently used (measured in
  // bench/results/cpu-expert-stream.md).
  static cpu::ExpertPolicy expert_policy() {
    const char* p = std::getenv("QWENRT_EXPERT_POLICY");
    return p && std::string(p) == "lfu" ? cpu::ExpertPolicy::kLfu : cpu::ExpertPolicy::kLru;
  }
  const char* name() const override { return "cpu"; }

  float* alloc(int64_t n_floats) override {
    return static_cast<float*>(arena_.take(n_floats * int64_t{sizeof(float)}));
  }
  void reset_workspace() override { arena_.reset(); }
  int64_t workspace_mark() override { return arena_.mark(); }
  void workspace_release(int64_t mark) override { arena_.release(mark); }

  void begin_step(const StepLayout& layout) override {
    HostOps::begin_step(layout);
    rope_n_rot_ = -1;  // new positions: the RoPE table is rebuilt on first use
    spans_ = reinterpret_cast<const cpu::Span*>(layout.spans);
  }

  void embed(const Weight& table, float* out) override {
    ref::embed_rows(table, step_.tokens, out, step_.n);  // one row dequantised per token
  }
  void matmul(const Weight& w, const float* x, float* y, int64_t n) override {
    cpu::Context ctx{pool_, scratch_};
    cpu::matmul(w.view, x, y, n, ctx);
  }
  void rmsnorm(const float* x, const Weight& weight, float* out, int64_t rows, int64_t dim,
               float eps) override {
    cpu::rmsnorm(x, ref::f32_data(weight), out, rows, dim, eps, pool_);
  }
  void rope_neox(float* x, int n_heads, int head_dim, int64_t token_stride, int n_rot,
                 float theta) override {
    // One cos/sin table per step, shared by the q and k of every attention layer.
    if (rope_n_rot_ != n_rot || rope_theta_ != theta) {
      float* table = rope_table_.get<float>(static_cast<size_t>(step_.n * n_rot));
      cpu::rope_neox_table(step_.positions, step_.n, n_rot, theta, table, pool_);
      rope_n_rot_ = n_rot;
      rope_theta_ = theta;
    }
    cpu::rope_neox_apply(x, rope_table_.get<float>(static_cast<size_t>(step_.n * n_rot)), step_.n,
                         n_heads, head_dim, token_stride, n_rot, pool_);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::silu_mul(gate, up, out, n, pool_);
  }
  void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                   int64_t cols) override {
    cpu::sigmoid_mul(x, gate, gate_stride, out, rows, cols, pool_);
  }
  void add(const float* a, const float* b, float* out, int64_t n) override {
    cpu::add(a, b, out, n, pool_);
  }

  void attention(const AttentionArgs& a) override {
    if (a.head_dim % 16 != 0) return ref::attention_spans(step_, a);  // no SIMD kernel for it
    // The step's new keys and values into their pages, then one kernel over every span.
    const KvLayer& kv = a.kv;
    for (int s = 0; s < step_.n_spans; ++s) {
      const Span& span = step_.spans[s];
      const int32_t* table = step_.page_tables + span.slot * step_.page_table_stride;
      for (int64_t i = 0; i < span.count; ++i) {
        const int64_t t = span.n_past + i;
        const int64_t off =
            (int64_t{table[t / kv.page_size]} * kv.page_size + t % kv.page_size) * kv.kv_dim;
        std::memcpy(kv.k + off, a.k + (span.begin + i) * kv.kv_dim, kv.kv_dim * 4);
        std::memcpy(kv.v + off, a.v + (span.begin + i) * kv.kv_dim, kv.kv_dim * 4);
      }
    }
    cpu::attention(spans_, step_.n_spans, a.q, a.q_stride, kv.k, kv.v, step_.page_tables,
                   step_.page_table_stride, kv.page_size, a.out, a.n_head, a.n_head_kv, a.head_dim,
                   a.scale, pool_);
  }

  // While every query of the step sees no more blocks than the budget keeps, QSA keeps every key
  // (ref::qsa_select): dense causal attention, on this backend's kernel, once the raw indexer keys
  // are in their pages. Otherwise each query's selection and attention over it (cpu/qsa.h).
  void qsa_attention(const QsaArgs& a) override {
    if (!cpu::qsa_keeps_every_key(step_, a)) return cpu::qsa_attention_sparse(step_, a, pool_);
    cpu::qsa_write_index_keys(step_, a);
    attention(a.attn);
  }

  void deltanet(const DeltaNetArgs& a) override {
    // The kernels' modes: chunked from 16 tokens (recurrent below), which equals either form;
    // a forced form (tests, `logits --deltanet`) runs the reference.
    if (a.head_dim % 16 != 0 || a.conv.view.ne[0] > 8 ||
        step_.deltanet_mode != DeltaNetMode::kAuto) {
      return ref::deltanet_spans(step_, a);
    }
    const cpu::DeltaNetLayerArgs layer{.conv_kernel = ref::f32_data(a.conv),
                                       .conv_k = static_cast<int>(a.conv.view.ne[0]),
                                       .dt_bias = ref::f32_data(a.dt_bias),
                                       .a = ref::f32_data(a.a),
                                       .norm = ref::f32_data(a.norm),
                                       .eps = a.eps,
                                       .n_k_heads = a.n_k_heads,
                                       .n_v_heads = a.n_v_heads,
                                       .head_dim = a.head_dim,
                                       .conv_state = a.state.conv,
                                       .delta_state = a.state.delta,
                                       .conv_history = a.state.conv_history,
                                       .delta_history = a.state.delta_history,
                                       .history_rows = a.state.history_rows,
                                       .sigmoid_gate = a.sigmoid_gate};
    float* workspace = alloc(cpu::deltanet_prefill_workspace_floats(layer, step_.n));
    cpu::deltanet_prefill(layer, spans_, step_.n_spans, a.qkv, a.z, a.alpha, a.beta, a.out,
                          workspace, pool_);
  }

  void moe(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert,
           int k) override {
    cpu::Context ctx{pool_, scratch_};
    cpu::moe_ffn(w, x, out, n, n_expert, k, ctx, experts_.get());
  }

  // Matmul weights move into backend memory in the panel layout (repack.h); the mapped pages
  // they came from are released (the page cache keeps them, this process no longer maps them),
  // so the resident set holds one copy. Everything else stays in the mapped file.
  Weight place(const Weight& w) override {
    const int64_t bytes = w.view.nb[2] * w.view.ne[2];
    Weight out = w;
    if (repack_ && !is_row_table(w.name) && !is_routed_expert_tensor(w.name) &&
        cpu::can_repack(w.view)) {
      uint8_t* dst = weight_memory(bytes, w.name);
      // In slices of ~64 MiB, each slice's file pages dropped once written: the source and its
      // copy are never both resident whole (a 1 GB head's pages stayed until its last panel).
      const int64_t panels = cpu::panel_count(w.view), pb = cpu::panel_bytes(w.view);
      const int64_t per_slice = std::max<int64_t>(1, (int64_t{64} << 20) / pb);
      const auto* src = static_cast<const uint8_t*>(w.view.data);
      for (int64_t i0 = 0; i0 < panels; i0 += per_slice) {
        const int64_t i1 = std::min(panels, i0 + per_slice);
        pool_.run(pool_.size(),
                  [&](int p, int np) { cpu::write_panels(w.view, dst, p, np, i0, i1); });
        if (weights_mapped_) drop_mapped_pages(src + i0 * pb, (i1 - i0) * pb);
      }
      out.view = cpu::panel_view(w.view, dst);
      if (weights_mapped_) drop_mapped_pages(w.view.data, bytes);  // pages across slice edges
    }
    // Progress over every weight the model takes (the others stay where they are).
    placed_bytes_ = std::min(place_total_, placed_bytes_ + static_cast<uint64_t>(bytes));
    if (place_progress_) place_progress_(placed_bytes_, place_total_);
    return out;
  }
  bool copies_weights() const override { return repack_; }
  void set_place_progress(std::function<void(uint64_t, uint64_t)> progress,
                          uint64_t total_bytes) override {
    place_progress_ = std::move(progress);
    place_total_ = total_bytes;
    weights_mapped_ = true;  // the engine's weights: a shared, read-only file mapping
  }

  void stream_experts(const ExpertStreaming& c) override {
    experts_ = std::make_unique<cpu::ExpertCache>(c.files, c.budget_bytes, c.slot_bytes,
                                                  c.min_slots, expert_policy());
  }
  void moe_prefetch(const MoeWeights& w, const float* x, int64_t n, int n_expert, int k) override {
    // Decode-sized steps only: a prefill batch asks for most experts of every layer anyway.
    if (!experts_ || n > kPrefetchRows || k > 64) return;
    if (n_expert > 1024) return;
    cpu::Context ctx{pool_, scratch_};
    float logits[kPrefetchRows * 1024];
    cpu::matmul(w.router.view, x, logits, n, ctx);
    int32_t ids[kPrefetchRows * 64];
    float weights[kPrefetchRows * 64];
    cpu::moe_route(logits, n, n_expert, k, ids, weights);
    for (int64_t i = 0; i < n * k; ++i) experts_->prefetch(w, ids[i]);
  }
  ExpertStats expert_stats() const override { return experts_ ? experts_->stats() : ExpertStats{}; }

  void sample(const float* logits, int64_t n_vocab, const SamplingRow* rows, int n_top,
              SampledToken* out) override {
    for (int64_t i = 0; i < step_.n_output_rows; ++i)
      sampler_.sample(logits + i * n_vocab, n_vocab, rows[i], n_top, out[i]);
  }

 private:
  // Repacked weights are bump-allocated (64-byte aligned) from chunks of at least 256 MiB, aligned
  // to 2 MiB and advised MADV_HUGEPAGE before first touch. Where transparent huge pages are
  // "madvise" (a common default) a plain allocation gets 4 KiB pages, and a GEMV streaming
  // gigabytes then misses the TLB every 4 KiB. One host of this machine class read 31 GB/s on
  // 4 KiB pages and 58 GB/s on huge pages (2 threads, bench/results/cpu-compare-2026-12-05.md);
  // another read both alike, with decode unchanged (docs/decisions.md).
  uint8_t* weight_memory(int64_t bytes, const std::string& name) {
    constexpr int64_t kHuge = int64_t{2} << 20, kChunk = int64_t{256} << 20;
    bytes = (bytes + 63) / 64 * 64;
    if (placed_.empty() || chunk_used_ + bytes > chunk_size_) {
      const int64_t size = std::max(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
      void* p = std::aligned_alloc(static_cast<size_t>(kHuge), static_cast<size_t>(size));
      if (!p) fail("cpu backend: out of memory placing {} ({} bytes)", name, bytes);
      if (hugepages_) ::madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);  // a hint only
      placed_.push_back(p);
      chunk_size_ = size;
      chunk_used_ = 0;
    }
    uint8_t* dst = static_cast<uint8_t*>(placed_.back()) + chunk_used_;
    chunk_used_ += bytes;
    return dst;
  }

  // Drops the whole pages of [p, p + bytes) from this process's mapping of the file.
  ThreadPool pool_;
  const bool repack_;
  const bool hugepages_;
  std::vector<void*> placed_;  // chunks of repacked weights (weight_memory)
  int64_t chunk_size_ = 0, chunk_used_ = 0;
  uint64_t placed_bytes_ = 0, place_total_ = 0;
  bool weights_mapped_ = false;  // drop_mapped_pages() may drop the source pages
  std::function<void(uint64_t, uint64_t)> place_progress_;
  Arena arena_;
  cpu::Scratch scratch_;
  std::unique_ptr<cpu::ExpertCache> experts_;  // streamed routed experts (stream_experts)
  cpu::Sampler sampler_;
  cpu::ScratchBuffer rope_table_;
  int rope_n_rot_ = -1;
  float rope_theta_ = 0;
  const cpu::Span* spans_ = nullptr;  // step_.spans seen as the kernels' (same layout)
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int n_threads) {
  return std::make_unique<CpuOps>(n_threads);
}

}  // namespace qwenrt::ops
