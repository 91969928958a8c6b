#include "ops/cpu/deltanet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/host_ops.h"

namespace qwenrt::ops::cpu {
namespace {

// Spans at least this long take the chunked form: below it the WY setup costs more than it saves.
constexpr int kChunkedMinTokens = 16;

// The per-call inputs of the DeltaNet core as the per-level bodies read them.
struct CoreIo {
  const DeltaNetLayerArgs* layer;
  const float* qkv;    // [n, C]
  const float* z;      // [n, Hv*D]
  const float* alpha;  // [n, Hv]
  const float* beta;   // [n, Hv]
  float* out;          // [n, Hv*D]
  float* mixed;        // [n, C] conv output (prefill only)
};

}  // namespace
}  // namespace qwenrt::ops::cpu

#define QWENRT_CPU_BODY "ops/cpu/deltanet_body.inc"
#include "ops/cpu/simd_instances.inc"

namespace qwenrt::ops::cpu {
namespace {

struct SpanTask {
  int span;
  int index;  // channel block or head
  int64_t cost;
};

// (span, index) tasks for every span and index < n_index, costliest (longest span) first.
const std::vector<SpanTask>& span_tasks(const Span* spans, int n_spans, int n_index) {
  thread_local std::vector<SpanTask> tasks;  // reused: no allocation once warm
  tasks.clear();
  for (int s = 0; s < n_spans; ++s) {
    for (int i = 0; i < n_index; ++i) tasks.push_back({s, i, spans[s].count});
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const SpanTask& x, const SpanTask& y) { return x.cost > y.cost; });
  return tasks;
}

void check_head_dim(int D, const char* what) {
  if (D <= 0 || D % 16 != 0) fail("cpu {}: head_dim {} is not a multiple of 16", what, D);
}

void check_layer(const DeltaNetLayerArgs& l) {
  check_head_dim(l.head_dim, "deltanet");
  if (l.conv_k < 1 || l.conv_k > 8)
    fail("cpu deltanet: conv kernel size {} not in [1, 8]", l.conv_k);
  if (l.n_k_heads <= 0 || l.n_v_heads <= 0) {
    fail("cpu deltanet: head counts Hk {} Hv {} must be positive", l.n_k_heads, l.n_v_heads);
  }
}

template <class HeadFn>
void gated_delta(const GatedDeltaBatch& b, const Span* spans, int n_spans, ThreadPool& pool,
                 HeadFn fn) {
  check_head_dim(b.head_dim, "gated_delta");
  const int D = b.head_dim, Hv = b.n_v_heads;
  const auto& tasks = span_tasks(spans, n_spans, Hv);
  run_tasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    const Span& s = spans[tasks[i].span];
    const int h = tasks[i].index, hk = h % b.n_k_heads;
    const int64_t r = s.begin;
    fn(b.q + r * b.q_stride + int64_t{hk} * D, b.q_stride, b.k + r * b.k_stride + int64_t{hk} * D,
       b.k_stride, b.v + r * b.v_stride + int64_t{h} * D, b.v_stride, b.g + r * Hv + h,
       b.beta + r * Hv + h, Hv, b.delta_state + (int64_t{s.slot} * Hv + h) * D * D,
       b.out + r * Hv * D + int64_t{h} * D, int64_t{Hv} * D, s.count, D);
  });
}

}  // namespace

void conv1d_silu(const Span* spans, int n_spans, const float* x, int64_t x_stride,
                 const float* kernel, int K, float* conv_state, float* out, int64_t channels,
                 ThreadPool& pool) {
  if (K < 1 || K > 8) fail("cpu conv1d_silu: kernel size {} not in [1, 8]", K);
  constexpr int64_t kBlock = 256;  // channels per task
  const int n_blocks = static_cast<int>((channels + kBlock - 1) / kBlock);
  const auto& tasks = span_tasks(spans, n_spans, n_blocks);
  auto fn = QWENRT_CPU_PICK(conv_span);
  run_tasks(pool, static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    const Span& s = spans[tasks[i].span];
    const int64_t c0 = tasks[i].index * kBlock, c1 = std::min(channels, c0 + kBlock);
    fn(x + int64_t{s.begin} * x_stride, x_stride, conv_state + int64_t{s.slot} * (K - 1) * channels,
       kernel, K, channels, c0, c1, out + int64_t{s.begin} * channels + c0, channels, s.count);
  });
}

void gated_delta_recurrent(const GatedDeltaBatch& b, const Span* spans, int n_spans,
                           ThreadPool& pool) {
  gated_delta(b, spans, n_spans, pool, QWENRT_CPU_PICK(recurrent_head));
}

void gated_delta_chunked(const GatedDeltaBatch& b, const Span* spans, int n_spans,
                         ThreadPool& pool) {
  gated_delta(b, spans, n_spans, pool, QWENRT_CPU_PICK(chunked_head));
}

void deltanet_decode(const DeltaNetLayerArgs& layer, const Span* spans, int n_spans,
                     const float* qkv, const float* z, const float* alpha, const float* beta,
                     float* out, ThreadPool& pool) {
  check_layer(layer);
  for (int s = 0; s < n_spans; ++s) {
    if (spans[s].count != 1)
      fail("cpu deltanet_decode: span {} has {} rows, not 1", s, spans[s].count);
  }
  const CoreIo io{&layer, qkv, z, alpha, beta, out, nullptr};
  auto fn = QWENRT_CPU_PICK(decode_task);
  const int Hk = layer.n_k_heads;
  run_tasks(pool, int64_t{n_spans} * Hk, [&](int64_t i) { fn(io, spans[i / Hk], int(i % Hk)); });
}

int64_t deltanet_prefill_workspace_floats(const DeltaNetLayerArgs& layer, int64_t n_rows) {
  return n_rows * (2 * int64_t{layer.n_k_heads} + layer.n_v_heads) * layer.head_dim;
}

void deltanet_prefill(const DeltaNetLayerArgs& layer, const Span* spans, int n_spans,
                      const float* qkv, const float* z, const float* alpha, const float* beta,
                      float* out, float* workspace, ThreadPool& pool) {
  check_layer(layer);
  if (std::all_of(spans, spans + n_spans, [](const Span& s) { return s.count == 1; })) {
    deltanet_decode(layer, spans, n_spans, qkv, z, alpha, beta, out, pool);
    return;
  }
  const CoreIo io{&layer, qkv, z, alpha, beta, out, workspace};
  const int64_t C = (2 * int64_t{layer.n_k_heads} + layer.n_v_heads) * layer.head_dim;
  const int64_t conv_floats = int64_t{layer.conv_k - 1} * C;
  for (int s = 0; s < n_spans; ++s) {  // before the conv shifts the state
    const Span& span = spans[s];
    if (!span.keep_states) continue;
    if (!layer.conv_history || !layer.delta_history)
      fail("cpu deltanet: a span keeps its states but the layer has no history");
    keep_conv_history(layer.conv_state + span.slot * conv_floats, qkv + span.begin * C, C,
                      layer.conv_k, C, span.count, layer.history_rows,
                      layer.conv_history + int64_t{span.slot} * layer.history_rows * conv_floats);
  }
  const int n_blocks = 2 * layer.n_k_heads + layer.n_v_heads;
  const auto& conv_tasks = span_tasks(spans, n_spans, n_blocks);
  auto conv_fn = QWENRT_CPU_PICK(prefill_conv_task);
  run_tasks(pool, static_cast<int64_t>(conv_tasks.size()),
            [&](int64_t i) { conv_fn(io, spans[conv_tasks[i].span], conv_tasks[i].index); });
  const auto& delta_tasks = span_tasks(spans, n_spans, layer.n_v_heads);  // reuses the list
  auto delta_fn = QWENRT_CPU_PICK(prefill_delta_task);
  run_tasks(pool, static_cast<int64_t>(delta_tasks.size()),
            [&](int64_t i) { delta_fn(io, spans[delta_tasks[i].span], delta_tasks[i].index); });
}

}  // namespace qwenrt::ops::cpu
