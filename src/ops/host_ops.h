// What every host-memory backend (ref, cpu) does the same way: persistent buffers from calloc
// (fresh zero pages, so state pools cost memory only where written), plain copies, and the step's
// layout kept as given.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "ops/host_group.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops {

// The conv state after each row r < min(count - 1, history_rows) of a keep_states span, from the
// slot's conv state before the step (`state` [K-1, C]) and the span's inputs x [count, C] (rows
// x_stride apart): the last K-1 inputs up to row r, oldest first, into history [rows, K-1, C].
inline void keep_conv_history(const float* state, const float* x, int64_t x_stride, int K,
                              int64_t channels, int64_t count, int history_rows, float* history) {
  const int64_t rows = std::min<int64_t>(count - 1, history_rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < K - 1; ++j) {
      const int64_t i = r + 1 + j;  // in the sequence (K-1 state rows, then x)
      const float* src = i < K - 1 ? state + i * channels : x + (i - (K - 1)) * x_stride;
      std::memcpy(history + (r * (K - 1) + j) * channels, src, channels * 4);
    }
  }
}

class HostOps : public Ops {
 public:
  void* alloc_buffer(int64_t bytes) override {
    void* p = std::calloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 1);
    if (!p) fail("{} backend: out of memory allocating {} bytes", name(), bytes);
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
  void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memmove(dst + r * dst_stride, src + r * src_stride, cols * 4);
  }
  void gather_output_rows(const float* x, int64_t dim, float* out) override {
    for (int64_t i = 0; i < step_.n_output_rows; ++i)
      std::memcpy(out + i * dim, x + step_.output_rows[i] * dim, dim * 4);
  }

  // qwen4exp's own ops, on the reference kernels for every host backend.
  void rmsnorm_grouped(const float* x, const Weight& weight, float* out, int64_t rows, int groups,
                       int64_t dim, float eps) override {
    ref::rmsnorm_grouped(x, ref::f32_data(weight), out, rows, groups, dim, eps);
  }
  void silu_scaled(const float* x, float scale, float* out, int64_t n) override {
    ref::silu_scaled(x, scale, out, n);
  }
  void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc,
              int64_t dim) override {
    ref::hc_mix(xn, gate, out, n, hc, dim);
  }
  void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
                 int64_t dim) override {
    ref::hc_inject(streams, block, inject, n, hc, dim);
  }
  void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
                int hc, int64_t dim) override {
    ref::ple_gate(key, query, value, out, n, hc, dim);
  }
  void ple_embed(const PleEmbedArgs& a) override { ref::ple_embed_spans(step_, a); }
  void ple_conv(const PleConvArgs& a) override { ref::ple_conv_spans(step_, a); }
  void qsa_attention(const QsaArgs& a) override { ref::qsa_attention_spans(step_, a); }

  void join_host_group(std::shared_ptr<HostGroup> group, int rank) override {
    group_ = std::move(group);
    rank_ = rank;
  }
  void all_reduce_sum(float* x, int64_t n) override {
    if (group_) group_->all_reduce_sum(rank_, x, n);
  }

 protected:
  StepLayout step_;
  std::shared_ptr<HostGroup> group_;
  int rank_ = 0;
};

}  // namespace qwenrt::ops
