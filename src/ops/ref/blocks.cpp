// The blocks of the Ops interface over a step's spans, on the reference kernels: what RefOps runs
// and what every fast backend's fused blocks are compared against.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/host_ops.h"
#include "ops/ref/kernels.h"
#include "ops/ref/sampling.h"

namespace qwenrt::ops::ref {
namespace {

int64_t kv_offset(const KvLayer& kv, const int32_t* table, int64_t t) {
  const int32_t page = table[t / kv.page_size];
  if (page < 0) fail("KV position {} has no page", t);
  return (int64_t{page} * kv.page_size + t % kv.page_size) * kv.kv_dim;
}

}  // namespace

const float* f32_data(const Weight& w) {
  if (w.view.dtype != DType::F32) fail("tensor '{}': expected F32", w.name);
  return static_cast<const float*>(w.view.data);
}

// Per span: write the new K/V rows into the slot's pages, gather the slot's keys and values
// contiguous, and run the reference attention over them.
void attention_spans(const StepLayout& step, const AttentionArgs& a) {
  const KvLayer& kv = a.kv;
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    const int32_t* table = step.page_tables + span.slot * step.page_table_stride;
    for (int64_t i = 0; i < span.count; ++i) {
      const int64_t off = kv_offset(kv, table, span.n_past + i);
      std::memcpy(kv.k + off, a.k + (span.begin + i) * kv.kv_dim, kv.kv_dim * 4);
      std::memcpy(kv.v + off, a.v + (span.begin + i) * kv.kv_dim, kv.kv_dim * 4);
    }
    const int64_t n_kv = span.n_past + span.count;
    std::vector<float> k(n_kv * kv.kv_dim), v(n_kv * kv.kv_dim);
    for (int64_t t = 0; t < n_kv; ++t) {
      std::memcpy(k.data() + t * kv.kv_dim, kv.k + kv_offset(kv, table, t), kv.kv_dim * 4);
      std::memcpy(v.data() + t * kv.kv_dim, kv.v + kv_offset(kv, table, t), kv.kv_dim * 4);
    }
    const int64_t q_dim = int64_t{a.n_head} * a.head_dim;
    attention(a.q + span.begin * a.q_stride, a.q_stride, k.data(), v.data(),
              a.out + span.begin * q_dim, span.count, n_kv, a.n_head, a.n_head_kv, a.head_dim,
              a.scale);
  }
}

// SPEC Gated DeltaNet steps 2-6, span by span: conv1d + SiLU with the slot's conv state, split
// q | k | v, L2 norms, gates, the delta rule with the slot's state, gated RMSNorm.
void deltanet_spans(const StepLayout& step, const DeltaNetArgs& a) {
  const int64_t D = a.head_dim, Hv = a.n_v_heads, nk = a.n_k_heads * D, nv = Hv * D;
  const int64_t C = 2 * nk + nv, K = a.conv.view.ne[0];
  const int64_t conv_floats = (K - 1) * C, delta_floats = Hv * D * D;
  const int64_t n = step.n;
  std::vector<float> mixed(n * C), q(n * nk), k(n * nk), g(a.alpha, a.alpha + n * Hv),
      beta(a.beta, a.beta + n * Hv), o(n * nv);
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    if (span.keep_states) {
      keep_conv_history(
          a.state.conv + span.slot * conv_floats, a.qkv + span.begin * C, C, static_cast<int>(K), C,
          span.count, a.state.history_rows,
          a.state.conv_history + int64_t{span.slot} * a.state.history_rows * conv_floats);
    }
    conv1d_silu(a.qkv + span.begin * C, C, a.state.conv + span.slot * conv_floats, f32_data(a.conv),
                static_cast<int>(K), mixed.data() + span.begin * C, span.count, C);
  }
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(q.data() + t * nk, mixed.data() + t * C, nk * 4);
    std::memcpy(k.data() + t * nk, mixed.data() + t * C + nk, nk * 4);
  }
  l2norm(q.data(), n * a.n_k_heads, D, D, a.eps);
  l2norm(k.data(), n * a.n_k_heads, D, D, a.eps);
  deltanet_gates(g.data(), beta.data(), f32_data(a.dt_bias), f32_data(a.a), n, a.n_v_heads);
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    const GatedDeltaArgs args{.q = q.data() + span.begin * nk,
                              .k = k.data() + span.begin * nk,
                              .v = mixed.data() + span.begin * C + 2 * nk,
                              .q_stride = nk,
                              .k_stride = nk,
                              .v_stride = C,
                              .g = g.data() + span.begin * Hv,
                              .beta = beta.data() + span.begin * Hv,
                              .state = a.state.delta + span.slot * delta_floats,
                              .out = o.data() + span.begin * nv,
                              .n = span.count,
                              .n_k_heads = a.n_k_heads,
                              .n_v_heads = a.n_v_heads,
                              .head_dim = a.head_dim};
    const bool chunked = step.deltanet_mode == DeltaNetMode::kChunked ||
                         (step.deltanet_mode == DeltaNetMode::kAuto && span.count > 1);
    if (span.keep_states) {
      // Token by token (as decode runs), keeping the state after each row but the last.
      for (int32_t t = 0; t < span.count; ++t) {
        GatedDeltaArgs one = args;
        one.q += t * nk;
        one.k += t * nk;
        one.v += t * C;
        one.g += t * Hv;
        one.beta += t * Hv;
        one.out += t * nv;
        one.n = 1;
        gated_delta_recurrent(one);
        if (t + 1 < span.count && t < a.state.history_rows) {
          std::memcpy(a.state.delta_history +
                          (int64_t{span.slot} * a.state.history_rows + t) * delta_floats,
                      args.state, delta_floats * 4);
        }
      }
    } else if (chunked) {
      gated_delta_chunked(args);
    } else {
      gated_delta_recurrent(args);
    }
  }
  rmsnorm(o.data(), f32_data(a.norm), o.data(), n * Hv, D, a.eps);
  if (a.sigmoid_gate) {
    sigmoid_mul(o.data(), a.z, nv, a.out, n, nv);  // qwen4exp
  } else {
    silu_mul(a.z, o.data(), a.out, n * nv);  // silu here (sigmoid in attention)
  }
}

void sample_rows(const StepLayout& step, const float* logits, int64_t n_vocab,
                 const SamplingRow* rows, int n_top, SampledToken* out) {
  for (int64_t i = 0; i < step.n_output_rows; ++i) {
    const std::span<const float> l(logits + i * n_vocab, static_cast<size_t>(n_vocab));
    out[i] = SampledToken{};
    out[i].id = pick_token(sampling_distribution(l, rows[i]), rows[i]);
    fill_logprobs(l, n_top, out[i]);
  }
}

}  // namespace qwenrt::ops::ref
