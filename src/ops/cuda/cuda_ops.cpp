// The CUDA backend: the Ops interface on the kernels of this folder (kernels.h), one device, one
// stream. Weights are uploaded once at load (types without a kernel dequantised to F32 first);
// activations come from a device arena that stops allocating after the first step of a shape;
// the step's layout is uploaded once per step. A decode-shaped step that ends in sampling is
// captured as one CUDA graph the second time its shape is seen and replayed from then on: the
// arch code still calls every op, but while a graph replays the ops only take their workspace
// (the same pointers, in the same order) and the graph runs at the sampling call.
//
// QWENRT_CUDA_GRAPHS=0 turns capture off; QWENRT_CUDA_PROFILE=1 times every op with events (graphs
// off) and prints the time per op class at exit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "ops/cuda/check.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/op_profiler.h"
#include "ops/cuda/prefetch.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"

namespace qwenrt::ops {
namespace {

using cuda::DeviceArena;
using cuda::DeviceBuffer;
using cuda::Matrix;
using namespace cuda::op_class;
using cuda::PinnedBuffer;
using cuda::round_up;

// The head sizes attention.cu's kernels take (cuda_unsupported; QSA's dense path).
bool attention_head_dim_ok(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return std::strcmp(v, "0") != 0;
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device) : device_(device) {
    int count = 0;
    QWENRT_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count)
      fail("cuda backend: no GPU {} (this machine has {})", device, count);
    QWENRT_CUDA_CHECK(cudaSetDevice(device));
    QWENRT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    QWENRT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    for (auto& e : stage_done_)
      QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    profile_ = env_flag("QWENRT_CUDA_PROFILE", false);
    graphs_enabled_ = env_flag("QWENRT_CUDA_GRAPHS", true) && !profile_;
    if (const char* v = std::getenv("QWENRT_CUDA_GROUPED_ROWS"); v != nullptr && *v != '\0') {
      const long long r = std::atoll(v);
      grouped_min_rows_ = mmq_min_rows_ = r <= 0 ? INT64_MAX : r;
    }
    prefetcher_ = std::make_unique<cuda::L2Prefetcher>(device);
    norm_route_ = env_flag("QWENRT_CUDA_NORM_ROUTE", true);
    down_combine_ = env_flag("QWENRT_CUDA_DOWN_COMBINE", true);
    moe_row_ = env_flag("QWENRT_CUDA_MOE_ROW", true);
    fused_conv_ = env_flag("QWENRT_CUDA_FUSED_CONV", true);
    drop_ = parse_drop(std::getenv("QWENRT_CUDA_DROP"));
    grow_counters(kInitialCounters);
  }

  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    if (profile_) profiler_.print();
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
    for (void* p : buffers_) cudaFree(p);
    for (const auto& [start, end] : weight_chunks_) cudaFree(reinterpret_cast<void*>(start));
    for (auto& e : stage_done_) cudaEventDestroy(e);
    prefetcher_.reset();
    cudaFree(counters_);
    cudaEventDestroy(fork_);
    cudaEventDestroy(join_);
    cudaStreamDestroy(side_);
    cudaStreamDestroy(stream_);
  }

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
  void free_buffer(void* buffer) override {
    outside_step("free_buffer");
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto it = std::find(buffers_.begin(), buffers_.end(), buffer);
    if (it == buffers_.end()) fail("cuda backend: free_buffer of memory it did not allocate");
    buffers_.erase(it);
    buffer_bytes_.erase(buffer);
    std::erase_if(ple_shadows_, [&](const PleShadow& sh) { return sh.dev == buffer; });
    QWENRT_CUDA_CHECK(cudaFree(buffer));
  }
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
  Weight place(const Weight& w) override {
    if (!w.present()) return w;
    Weight out = w;
    TensorView v = w.view;
    std::vector<float> converted;
    const uint64_t file_bytes = static_cast<uint64_t>(v.n_rows() * v.row_bytes());
    if (v.nb[1] != v.row_bytes() || v.nb[2] != v.nb[1] * v.ne[1] || v.nb[3] != v.nb[2] * v.ne[2]) {
      fail("cuda backend: tensor '{}' is not contiguous", w.name);
    }
    if (!cuda::has_kernel(v.dtype)) {
      converted.resize(static_cast<size_t>(v.n_elements()));
      quant::dequantize(v.dtype, v.data, converted.data(), v.n_elements(), w.name);
      v = TensorView::contiguous(DType::F32, v.n_dims, v.ne, converted.data());
    }
    const int64_t bytes = v.n_rows() * v.row_bytes();
    uint8_t* dst = weight_memory(bytes);
    const uint8_t* src = static_cast<const uint8_t*>(v.data);
    // Q8_0 rows of whole superblocks are repacked on the device on the way in (kernels.h,
    // repack_q8_0_superblocks): each chunk goes to a scratch buffer, then the repack writes it
    // into place. Chunks are whole superblocks.
    const bool repack = v.dtype == DType::Q8_0 && cuda::q8_0_superblocks_fit(v.ne[0]);
    constexpr int64_t kSuperblock = 272;
    const int64_t chunk = repack ? kStageBytes / kSuperblock * kSuperblock : kStageBytes;
    uint8_t* scratch = repack ? repack_scratch_.get(chunk) : nullptr;
    for (int64_t off = 0; off < bytes; off += chunk) {
      const int64_t len = std::min(chunk, bytes - off);
      const int i = stage_next_;
      stage_next_ ^= 1;
      QWENRT_CUDA_CHECK(cudaEventSynchronize(stage_done_[i]));
      uint8_t* stage = stage_[i].get(kStageBytes);
      std::memcpy(stage, src + off, static_cast<size_t>(len));
      QWENRT_CUDA_CHECK(cudaMemcpyAsync(repack ? scratch : dst + off, stage,
                                        static_cast<size_t>(len), cudaMemcpyHostToDevice, stream_));
      QWENRT_CUDA_CHECK(cudaEventRecord(stage_done_[i], stream_));
      if (repack) cuda::repack_q8_0_superblocks(scratch, dst + off, len, stream_);
    }
    if (repack)
      q8_superblock_ranges_[reinterpret_cast<uintptr_t>(dst)] =
          reinterpret_cast<uintptr_t>(dst + bytes);
    placed_bytes_ += bytes;
    progress_done_ += file_bytes;
    if (progress_) progress_(std::min(progress_done_, progress_total_), progress_total_);
    out.view = v;
    out.view.data = dst;
    return out;
  }

  // ---- The step ----
  void begin_step(const StepLayout& layout) override {
    if (mode_ == Mode::kCapture) abort_capture();
    mode_ = Mode::kEager;
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging buffer is free again
    host_step_ = layout;
    // The stream is idle: the PLE token state written since the last step is read back here,
    // before a capture may begin.
    for (PleShadow& sh : ple_shadows_) {
      if (sh.stale) read_ple_tokens(sh);
    }
    ple_calls_ = 0;
    qsa_sparse_ = false;
    for (const auto& [ratio, budget] : qsa_configs_)
      qsa_sparse_ = qsa_sparse_ || drops_blocks(ratio, budget);
    upload_layout(layout);
    choose_mode(layout);
  }

  void embed(const Weight& table, float* out) override {
    if (skip()) return;
    Scope s(this, kEmbed);
    cuda::embed_rows(matrix(table), dstep_.tokens, dstep_.n, out, stream_);
  }
  void matmul(const Weight& w, const float* x, float* y, int64_t n) override {
    if (skip(matmul_ws(w, n))) return;
    Scope s(this, kMatmul);
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
    Scope s(this, kMatmul);
    if (dropped(kDropGroup)) return;
    cuda::matmul_group(p, n_p, x, n, ws_, stream_);
    Matrix read[kMaxProjections];
    for (int i = 0; i < n_p; ++i) read[i] = p[i].w;
    prefetch_after(std::span<const Matrix>(read, static_cast<size_t>(n_p)), n, stream_);
  }
  void rmsnorm(const float* x, const Weight& weight, float* out, int64_t rows, int64_t dim,
               float eps) override {
    if (skip()) return;
    Scope s(this, kNorm);
    if (dropped(kDropNorm)) return;
    cuda::rmsnorm(x, ref::f32_data(weight), out, rows, dim, eps, stream_);
  }
  void add_rmsnorm(float* x, const float* delta, const Weight& weight, float* out, int64_t rows,
                   int64_t dim, float eps) override {
    if (skip()) return;
    Scope s(this, kNorm);
    if (dropped(kDropNorm)) return;
    cuda::add_rmsnorm(x, delta, ref::f32_data(weight), out, rows, dim, eps, stream_);
  }
  void rope_neox(float* x, int n_heads, int head_dim, int64_t token_stride, int n_rot,
                 float theta) override {
    if (skip()) return;
    Scope s(this, kRope);
    cuda::rope_neox(x, dstep_.positions, dstep_.n, n_heads, head_dim, token_stride, n_rot, theta,
                    stream_);
  }
  void attention_heads(const AttentionHeadsArgs& a) override {
    if (!cuda::attention_heads_fit(a.head_dim, a.n_rot)) return Ops::attention_heads(a);
    if (skip()) return;
    Scope s(this, kRope);
    if (dropped(kDropHeads)) return;
    cuda::attention_heads(a.q_gate, ref::f32_data(*a.q_norm), ref::f32_data(*a.k_norm), a.q, a.gate,
                          a.k, dstep_.positions, a.n, a.n_head, a.n_head_kv, a.head_dim, a.n_rot,
                          a.rope_theta, a.eps, stream_);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::silu_mul(gate, up, out, n, stream_);
  }
  void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                   int64_t cols) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::sigmoid_mul(x, gate, gate_stride, out, rows, cols, stream_);
  }
  void add(const float* a, const float* b, float* out, int64_t n) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::add(a, b, out, n, stream_);
  }
  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::copy_2d(src, src_stride, dst, dst_stride, rows, cols, stream_);
  }
  void gather_output_rows(const float* x, int64_t dim, float* out) override {
    if (skip()) return;
    Scope s(this, kElementwise);
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
    Scope s(this, kFfn);
    cuda::matmul_swiglu(g, u, x, mid, n, ws_, stream_);
    prefetch_after({g, u}, n, stream_);
    cuda::matmul(d, mid, out, n, ws_, stream_);
    prefetch_after({d}, n, stream_);
  }

  // ---- Blocks ----
  void attention(const AttentionArgs& a) override {
    cuda::DeviceStep step = dstep_;
    step.max_tokens = dstep_.page_table_stride * a.kv.page_size;
    if (skip(cuda::attention_workspace_bytes(step, a.n_head, a.head_dim))) return;
    Scope s(this, kAttention);
    if (dropped(kDropAttention)) return;
    cuda::attention(step, a, ws_, stream_);
  }
  void deltanet(const DeltaNetArgs& a) override {
    if (skip(cuda::deltanet_workspace_bytes(dstep_, a))) return;
    Scope s(this, kDeltaNet);
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
                       int64_t dim, float eps) override {
    if (weight.view.n_elements() != groups * dim) {
      fail("rmsnorm_grouped: tensor '{}' has {} elements, expected {} groups x {}", weight.name,
           weight.view.n_elements(), groups, dim);
    }
    if (skip()) return;
    Scope s(this, kNorm);
    cuda::rmsnorm_grouped(x, ref::f32_data(weight), out, rows, groups, dim, eps, stream_);
  }
  void silu_scaled(const float* x, float scale, float* out, int64_t n) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::silu_scaled(x, scale, out, n, stream_);
  }
  void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc,
              int64_t dim) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::hc_mix(xn, gate, out, n, hc, dim, stream_);
  }
  void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
                 int64_t dim) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::hc_inject(streams, block, inject, n, hc, dim, stream_);
  }
  void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
                int hc, int64_t dim) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::ple_gate(key, query, value, out, n, hc, dim, stream_);
  }
  void ple_conv(const PleConvArgs& a) override {
    if (skip()) return;
    Scope s(this, kElementwise);
    cuda::ple_conv(dstep_, a, stream_);
  }

  // The PLE n-gram rows: the table stays in the mapped file (tens of GB in the released model;
  // for_each_weight does not place it), so the host hashes each row's context (the slot's
  // remembered tokens, mirrored on the host: PleShadow) with ref's code, dequantises the rows into
  // a pinned buffer and uploads them; a kernel writes the slots' new remembered tokens. During a
  // replayed step the host still fills the pinned buffer (the graph's copies read it when the
  // graph runs, at sample), so decode steps stay capturable.
  void ple_embed(const PleEmbedArgs& a) override {
    const StepLayout& step = host_step_;
    const int ctx_len = a.ngram - 1, hr = a.state.history_rows;
    const int64_t heads = int64_t{ctx_len} * a.heads_per_ngram, head_dim = a.table.view.ne[0];
    if (!a.state.ple_tokens) fail("ple_embed: the layer has no PLE token state");
    if (step.keep_states && (hr < 1 || !a.state.ple_tokens_history))
      fail("ple_embed: a span keeps its states but the layer has no PLE token history");
    check_host_table(a.table);
    const bool keep = step.keep_states;
    const int64_t rows_bytes = round_up(step.n * heads * head_dim * 4, 256);
    const int64_t tokens_bytes = round_up(int64_t{step.n_spans} * ctx_len * 4, 256);
    const int64_t history_bytes =
        keep ? round_up(int64_t{step.n_spans} * hr * ctx_len * 4, 256) : 0;
    float* staged = alloc((tokens_bytes + history_bytes) / 4);  // device: tokens, then history
    PleShadow& shadow = ple_shadow(a.state.ple_tokens, ctx_len);
    uint8_t* stage = ple_stage(rows_bytes + tokens_bytes + history_bytes);
    const bool replay = skip();
    // The rows and the slots' new tokens on the host (shadow.host is updated in place).
    const int64_t n_slots = shadow.floats / ctx_len;
    std::vector<float> history(keep ? static_cast<size_t>(n_slots * hr * ctx_len) : 0);
    const RecurrentLayer host_state{.history_rows = hr,
                                    .ple_tokens = shadow.host.data(),
                                    .ple_tokens_history = keep ? history.data() : nullptr};
    const PleEmbedArgs host{.table = a.table,
                            .ngram = a.ngram,
                            .heads_per_ngram = a.heads_per_ngram,
                            .eos = a.eos,
                            .multipliers = a.multipliers,
                            .offsets = a.offsets,
                            .vocab = a.vocab,
                            .state = host_state,
                            .out = reinterpret_cast<float*>(stage)};
    for (int s = 0; s < step.n_spans; ++s) {
      if (step.spans[s].slot < 0 || step.spans[s].slot >= n_slots)
        fail("ple_embed: slot {} outside the {} slots of the PLE token state", step.spans[s].slot,
             n_slots);
    }
    ref::ple_embed_spans(step, host);
    auto* tokens = reinterpret_cast<float*>(stage + rows_bytes);
    auto* hist = reinterpret_cast<float*>(stage + rows_bytes + tokens_bytes);
    for (int s = 0; s < step.n_spans; ++s) {
      const int64_t slot = step.spans[s].slot;
      std::memcpy(tokens + int64_t{s} * ctx_len, shadow.host.data() + slot * ctx_len,
                  static_cast<size_t>(ctx_len) * 4);
      if (keep) {
        std::memcpy(hist + int64_t{s} * hr * ctx_len, history.data() + slot * hr * ctx_len,
                    static_cast<size_t>(hr) * ctx_len * 4);
      }
    }
    if (replay) return;
    Scope s(this, kEmbed);
    if (step.n > 0) {
      QWENRT_CUDA_CHECK(cudaMemcpyAsync(a.out, stage,
                                        static_cast<size_t>(step.n * heads * head_dim * 4),
                                        cudaMemcpyHostToDevice, stream_));
    }
    QWENRT_CUDA_CHECK(cudaMemcpyAsync(staged, stage + rows_bytes,
                                      static_cast<size_t>(tokens_bytes + history_bytes),
                                      cudaMemcpyHostToDevice, stream_));
    cuda::ple_tokens_update(dstep_, staged, keep ? staged + tokens_bytes / 4 : nullptr, a.state,
                            ctx_len, stream_);
  }

  // While no query of the step sees more complete blocks than the budget keeps (for every QSA
  // layer seen: qsa_sparse_, part of the graph key), QSA is dense causal attention: the raw
  // indexer keys into their pages, then attention.cu's kernels where they take the head size.
  // Otherwise qsa.cu's selection and attention.
  void qsa_attention(const QsaArgs& a) override {
    cuda::DeviceStep step = dstep_;
    step.max_tokens = dstep_.page_table_stride * a.attn.kv.page_size;
    if (qsa_configs_.insert({a.ratio, a.budget}).second && a.ratio > 0 &&
        drops_blocks(a.ratio, a.budget) && !qsa_sparse_) {
      if (mode_ != Mode::kEager)
        fail("cuda backend: a QSA layer first seen inside a captured step");
      qsa_sparse_ = true;
    }
    const bool dense = !qsa_sparse_ && attention_head_dim_ok(a.attn.head_dim);
    const int64_t ws = dense ? cuda::attention_workspace_bytes(step, a.attn.n_head, a.attn.head_dim)
                             : cuda::qsa_workspace_bytes(step, a);
    if (skip(ws)) return;
    Scope s(this, kAttention);
    if (dense) {
      cuda::qsa_write_index_keys(step, a, stream_);
      cuda::attention(step, a.attn, ws_, stream_);
      return;
    }
    cuda::qsa_attention(step, a, ws_, stream_);
  }

  void stream_experts(const ExpertStreaming&) override {
    fail(
        "the cuda backend does not stream routed experts from the file (it holds every weight in "
        "device memory): drop --expert-cache, or use --backend cpu to stream them");
  }

  // ---- The end of a step ----
  void sample(const float* logits, int64_t n_vocab, const SamplingRow* rows, int n_top,
              SampledToken* out) override {
    end_capture(nullptr);
    const int64_t n_rows = host_step_.n_output_rows;
    if (n_rows == 0) return;
    // Pack the rows and their arrays, validated as ref does.
    int64_t n_bias = 0, n_hist = 0;
    for (int64_t i = 0; i < n_rows; ++i) {
      n_bias += static_cast<int64_t>(rows[i].logit_bias.size());
      n_hist += static_cast<int64_t>(rows[i].history.size());
    }
    const int64_t rows_bytes = round_up(n_rows * int64_t{sizeof(cuda::DeviceSamplingRow)}, 256);
    const int64_t bias_ids_off = rows_bytes,
                  bias_val_off = bias_ids_off + round_up(n_bias * 4, 256);
    const int64_t hist_off = bias_val_off + round_up(n_bias * 4, 256);
    const int64_t total = hist_off + round_up(n_hist * 4, 256);
    uint8_t* host = sample_stage_.get(total);
    auto* drows = reinterpret_cast<cuda::DeviceSamplingRow*>(host);
    auto* bias_ids = reinterpret_cast<int32_t*>(host + bias_ids_off);
    auto* bias_vals = reinterpret_cast<float*>(host + bias_val_off);
    auto* hist = reinterpret_cast<int32_t*>(host + hist_off);
    int32_t nb = 0, nh = 0;
    for (int64_t i = 0; i < n_rows; ++i) {
      const SamplingRow& r = rows[i];
      cuda::DeviceSamplingRow& d = drows[i];
      d.temperature = r.temperature;
      d.top_p = r.top_p;
      d.min_p = r.min_p;
      d.top_k = r.top_k;
      d.presence_penalty = r.presence_penalty;
      d.frequency_penalty = r.frequency_penalty;
      d.repetition_penalty = r.repetition_penalty;
      d.bias_begin = nb;
      d.bias_count = static_cast<int32_t>(r.logit_bias.size());
      for (const auto& [id, bias] : r.logit_bias) {
        if (id < 0 || id >= n_vocab) {
          fail("logit_bias: token id {} is outside the vocabulary of {}", id, n_vocab);
        }
        bias_ids[nb] = id;
        bias_vals[nb++] = bias;
      }
      d.history_begin = nh;
      d.history_count = static_cast<int32_t>(r.history.size());
      for (int32_t t : r.history) hist[nh++] = t;
      d.u = r.u;
      d.n_top = n_top;
    }
    bool plain_greedy = n_top == 0;
    for (int64_t i = 0; i < n_rows && plain_greedy; ++i) {
      const SamplingRow& r = rows[i];
      plain_greedy = r.temperature == 0 && r.logit_bias.empty() && r.presence_penalty == 0 &&
                     r.frequency_penalty == 0 && r.repetition_penalty == 1;
    }
    uint8_t* dev = sample_dev_.get(total);
    QWENRT_CUDA_CHECK(
        cudaMemcpyAsync(dev, host, static_cast<size_t>(total), cudaMemcpyHostToDevice, stream_));
    const int64_t out_bytes = n_rows * int64_t{sizeof(SampledToken)};
    auto* dout = reinterpret_cast<SampledToken*>(sample_out_dev_.get(out_bytes));
    {
      Scope s(this, kSample);
      if (plain_greedy && n_rows <= 65535) {
        void* ws = arena_.take(cuda::sample_greedy_workspace_bytes(n_rows));
        cuda::sample_greedy(logits, n_vocab, n_rows, dout, ws, stream_);
      } else {
        void* ws = arena_.take(cuda::sample_workspace_bytes(n_rows, n_vocab));
        cuda::sample(logits, n_vocab, reinterpret_cast<const cuda::DeviceSamplingRow*>(dev), n_rows,
                     reinterpret_cast<const int32_t*>(dev + bias_ids_off),
                     reinterpret_cast<const float*>(dev + bias_val_off),
                     reinterpret_cast<const int32_t*>(dev + hist_off), dout, ws, stream_);
      }
    }
    auto* hout = reinterpret_cast<SampledToken*>(sample_out_host_.get(out_bytes));
    QWENRT_CUDA_CHECK(cudaMemcpyAsync(hout, dout, static_cast<size_t>(out_bytes),
                                      cudaMemcpyDeviceToHost, stream_));
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (profile_) profiler_.collect();
    for (int64_t i = 0; i < n_rows; ++i) {
      if (hout[i].id < 0) fail("sampling: every token was excluded");
      out[i] = hout[i];
    }
  }

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

  uint8_t* weight_memory(int64_t bytes) {
    bytes = round_up(bytes, 256);
    if (weight_chunk_ == nullptr || weight_used_ + bytes > weight_chunk_size_) {
      weight_chunk_size_ = std::max(kWeightChunk, bytes);
      void* p = nullptr;
      if (cudaMalloc(&p, static_cast<size_t>(weight_chunk_size_)) != cudaSuccess) {
        cudaGetLastError();
        fail("cuda backend: out of device memory placing the weights ({} bytes placed so far)",
             placed_bytes_);
      }
      weight_chunk_ = static_cast<uint8_t*>(p);
      weight_chunks_[reinterpret_cast<uintptr_t>(p)] =
          reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(weight_chunk_size_);
      weight_used_ = 0;
    }
    uint8_t* p = weight_chunk_ + weight_used_;
    weight_used_ += bytes;
    return p;
  }

  // The step's arrays in one pinned buffer, then one copy to the device.
  void upload_layout(const StepLayout& l) {
    int max_slot = -1;
    int64_t max_count = 0;
    for (int s = 0; s < l.n_spans; ++s) {
      max_slot = std::max(max_slot, static_cast<int>(l.spans[s].slot));
      max_count = std::max<int64_t>(max_count, l.spans[s].count);
    }
    const int64_t pt_ints = (max_slot + 1) * l.page_table_stride;
    const int64_t tok_off = 0, pos_off = round_up(l.n * 4, 256);
    const int64_t span_off = pos_off + round_up(l.n * 4, 256);
    const int64_t out_off = span_off + round_up(l.n_spans * int64_t{sizeof(Span)}, 256);
    const int64_t pt_off = out_off + round_up(l.n_output_rows * 4, 256);
    const int64_t total = pt_off + round_up(pt_ints * 4, 256);
    uint8_t* host = layout_stage_.get(total);
    if (l.n) {
      std::memcpy(host + tok_off, l.tokens, l.n * 4);
      std::memcpy(host + pos_off, l.positions, l.n * 4);
    }
    if (l.n_spans) std::memcpy(host + span_off, l.spans, l.n_spans * sizeof(Span));
    if (l.n_output_rows) std::memcpy(host + out_off, l.output_rows, l.n_output_rows * 4);
    if (pt_ints) std::memcpy(host + pt_off, l.page_tables, pt_ints * 4);
    bool grew = false;
    uint8_t* dev = layout_dev_.get(total, &grew);
    if (grew) ++layout_generation_;
    QWENRT_CUDA_CHECK(
        cudaMemcpyAsync(dev, host, static_cast<size_t>(total), cudaMemcpyHostToDevice, stream_));
    dstep_ = {.tokens = reinterpret_cast<const int32_t*>(dev + tok_off),
              .positions = reinterpret_cast<const int32_t*>(dev + pos_off),
              .n = l.n,
              .spans = reinterpret_cast<const Span*>(dev + span_off),
              .n_spans = l.n_spans,
              .output_rows = reinterpret_cast<const int32_t*>(dev + out_off),
              .n_output_rows = l.n_output_rows,
              .page_tables = reinterpret_cast<const int32_t*>(dev + pt_off),
              .page_table_stride = l.page_table_stride,
              .max_tokens = 0,
              .max_span_count = max_count,
              .deltanet_mode = l.deltanet_mode,
              .keep_states = l.keep_states};
    // A graph bakes in these addresses: the offsets follow from n, n_spans and n_output_rows (part
    // of its key), the buffer's address from layout_generation_.
  }

  uint64_t generation() const {
    uint64_t g = 0;
    for (uint64_t part : {arena_.generation(), scratch_.generation(), side_scratch_.generation(),
                          layout_generation_, ple_stage_generation_, counter_generation_})
      g = g * 1000003u + part;
    return g;
  }

  void choose_mode(const StepLayout& l) {
    mode_ = Mode::kEager;
    if (!graphs_enabled_ || !l.ends_in_sample || l.n > kMaxGraphRows) return;
    // The last element: the DeltaNet mode, whether the step keeps states (a launch more) and
    // whether QSA layers drop blocks (other kernels than dense attention).
    const GraphKey key{l.n, l.n_spans, l.n_output_rows, dstep_.max_span_count,
                       (static_cast<int>(l.deltanet_mode) * 2 + (l.keep_states ? 1 : 0)) * 2 +
                           (qsa_sparse_ ? 1 : 0)};
    auto it = graphs_.find(key);
    if (it != graphs_.end() && it->second.generation == generation()) {
      mode_ = Mode::kReplay;
      replay_ = &it->second;
      op_count_ = 0;
      return;
    }
    if (it != graphs_.end()) {  // addresses moved since it was captured
      QWENRT_CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
      graphs_.erase(it);
    }
    if (seen_[key]++ == 0) return;  // the first step of a shape runs eagerly (warm-up)
    mode_ = Mode::kCapture;
    capture_key_ = key;
    capture_generation_ = generation();
    op_count_ = 0;
    QWENRT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  }

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
  void touch_ple_tokens(const void* dst, int64_t bytes) {
    const auto* p = static_cast<const uint8_t*>(dst);
    for (PleShadow& sh : ple_shadows_) {
      const auto* begin = reinterpret_cast<const uint8_t*>(sh.dev);
      if (p < begin + sh.floats * 4 && begin < p + bytes) sh.stale = true;
    }
  }
  void read_ple_tokens(PleShadow& sh) {
    if (mode_ == Mode::kReplay)
      fail("cuda backend: the PLE token state changed inside a replayed step");
    // Inside a capture the graph so far runs and the step goes on eagerly (never captured again).
    if (mode_ == Mode::kCapture) end_capture("a read of the PLE token state");
    sh.host.resize(static_cast<size_t>(sh.floats));
    QWENRT_CUDA_CHECK(cudaMemcpyAsync(sh.host.data(), sh.dev, static_cast<size_t>(sh.floats) * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    sh.stale = false;
  }
  PleShadow& ple_shadow(float* dev, int ctx_len) {
    for (PleShadow& sh : ple_shadows_) {
      if (sh.dev != dev) continue;
      if (sh.stale) read_ple_tokens(sh);
      return sh;
    }
    auto it = buffer_bytes_.find(dev);
    if (it == buffer_bytes_.end() || it->second % (int64_t{ctx_len} * 4) != 0)
      fail("cuda backend: ple_embed's token state must be a whole alloc_buffer of [n_slots, {}]",
           ctx_len);
    ple_shadows_.push_back({.dev = dev, .floats = it->second / 4});
    read_ple_tokens(ple_shadows_.back());
    return ple_shadows_.back();
  }
  // The pinned buffer of the step's i-th ple_embed call (one per call, so a later call never
  // overwrites what an earlier copy still reads). Growing it moves it: the generation changes.
  uint8_t* ple_stage(int64_t bytes) {
    const size_t i = static_cast<size_t>(ple_calls_++);
    if (i >= ple_stages_.size()) ple_stages_.push_back({std::make_unique<PinnedBuffer>(), 0});
    auto& [buffer, capacity] = ple_stages_[i];
    if (bytes > capacity) {
      if (mode_ == Mode::kReplay)
        fail("cuda backend: the PLE staging buffer grew inside a replayed step");
      if (mode_ == Mode::kCapture) end_capture("a growing PLE staging buffer");
      QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no copy still reads the old one
      capacity = bytes;
      ++ple_stage_generation_;
    }
    return buffer->get(bytes);
  }
  // The PLE table is read on the host: it must be the mapped file's bytes, not a placed copy.
  void check_host_table(const Weight& table) {
    if (table.view.data == checked_table_) return;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, table.view.data) == cudaSuccess &&
        attr.type == cudaMemoryTypeDevice) {
      fail("ple_embed: tensor '{}' is in device memory; the cuda backend reads it on the host",
           table.name);
    }
    cudaGetLastError();
    checked_table_ = table.view.data;
  }
  // Whether some span of the step holds more complete blocks of `ratio` than `budget` keeps.
  bool drops_blocks(int ratio, int budget) const {
    if (ratio <= 0) return false;
    for (int s = 0; s < host_step_.n_spans; ++s) {
      const Span& sp = host_step_.spans[s];
      if ((int64_t{sp.n_past} + sp.count) / ratio > budget / ratio) return true;
    }
    return false;
  }

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
                                      int n_expert, int k) {
    const Matrix router = matrix(w.router);
    cuda::NormRouteArgs a{};
    a.x = in.x;
    a.delta = in.delta;
    a.norm = ref::f32_data(*in.norm);
    a.eps = in.eps;
    a.h = in.h;
    a.n = n;
    a.dim = in.dim;
    a.router = router.dtype == DType::F32 && router.in == in.dim && router.out == n_expert
                   ? static_cast<const float*>(router.data)
                   : nullptr;
    a.n_expert = n_expert;
    a.k = k;
    a.counters = counters(cuda::kNormRouteMaxRows);
    a.gate_inp = w.shared_gate_inp.present() ? ref::f32_data(w.shared_gate_inp) : nullptr;
    return a;
  }

  // The MoE block on x; with `pre`, x is pre->h, made by the routing kernel from pre's add and
  // norm (a decode-sized step: add_rmsnorm_moe).
  void moe_block(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert, int k,
                 const NormedInput* pre) {
    if (w.expert_base != 0 || w.down_exps.view.ne[2] != n_expert)
      fail("cuda moe: expert parallelism is not implemented on this backend yet");
    const int64_t dim = w.down_exps.view.ne[1];
    const bool fused = w.gate_up_exps.present();
    const Matrix gate_up = fused ? matrix(w.gate_up_exps) : Matrix{};
    Matrix gate = fused ? gate_up : matrix(w.gate_exps);
    Matrix up = fused ? gate_up : matrix(w.up_exps);
    if (fused) {  // gate rows, then up rows, of each expert
      gate.out = up.out = gate_up.out / 2;
      up.data = static_cast<const uint8_t*>(gate_up.data) + gate.out * gate_up.row_bytes;
    }
    const Matrix down = matrix(w.down_exps), router = matrix(w.router);
    const int64_t ff = gate.out;
    const bool shared = w.shared_down.present();
    float* logits = alloc(n * n_expert);
    auto* ids = reinterpret_cast<int32_t*>(alloc(n * k));
    float* weights = alloc(n * k);
    float* mid = alloc(n * k * ff);
    float* routed = shared ? alloc(n * dim) : out;
    float* pairs = alloc(n * k * dim);
    const Matrix sg = shared ? matrix(w.shared_gate) : Matrix{};
    const Matrix su = shared ? matrix(w.shared_up) : Matrix{};
    const Matrix sd = shared ? matrix(w.shared_down) : Matrix{};
    const int64_t sff = shared ? sg.out : 0;
    float* smid = shared ? alloc(n * sff) : nullptr;
    float* sout = shared ? alloc(n * dim) : nullptr;
    float* shared_scale = shared ? alloc(n) : nullptr;
    int64_t ws_bytes = std::max({cuda::matmul_workspace_bytes(router, n),
                                 cuda::matmul_workspace_bytes(gate, n * k),
                                 cuda::matmul_workspace_bytes(down, n * k)});
    if (shared) {
      ws_bytes = std::max({ws_bytes, cuda::matmul_swiglu_workspace_bytes(sg, n),
                           cuda::matmul_workspace_bytes(sd, n)});
    }
    // Many rows: the routed experts as grouped GEMMs over the pairs ordered by expert.
    // On int8 tensor cores where the types allow (QWENRT_CUDA_MOE_MMQ=0: the bf16 kernels).
    const bool mmq =
        n >= mmq_min_rows_ && cuda::mmq_experts_enabled() && cuda::mmq_experts_fit(gate, up, down);
    const bool grouped = !mmq && n >= grouped_min_rows_ && cuda::grouped_experts_fit(gate) &&
                         cuda::grouped_experts_fit(down);
    void* order_ws =
        grouped || mmq ? arena_.take(cuda::expert_order_workspace_bytes(n * k, n_expert)) : nullptr;
    void* mmq_ws =
        mmq ? arena_.take(cuda::mmq_experts_workspace_bytes(n, gate.in, n * k, ff)) : nullptr;
    // The shared expert runs on the side stream, beside the routed experts (its own workspace).
    // (The side stream runs its ops one after another too: its scratch is reused like scratch_.)
    if (shared) side_scratch_.rewind();
    void* side_ws = shared ? side_scratch_.take(ws_bytes) : nullptr;
    if (skip(ws_bytes)) return;
    Scope s(this, kMoe);
    // The chosen experts' weights asked into L2 by the routing kernel (decode-sized steps): the
    // down halves arrive while the gate and up GEMVs run.
    cuda::ExpertPrefetch expert_prefetch;
    if (n <= kMaxPrefetchRows && !mmq && !grouped) {
      const Matrix* chosen[] = {&down, &gate, &up};
      for (int i = 0; i < prefetcher_->expert_tensors(); ++i) {
        const Matrix& m = *chosen[i];
        if (!placed(m.data, (m.n_expert - 1) * m.expert_bytes + m.out * m.row_bytes)) continue;
        expert_prefetch.base[i] = m.data;
        expert_prefetch.stride[i] = m.expert_bytes;  // a fused gate_up: both halves' stride
        expert_prefetch.bytes[i] = m.out * m.row_bytes;
      }
    }
    // One decode row with a shared expert: the routed and shared experts side by side in two
    // launches on this stream (cuda::moe_row) where the types have that pair of kernels.
    const cuda::MoeRow row{.gate = gate,
                           .up = up,
                           .down = down,
                           .shared_gate = sg,
                           .shared_up = su,
                           .shared_down = sd,
                           .ids = ids,
                           .weights = weights,
                           .k = k,
                           .h = x,
                           .mid = mid,
                           .shared_mid = smid,
                           .shared_scale = shared_scale,
                           .out = out};
    const bool one_row = n == 1 && shared && moe_row_ && down_combine_ && !mmq && !grouped &&
                         !dropped(kDropShared) && !dropped(kDropExperts) &&
                         !dropped(kDropCombine) && cuda::moe_row(row, false, stream_);
    if (pre) {  // x = pre->h is written by this kernel
      cuda::NormRouteArgs a = norm_route_args(*pre, w, n, n_expert, k);
      a.logits = logits;
      a.ids = ids;
      a.weights = weights;
      a.shared_scale = shared_scale;
      a.prefetch = expert_prefetch;
      // The routing and the row's experts in one launch where there is that kernel.
      if (one_row && cuda::moe_row(row, true, stream_, &a)) {
        prefetch_after({router}, n, stream_);
        return;
      }
      cuda::moe_norm_route(a, stream_);
      prefetch_after({router}, n, stream_);
    }
    if (shared && !one_row && !dropped(kDropShared)) {
      QWENRT_CUDA_CHECK(cudaEventRecord(fork_, stream_));
      QWENRT_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
      cuda::matmul_swiglu(sg, su, x, smid, n, side_ws, side_);
      prefetch_after({sg, su}, n, side_);
      cuda::matmul(sd, smid, sout, n, side_ws, side_);
      prefetch_after({sd}, n, side_);
      QWENRT_CUDA_CHECK(cudaEventRecord(join_, side_));
    }
    if (!pre) {
      if (!dropped(kDropRouter)) cuda::matmul(router, x, logits, n, ws_, stream_);
      prefetch_after({router}, n, stream_);
      cuda::moe_route(logits, n, n_expert, k, ids, weights, x,
                      shared ? ref::f32_data(w.shared_gate_inp) : nullptr, dim, shared_scale,
                      stream_, expert_prefetch);
    }
    if (one_row) {
      cuda::moe_row(row, true, stream_);
      return;
    }
    if (mmq) {
      const cuda::ExpertOrder order = cuda::order_by_expert(
          ids, n * k, n_expert, cuda::mmq_tile_rows(n * k, n_expert), order_ws, stream_);
      cuda::mmq_experts(gate, up, down, order, k, x, n, pairs, mmq_ws, stream_);
      if (shared) QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
      cuda::moe_combine_pairs(pairs, weights, k, sout, shared_scale, out, n, dim, stream_);
      return;
    }
    if (grouped) {
      const cuda::ExpertOrder order =
          cuda::order_by_expert(ids, n * k, n_expert, cuda::grouped_tile_rows(), order_ws, stream_);
      cuda::grouped_experts_swiglu(gate, up, order, k, x, mid, stream_);
      cuda::grouped_experts_down(down, order, mid, pairs, stream_);
      if (shared) QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
      cuda::moe_combine_pairs(pairs, weights, k, sout, shared_scale, out, n, dim, stream_);
      return;
    }
    const bool experts = !dropped(kDropExperts);
    if (experts) cuda::experts_swiglu(gate, up, ids, k, x, mid, n, ws_, stream_);
    // The routed down, the weighted sum and the shared expert in one launch where it fits
    // (QWENRT_CUDA_DOWN_COMBINE=0: the down pairs, then the combine).
    if (down_combine_ && experts && !dropped(kDropCombine)) {
      if (shared && !dropped(kDropShared))
        QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
      if (cuda::experts_down_combine(down, ids, weights, k, mid, sout, shared_scale, out, n,
                                     stream_))
        return;
    }
    // Each routed expert's down on its own warps, summed with the shared expert in the combine;
    // the looping kernel where the type has no staged path.
    if (!experts || cuda::experts_down_pairs(down, ids, k, mid, pairs, n, ws_, stream_)) {
      if (shared && !dropped(kDropShared))
        QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
      if (!dropped(kDropCombine))
        cuda::moe_combine_pairs(pairs, weights, k, sout, shared_scale, out, n, dim, stream_);
      return;
    }
    cuda::experts_down(down, ids, weights, k, mid, routed, n, ws_, stream_);
    if (shared) {
      QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
      cuda::moe_combine(routed, sout, shared_scale, out, n, dim, stream_);
    }
  }

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
  static unsigned parse_drop(const char* v) {
    if (v == nullptr) return 0;
    static constexpr std::pair<const char*, unsigned> kNames[] = {
        {"norm", kDropNorm},     {"matmul", kDropMatmul},       {"group", kDropGroup},
        {"heads", kDropHeads},   {"attention", kDropAttention}, {"deltanet", kDropDeltaNet},
        {"router", kDropRouter}, {"experts", kDropExperts},     {"combine", kDropCombine},
        {"shared", kDropShared}};
    unsigned mask = 0;
    std::string list(v);
    for (size_t at = 0; at <= list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      const std::string name = list.substr(at, end - at);
      bool known = name.empty();
      for (const auto& [n, bit] : kNames) {
        if (name == n) {
          mask |= bit;
          known = true;
        }
      }
      if (!known) fail("QWENRT_CUDA_DROP: unknown kernel class '{}'", name);
      at = end + 1;
    }
    return mask;
  }
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
  void end_capture(const char* what) {
    if (mode_ == Mode::kCapture) {
      prefetcher_->join(stream_);
      cudaGraph_t graph = nullptr;
      QWENRT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      Graph g;
      QWENRT_CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
      QWENRT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g.n_nodes));
      QWENRT_CUDA_CHECK(cudaGraphDestroy(graph));
      g.generation = capture_generation_;
      g.n_ops = op_count_;
      QWENRT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
      if (g.generation != generation() || what) {
        QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
        QWENRT_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
        if (what) seen_[capture_key_] = -1000000;  // never again for this shape
      } else {
        log(LogLevel::kInfo, "cuda: captured a {}-row step: {} ops, {} graph nodes",
            std::get<0>(capture_key_), g.n_ops, g.n_nodes);
        graphs_[capture_key_] = g;
      }
    } else if (mode_ == Mode::kReplay) {
      if (what) fail("cuda backend: {} inside a replayed step", what);
      if (op_count_ != replay_->n_ops) {
        fail("cuda backend: a replayed step called {} ops, its graph holds {}", op_count_,
             replay_->n_ops);
      }
      QWENRT_CUDA_CHECK(cudaGraphLaunch(replay_->exec, stream_));
    }
    mode_ = Mode::kEager;
  }

  void abort_capture() {
    cudaGraph_t graph = nullptr;
    prefetcher_->join(stream_, false);
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    mode_ = Mode::kEager;
  }

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
  int64_t op_count_ = 0;

  std::unique_ptr<cuda::L2Prefetcher> prefetcher_;

  bool profile_ = false;
  cuda::OpProfiler profiler_;
};

}  // namespace

bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return count > 0;
  }();
  return available;
}

std::string cuda_unsupported(int head_dim, int ssm_head_dim) {
  // The limits attention.cu and deltanet.cu check at every call.
  if (!attention_head_dim_ok(head_dim))
    return fmt::format("attention head_dim {} (the kernels take 64, 128 or 256)", head_dim);
  if (ssm_head_dim < 1 || ssm_head_dim > 256)
    return fmt::format("DeltaNet head_dim {} (the kernels take at most 256)", ssm_head_dim);
  return "";
}

std::unique_ptr<Ops> make_cuda_ops(int device) {
  if (!cuda_available()) fail("cuda backend: no usable GPU (cudaGetDeviceCount found none)");
  return std::make_unique<CudaOps>(device);
}

}  // namespace qwenrt::ops
