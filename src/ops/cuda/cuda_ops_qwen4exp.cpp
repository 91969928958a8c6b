// The CUDA backend's qwen4exp ops (cuda_ops.h): grouped norms, hyper-connections, the PLE gate,
// conv and n-gram rows (hashed on the host against a mirror of the slots' token state), and QSA.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace qwenrt::ops::cuda {

void CudaOps::rmsnorm_grouped(const float* x, const Weight& weight, float* out, int64_t rows,
                              int groups, int64_t dim, float eps) {
  if (weight.view.n_elements() != groups * dim) {
    fail("rmsnorm_grouped: tensor '{}' has {} elements, expected {} groups x {}", weight.name,
         weight.view.n_elements(), groups, dim);
  }
  if (skip()) return;
  Scope s(this, op_class::kNorm);
  cuda::rmsnorm_grouped(x, ref::f32_data(weight), out, rows, groups, dim, eps, stream_);
}

void CudaOps::silu_scaled(const float* x, float scale, float* out, int64_t n) {
  if (skip()) return;
  Scope s(this, op_class::kElementwise);
  cuda::silu_scaled(x, scale, out, n, stream_);
}

void CudaOps::hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc,
                     int64_t dim) {
  if (skip()) return;
  Scope s(this, op_class::kElementwise);
  cuda::hc_mix(xn, gate, out, n, hc, dim, stream_);
}

void CudaOps::hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
                        int64_t dim) {
  if (skip()) return;
  Scope s(this, op_class::kElementwise);
  cuda::hc_inject(streams, block, inject, n, hc, dim, stream_);
}

void CudaOps::ple_gate(const float* key, const float* query, const float* value, float* out,
                       int64_t n, int hc, int64_t dim) {
  if (skip()) return;
  Scope s(this, op_class::kElementwise);
  cuda::ple_gate(key, query, value, out, n, hc, dim, stream_);
}

void CudaOps::ple_conv(const PleConvArgs& a) {
  if (skip()) return;
  Scope s(this, op_class::kElementwise);
  cuda::ple_conv(dstep_, a, stream_);
}

void CudaOps::ple_embed(const PleEmbedArgs& a) {
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
  const int64_t history_bytes = keep ? round_up(int64_t{step.n_spans} * hr * ctx_len * 4, 256) : 0;
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
  if (mode_ == Mode::kCapture) capture_host_fed_ = true;  // the copies below read `stage`
  Scope s(this, op_class::kEmbed);
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

void CudaOps::qsa_attention(const QsaArgs& a) {
  cuda::DeviceStep step = dstep_;
  step.max_tokens = dstep_.page_table_stride * a.attn.kv.page_size;
  if (qsa_configs_.insert({a.ratio, a.budget}).second && a.ratio > 0 &&
      drops_blocks(a.ratio, a.budget) && !qsa_sparse_) {
    if (mode_ != Mode::kEager) fail("cuda backend: a QSA layer first seen inside a captured step");
    qsa_sparse_ = true;
  }
  const bool dense = !qsa_sparse_ && attention_head_dim_ok(a.attn.head_dim);
  const int64_t ws = dense ? cuda::attention_workspace_bytes(step, a.attn.n_head, a.attn.head_dim)
                           : cuda::qsa_workspace_bytes(step, a);
  if (skip(ws)) return;
  Scope s(this, op_class::kAttention);
  if (dense) {
    cuda::qsa_write_index_keys(step, a, stream_);
    cuda::attention(step, a.attn, ws_, stream_);
    return;
  }
  cuda::qsa_attention(step, a, ws_, stream_);
}

void CudaOps::touch_ple_tokens(const void* dst, int64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(dst);
  for (PleShadow& sh : ple_shadows_) {
    const auto* begin = reinterpret_cast<const uint8_t*>(sh.dev);
    if (p < begin + sh.floats * 4 && begin < p + bytes) sh.stale = true;
  }
}

void CudaOps::read_ple_tokens(PleShadow& sh) {
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

CudaOps::PleShadow& CudaOps::ple_shadow(float* dev, int ctx_len) {
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

uint8_t* CudaOps::ple_stage(int64_t bytes) {
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

void CudaOps::check_host_table(const Weight& table) {
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

bool CudaOps::drops_blocks(int ratio, int budget) const {
  if (ratio <= 0) return false;
  for (int s = 0; s < host_step_.n_spans; ++s) {
    const Span& sp = host_step_.spans[s];
    if ((int64_t{sp.n_past} + sp.count) / ratio > budget / ratio) return true;
  }
  return false;
}

}  // namespace qwenrt::ops::cuda
