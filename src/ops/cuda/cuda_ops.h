// The CUDA backend's Ops (ops.h) on the kernels of this folder (kernels.h), one device, one
// stream; internal to ops/cuda. Its definitions: cuda_ops.cpp (memory, weights, the step, graphs,
// sampling), cuda_ops_moe.cpp (the MoE block), cuda_ops_qwen4exp.cpp (the qwen4exp ops).
//
// Weights are uploaded once at load (types without a kernel dequantised to F32 first), but for
// routed experts streamed from the file (--expert-cache: expert_stream.h);
// activations come from a device arena that stops allocating after the first step of a shape;
// the step's layout is uploaded once per step. A decode-shaped step that ends in sampling is
// captured as one CUDA graph the second time its shape is seen and replayed from then on: the
// arch code still calls every op, but while a graph replays the ops only take their workspace
// (the same pointers, in the same order) and the graph runs at the sampling call.
//
// QWENRT_CUDA_GRAPHS=0 turns capture off; QWENRT_CUDA_PROFILE=1 times every op with events (graphs
// off) and prints the time per op class at exit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cuda/check.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/expert_stream.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/op_profiler.h"
#include "ops/cuda/prefetch.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops::cuda {

// The head sizes attention.cu's kernels take (cuda_unsupported; QSA's dense path).
inline bool attention_head_dim_ok(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device);

  ~CudaOps() override;

  const char* name() const override { return "cuda"; }

  // ---- Memory ----
  float* alloc(int64_t n_floats) override {
    return static_cast<float*>(arena_.take(n_floats * int64_t{sizeof(float)}));
  }
  int64_t workspace_mark() override { return arena_.mark(); }
  void workspace_release(int64_t mark) override { arena_.release(mark); }
  void reset_workspace() override {
    if (arena_.needs_merge() || scratch_.needs_merge() || side_scratch_.needs_merge()) {
      // Merging frees blocks: never inside a capture (none has begun its ops yet when the engine
      // resets; the step then runs eagerly).
      if (mode_ == Mode::kCapture) {
        if (op_count_ != 0) fail("cuda backend: the workspace was reset inside a captured step");
        abort_capture();
      }
      QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    arena_.reset();
    scratch_.reset();
    side_scratch_.reset();
  }
  void* alloc_buffer(int64_t bytes) override {
    outside_step("alloc_buffer");
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))) != cudaSuccess) {
      cudaGetLastError();
      fail("cuda backend: out of device memory allocating {} bytes", bytes);
    }
    QWENRT_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_));
    buffers_.push_back(p);
    buffer_bytes_[p] = bytes;
    return p;
  }
  void free_buffer(void* buffer) override;
  void copy(void* dst, const void* src, int64_t bytes) override {
    touch_ple_tokens(dst, bytes);
    if (skip()) return;
    QWENRT_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_zero(void* dst, int64_t bytes) override {
    touch_ple_tokens(dst, bytes);
    if (skip()) return;
    QWENRT_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_));
  }
  void upload(const float* host, float* dst, int64_t n) override {
    end_capture("upload");
    touch_ple_tokens(dst, n * 4);
    QWENRT_CUDA_CHECK(
        cudaMemcpyAsync(dst, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host array may go away
  }
  void download(const float* src, float* host, int64_t n) override {
    end_capture("download");
    QWENRT_CUDA_CHECK(
        cudaMemcpyAsync(host, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (profile_) profiler_.collect();
  }

  bool copies_weights() const override { return true; }
  void set_place_progress(std::function<void(uint64_t, uint64_t)> progress,
                          uint64_t total_bytes) override {
    progress_ = std::move(progress);
    progress_total_ = total_bytes;
    progress_done_ = 0;
  }

  // Uploads through two pinned staging buffers, so reading the file (page faults from disk)
  // overlaps the copies to the device. Types without a kernel are dequantised to F32 here.
  Weight place(const Weight& w) override;

  // ---- The step ----
  void begin_step(const StepLayout& layout) override;

  void embed(const Weight& table, float* out) override {
    if (skip()) return;
    Scope s(this, op_class::kEmbed);
    cuda::embed_rows(matrix(table), dstep_.tokens, dstep_.n, out, stream_);
  }
  void matmul(const Weight& w, const float* x, float* y, int64_t n) override {
    if (skip(matmul_ws(w, n))) return;
    Scope s(this, op_class::kMatmul);
    const Matrix m = matrix(w);
    if (dropped(kDropMatmul)) return;
    cuda::matmul(m, x, y, n, ws_, stream_);
    prefetch_after({m}, n, stream_);
  }
  void matmuls(const float* x, int64_t n, std::span<const Projection> projections) override {
    cuda::Projection p[kMaxProjections];
    if (projections.size() > kMaxProjections) return Ops::matmuls(x, n, projections);
    for (size_t i = 0; i < projections.size(); ++i)
      p[i] = {matrix(*projections[i].w), projections[i].y};
    const int n_p = static_cast<int>(projections.size());
    if (skip(cuda::matmul_group_workspace_bytes(p, n_p, n))) return;
    Scope s(this, op_class::kMatmul);
    if (dropped(kDropGroup)) return;
    cuda::matmul_group(p, n_p, x, n, ws_, stream_);
    Matrix read[kMaxProjections];
    for (int i = 0; i < n_p; ++i) read[i] = p[i].w;
    prefetch_after(std::span<const Matrix>(read, static_cast<size_t>(n_p)), n, stream_);
  }
  void rmsnorm(const float* x, const Weight& weight, float* out, int64_t rows, int64_t dim,
               float eps) override {
    if (skip()) return;
    Scope s(this, op_class::kNorm);
    if (dropped(kDropNorm)) return;
    cuda::rmsnorm(x, ref::f32_data(weight), out, rows, dim, eps, stream_);
  }
  void add_rmsnorm(float* x, const float* delta, const Weight& weight, float* out, int64_t rows,
                   int64_t dim, float eps) override {
    if (skip()) return;
    Scope s(this, op_class::kNorm);
    if (dropped(kDropNorm)) return;
    cuda::add_rmsnorm(x, delta, ref::f32_data(weight), out, rows, dim, eps, stream_);
  }
  void rope_neox(float* x, int n_heads, int head_dim, int64_t token_stride, int n_rot,
                 float theta) override {
    if (skip()) return;
    Scope s(this, op_class::kRope);
    cuda::rope_neox(x, dstep_.positions, dstep_.n, n_heads, head_dim, token_stride, n_rot, theta,
                    stream_);
  }
  void attention_heads(const AttentionHeadsArgs& a) override {
    if (!cuda::attention_heads_fit(a.head_dim, a.n_rot)) return Ops::attention_heads(a);
    if (skip()) return;
    Scope s(this, op_class::kRope);
    if (dropped(kDropHeads)) return;
    cuda::attention_heads(a.q_gate, ref::f32_data(*a.q_norm), ref::f32_data(*a.k_norm), a.q, a.gate,
                          a.k, dstep_.positions, a.n, a.n_head, a.n_head_kv, a.head_dim, a.n_rot,
                          a.rope_theta, a.eps, stream_);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    if (skip()) return;
    Scope s(this, op_class::kElementwise);
    cuda::silu_mul(gate, up, out, n, stream_);
  }
  void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                   int64_t cols) override {
    if (skip()) return;
    Scope s(this, op_class::kElementwise);
    cuda::sigmoid_mul(x, gate, gate_stride, out, rows, cols, stream_);
  }
  void add(const float* a, const float* b, float* out, int64_t n) override {
    if (skip()) return;
    Scope s(this, op_class::kElementwise);
    cuda::add(a, b, out, n, stream_);
  }
  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override {
    if (skip()) return;
    Scope s(this, op_class::kElementwise);
    cuda::copy_2d(src, src_stride, dst, dst_stride, rows, cols, stream_);
  }
  void gather_output_rows(const float* x, int64_t dim, float* out) override {
    if (skip()) return;
    Scope s(this, op_class::kElementwise);
    cuda::gather_rows(x, dim, dstep_.output_rows, dstep_.n_output_rows, out, stream_);
  }
  void ffn_swiglu(const Weight& gate, const Weight& up, const Weight& down, const float* x,
                  float* out, int64_t n) override {
    const int64_t ff = gate.view.ne[1];
    float* mid = alloc(n * ff);
    const Matrix g = matrix(gate), u = matrix(up), d = matrix(down);
    const int64_t ws_bytes =
        std::max(cuda::matmul_swiglu_workspace_bytes(g, n), cuda::matmul_workspace_bytes(d, n));
    if (skip(ws_bytes)) return;
    Scope s(this, op_class::kFfn);
    cuda::matmul_swiglu(g, u, x, mid, n, ws_, stream_);
    prefetch_after({g, u}, n, stream_);
    cuda::matmul(d, mid, out, n, ws_, stream_);
    prefetch_after({d}, n, stream_);
  }

  // ---- Blocks ----
  void attention(const AttentionArgs& a) override { attention_with(a, nullptr, 0); }
  // The gate in the split chunks' merge (attention.cu) where every span is decode-shaped.
  void attention_gated(const AttentionArgs& a, const float* gate, int64_t gate_stride,
                       int64_t n) override {
    if (!cuda::attention_gate_fits(dstep_, a, gate, gate_stride))
      return Ops::attention_gated(a, gate, gate_stride, n);
    attention_with(a, gate, gate_stride);
  }
  void attention_with(const AttentionArgs& a, const float* gate, int64_t gate_stride) {
    cuda::DeviceStep step = dstep_;
    step.max_tokens = dstep_.page_table_stride * a.kv.page_size;
    if (skip(cuda::attention_workspace_bytes(step, a.n_head, a.head_dim))) return;
    Scope s(this, op_class::kAttention);
    if (dropped(kDropAttention)) return;
    cuda::attention(step, a, ws_, stream_,
                    {.gate = gate,
                     .gate_stride = gate_stride,
                     .counters = counters(cuda::attention_counters(step, a))});
  }
  void deltanet(const DeltaNetArgs& a) override {
    if (skip(cuda::deltanet_workspace_bytes(dstep_, a))) return;
    Scope s(this, op_class::kDeltaNet);
    if (dropped(kDropDeltaNet)) return;
    const int64_t n_counters = fused_conv_ ? cuda::deltanet_fused_conv_counters(dstep_, a) : 0;
    cuda::deltanet(dstep_, a, ws_, n_counters > 0 ? counters(n_counters) : nullptr, stream_);
  }
  void moe(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert,
           int k) override {
    moe_block(w, x, out, n, n_expert, k, nullptr);
  }
  // Decode-sized steps fold the norm into the router's kernel (moe_norm_route);
  // QWENRT_CUDA_NORM_ROUTE=0 runs add_rmsnorm and moe.
  void add_rmsnorm_moe(const NormedInput& in, const MoeWeights& w, float* out, int64_t n,
                       int n_expert, int k) override {
    if (!norm_route_ || !cuda::norm_route_fits(norm_route_args(in, w, n, n_expert, k))) {
      return Ops::add_rmsnorm_moe(in, w, out, n, n_expert, k);
    }
    moe_block(w, in.h, out, n, n_expert, k, &in);
  }

  // ---- qwen4exp ----
  void rmsnorm_grouped(const float* x, const Weight& weight, float* out, int64_t rows, int groups,
                       int64_t dim, float eps) override;
  void silu_scaled(const float* x, float scale, float* out, int64_t n) override;
  void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc,
              int64_t dim) override;
  void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
                 int64_t dim) override;
  void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
                int hc, int64_t dim) override;
  void ple_conv(const PleConvArgs& a) override;

  // The PLE n-gram rows: the table stays in the mapped file (tens of GB in the released model;
  // for_each_weight does not place it), so the host hashes each row's context (the slot's
  // remembered tokens, mirrored on the host: PleShadow) with ref's code, dequantises the rows into
  // a pinned buffer and uploads them; a kernel writes the slots' new remembered tokens. During a
  // replayed step the host still fills the pinned buffer (the graph's copies read it when the
  // graph runs, at sample), so decode steps stay capturable.
  void ple_embed(const PleEmbedArgs& a) override;

  // While no query of the step sees more complete blocks than the budget keeps (for every QSA
  // layer seen: qsa_sparse_, part of the graph key), QSA is dense causal attention: the raw
  // indexer keys into their pages, then attention.cu's kernels where they take the head size.
  // Otherwise qsa.cu's selection and attention.
  void qsa_attention(const QsaArgs& a) override;

  // Routed experts stay in the mapped file and stream into a device pool (expert_stream.h; the
  // MoE block reads each step's ids back, so graph capture is off). Before placement.
  void stream_experts(const ExpertStreaming& config) override;
  ExpertStats expert_stats() const override;
  int64_t device_memory_free() const override;

  // ---- The end of a step ----
  void sample(const float* logits, int64_t n_vocab, const SamplingRow* rows, int n_top,
              SampledToken* out) override;

 private:
  static constexpr int64_t kStageBytes = int64_t{64} << 20;
  static constexpr int64_t kWeightChunk = int64_t{1} << 30;
  static constexpr size_t kMaxProjections = 8;
  static constexpr int64_t kMaxGraphRows = 16;
  // Steps of at most this many rows prefetch weights into L2 (GEMV-shaped reads).
  static constexpr int64_t kMaxPrefetchRows = 64;

  enum class Mode { kEager, kCapture, kReplay };
  // What a captured step is keyed by: everything that sets a launch's shape.
  using GraphKey = std::tuple<int64_t, int, int64_t, int64_t, int>;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;
    int64_t n_ops = 0;
    size_t n_nodes = 0;
    // A node reads pinned host memory that the step's ops fill as they are called (ple_embed's
    // staged rows): such a graph launches only when its ops have run (end_capture).
    bool host_fed = false;
  };

  // Times one op with events when profiling.
  struct Scope {
    Scope(CudaOps* ops, cuda::OpClass c) : ops_(ops), class_(c) {
      if (ops_->profile_) ops_->profiler_.begin(c, ops_->stream_);
    }
    ~Scope() {
      if (ops_->profile_) ops_->profiler_.end(ops_->stream_);
    }
    CudaOps* ops_;
    cuda::OpClass class_;
  };

  Matrix matrix(const Weight& w) const {
    const TensorView& v = w.view;
    return {.dtype = v.dtype,
            .in = v.ne[0],
            .out = v.ne[1],
            .n_expert = v.ne[2],
            .row_bytes = v.nb[1],
            .expert_bytes = v.nb[2],
            .data = v.data,
            .q8_superblocks = v.dtype == DType::Q8_0 && in_q8_superblocks(v.data)};
  }
  // Whether [p, p + bytes) lies inside one of the ranges ([start, end) by start).
  static bool in_ranges(const std::map<uintptr_t, uintptr_t>& ranges, const void* p,
                        int64_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = ranges.upper_bound(a);
    if (it == ranges.begin()) return false;
    --it;
    return a + static_cast<uintptr_t>(std::max<int64_t>(bytes, 1)) <= it->second;
  }
  // Whether [p, p + bytes) lies in placed weight memory (only that is prefetched into L2).
  bool placed(const void* p, int64_t bytes) const { return in_ranges(weight_chunks_, p, bytes); }
  // Whether a placed weight (or a view into one) was repacked into Q8_0 superblocks.
  bool in_q8_superblocks(const void* p) const { return in_ranges(q8_superblock_ranges_, p, 1); }
  int64_t matmul_ws(const Weight& w, int64_t n) const {
    return cuda::matmul_workspace_bytes(matrix(w), n);
  }

  uint8_t* weight_memory(int64_t bytes);

  // The step's arrays in one pinned buffer, then one copy to the device.
  void upload_layout(const StepLayout& l);

  uint64_t generation() const {
    uint64_t g = 0;
    for (uint64_t part : {arena_.generation(), scratch_.generation(), side_scratch_.generation(),
                          layout_generation_, ple_stage_generation_, counter_generation_})
      g = g * 1000003u + part;
    return g;
  }

  void choose_mode(const StepLayout& l);

  // ---- qwen4exp state ----
  // A host mirror of one layer's ple_tokens buffer [n_slots, ngram - 1] (ple_embed hashes from
  // it). ple_embed updates both copies alike; any other write into the buffer (copy, fill_zero,
  // upload: snapshots, restores, resets) marks it stale, and it is read back at the next
  // begin_step, where the stream is idle anyway.
  struct PleShadow {
    float* dev = nullptr;
    int64_t floats = 0;
    std::vector<float> host;
    bool stale = true;
  };
  void touch_ple_tokens(const void* dst, int64_t bytes);
  void read_ple_tokens(PleShadow& sh);
  PleShadow& ple_shadow(float* dev, int ctx_len);
  // The pinned buffer of the step's i-th ple_embed call (one per call, so a later call never
  // overwrites what an earlier copy still reads). Growing it moves it: the generation changes.
  uint8_t* ple_stage(int64_t bytes);
  // The PLE table is read on the host: it must be the mapped file's bytes, not a placed copy.
  void check_host_table(const Weight& table);
  // Whether some span of the step holds more complete blocks of `ratio` than `budget` keeps.
  bool drops_blocks(int ratio, int budget) const;

  // After a launch on `stream` that read the weights `read` (whole matrices): L2 prefetches of the
  // weights the step reads next (prefetch.h), in decode-sized steps of placed weights.
  void prefetch_after(std::span<const Matrix> read, int64_t n, cudaStream_t stream) {
    if (!prefetcher_->on() || n > kMaxPrefetchRows || read.size() > kMaxProjections) return;
    cuda::PrefetchSchedule::Range ranges[kMaxProjections];
    for (size_t i = 0; i < read.size(); ++i) {
      const int64_t bytes = read[i].out * read[i].row_bytes * read[i].n_expert;
      if (!placed(read[i].data, bytes)) return;
      ranges[i] = {read[i].data, bytes};
    }
    prefetcher_->after({ranges, read.size()}, stream, stream_, mode_ == Mode::kCapture);
  }
  void prefetch_after(std::initializer_list<Matrix> read, int64_t n, cudaStream_t stream) {
    prefetch_after(std::span<const Matrix>(read.begin(), read.size()), n, stream);
  }

  // The arguments of the fused norm and routing, less the step's scratch.
  cuda::NormRouteArgs norm_route_args(const NormedInput& in, const MoeWeights& w, int64_t n,
                                      int n_expert, int k);

  // The MoE block on x; with `pre`, x is pre->h, made by the routing kernel from pre's add and
  // norm (a decode-sized step: add_rmsnorm_moe).
  void moe_block(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert, int k,
                 const NormedInput* pre);

  // QWENRT_CUDA_DROP=class,... (a timing diagnostic: the output is wrong): kernels of those classes
  // are left out of captured graphs, so that decode replays time the step without them; the first
  // (eager) step still runs them, so the buffers they write hold values of the right kind (routing
  // itself is never dropped: stale expert ids would read out of range).
  enum DropClass : unsigned {
    kDropNorm = 1,    // rmsnorm, add_rmsnorm
    kDropMatmul = 2,  // single matmuls: output projections, the head
    kDropGroup = 4,   // projection groups
    kDropHeads = 8,   // attention_heads
    kDropAttention = 16,
    kDropDeltaNet = 32,  // conv and delta rule
    kDropRouter = 64,    // the router GEMV (not the fused norm and routing)
    kDropExperts = 128,  // routed experts' gate / up and down
    kDropCombine = 256,
    kDropShared = 512,  // the shared expert's two GEMVs
  };
  static unsigned parse_drop(const char* v);
  // n zeroed completion counters for one launch of the main stream (kernels that elect the last
  // of their blocks: the MoE routing with its norm, the DeltaNet decode with its conv). Each such
  // launch leaves its counters zero again, so every launch takes them from the start of the pool.
  // The first step of a shape runs eagerly and grows the pool if need be; growing moves it, so a
  // capture under way is ended and not kept (the generation changes).
  unsigned* counters(int64_t n) {
    if (n <= counter_capacity_) return counters_;
    if (mode_ == Mode::kReplay) fail("cuda backend: the counter pool grew inside a replayed step");
    ++counter_generation_;
    if (mode_ == Mode::kCapture) end_capture(nullptr);
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no launch still counts in the old pool
    grow_counters(std::max(n, 2 * counter_capacity_));
    return counters_;
  }
  void grow_counters(int64_t n) {
    QWENRT_CUDA_CHECK(cudaFree(counters_));
    QWENRT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&counters_), n * sizeof(unsigned)));
    QWENRT_CUDA_CHECK(cudaMemset(counters_, 0, n * sizeof(unsigned)));
    counter_capacity_ = n;
  }

  bool dropped(DropClass c) const { return (drop_ & c) != 0 && mode_ == Mode::kCapture; }

  // Every op starts here: true means the op is part of a graph that replays, so it only counts
  // and takes its workspace (the same addresses as at capture). `ws_bytes` of workspace go to ws_:
  // scratch that only this op uses, so every op's starts at the same address.
  bool skip(int64_t ws_bytes = 0) {
    scratch_.rewind();
    ws_ = ws_bytes > 0 ? scratch_.take(ws_bytes) : nullptr;
    ++op_count_;
    return mode_ == Mode::kReplay;
  }

  void outside_step(const char* what) {
    if (mode_ != Mode::kEager) fail("cuda backend: {} inside a captured step", what);
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // placed weights are on the device
  }

  // Ends the graph part of a step: a capture is instantiated and run, a replay is launched.
  // `what` (not null) names an op that cannot be part of a graph: after a capture that shape is
  // marked as never captured again.
  void end_capture(const char* what);

  void abort_capture();

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  // A second stream for work beside the main one inside a step (forked from and joined back into
  // stream_ by events, so a captured graph holds both branches).
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  DeviceArena arena_;         // activations of the step (alloc)
  DeviceArena scratch_;       // one op's workspace at a time (skip)
  DeviceArena side_scratch_;  // the side stream's (the MoE shared expert)
  void* ws_ = nullptr;
  std::vector<void*> buffers_;
  std::map<uintptr_t, uintptr_t> weight_chunks_;  // placed weight memory: [start, end)
  uint8_t* weight_chunk_ = nullptr;               // the one being filled
  int64_t weight_used_ = 0, weight_chunk_size_ = 0, placed_bytes_ = 0;
  PinnedBuffer stage_[2];
  DeviceBuffer repack_scratch_;
  std::map<uintptr_t, uintptr_t>
      q8_superblock_ranges_;  // placed Q8_0 superblock tensors: [start, end)
  cudaEvent_t stage_done_[2] = {};
  int stage_next_ = 0;
  std::function<void(uint64_t, uint64_t)> progress_;
  uint64_t progress_total_ = 0, progress_done_ = 0;

  StepLayout host_step_;
  cuda::DeviceStep dstep_;
  PinnedBuffer layout_stage_;
  DeviceBuffer layout_dev_;
  uint64_t layout_generation_ = 0;
  PinnedBuffer sample_stage_, sample_out_host_;
  DeviceBuffer sample_dev_, sample_out_dev_;

  // qwen4exp: the PLE token mirrors, ple_embed's pinned staging (per call of a step), the
  // buffers' sizes (to size a mirror), the (ratio, budget) of every QSA layer seen, and whether
  // one of them drops blocks in this step.
  std::vector<PleShadow> ple_shadows_;
  std::vector<std::pair<std::unique_ptr<PinnedBuffer>, int64_t>> ple_stages_;
  int ple_calls_ = 0;
  uint64_t ple_stage_generation_ = 0;
  std::map<const void*, int64_t> buffer_bytes_;
  const void* checked_table_ = nullptr;
  std::set<std::pair<int, int>> qsa_configs_;
  bool qsa_sparse_ = false;

  bool graphs_enabled_ = true;
  // MoE steps of at least this many rows run the routed experts as grouped GEMMs
  // (QWENRT_CUDA_GROUPED_ROWS; 0: never). 128, not 32: on the 35B-A3B the per-pair GEMVs
  // measured 1,409 against the grouped GEMMs' 816 tok/s at 32 rows, 1,588 against 1,297 at 64.
  int64_t grouped_min_rows_ = 128;
  // The same for the int8 grouped kernels (moe_mmq.cu), from 16 rows: on the 35B-A3B (one device
  // call, aggregate decode) 1,345 / 1,834 / 2,723 tok/s at 16 / 32 / 64 rows against the per-pair
  // GEMVs' 1,273 / 1,449 / 1,627. QWENRT_CUDA_GROUPED_ROWS sets both.
  int64_t mmq_min_rows_ = 16;
  bool norm_route_ = true;    // add_rmsnorm_moe fused (QWENRT_CUDA_NORM_ROUTE)
  bool down_combine_ = true;  // experts_down_combine (QWENRT_CUDA_DOWN_COMBINE)
  bool moe_row_ = true;       // a decode row's experts in two launches (QWENRT_CUDA_MOE_ROW)
  bool fused_conv_ = true;    // the DeltaNet decode conv folded in (QWENRT_CUDA_FUSED_CONV)
  unsigned drop_ = 0;         // QWENRT_CUDA_DROP's kernel classes
  // Completion counters of the kernels that elect a last block (counters()).
  static constexpr int64_t kInitialCounters = 4096;
  unsigned* counters_ = nullptr;
  int64_t counter_capacity_ = 0;
  uint64_t counter_generation_ = 0;
  Mode mode_ = Mode::kEager;
  std::map<GraphKey, Graph> graphs_;
  std::map<GraphKey, int> seen_;
  GraphKey capture_key_{};
  uint64_t capture_generation_ = 0;
  Graph* replay_ = nullptr;
  // A replay is launched at begin_step, before the host walks the step's ops (which then only
  // count and take their workspace): the walk overlaps the GPU's work instead of preceding it
  // (QWENRT_CUDA_EARLY_LAUNCH=0 launches at the step's end as before).
  bool early_launch_ = true;
  bool replay_launched_ = false;
  bool capture_host_fed_ = false;  // the capture under way holds a host-fed node (Graph)
  int64_t op_count_ = 0;

  std::unique_ptr<cuda::L2Prefetcher> prefetcher_;
  std::unique_ptr<cuda::ExpertStream> experts_;  // streamed routed experts (stream_experts)

  bool profile_ = false;
  cuda::OpProfiler profiler_;
};

}  // namespace qwenrt::ops::cuda
