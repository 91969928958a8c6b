#include "ops/cpu/qsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/quant_dot.h"
#include "ops/ref/kernels.h"

namespace qwenrt::ops::cpu {
namespace {

// Row of position t of a slot in a layer's pages.
int64_t page_row(const KvLayer& kv, const int32_t* table, int64_t t) {
  return int64_t{table[t / kv.page_size]} * kv.page_size + t % kv.page_size;
}

// out [head_dim] = attention of query head h over the kept positions (ascending).
void attend_head(const AttentionArgs& at, const int32_t* table, const float* q,
                 const std::vector<int64_t>& kept, int h, float* out, std::vector<float>& scores,
                 Isa isa) {
  const KvLayer& kv = at.kv;
  const int64_t m = static_cast<int64_t>(kept.size());
  const float* qh = q + int64_t{h} * at.head_dim;
  const int64_t kvh = h / (at.n_head / at.n_head_kv);
  scores.resize(m);
  float best = -INFINITY;
  for (int64_t j = 0; j < m; ++j) {
    const float* kj = kv.k + page_row(kv, table, kept[j]) * kv.kv_dim + kvh * at.head_dim;
    scores[j] = dot_f32(qh, kj, at.head_dim, isa) * at.scale;
    best = std::max(best, scores[j]);
  }
  float* oh = out + int64_t{h} * at.head_dim;
  std::fill(oh, oh + at.head_dim, 0.0f);
  double total = 0;
  for (int64_t j = 0; j < m; ++j) {
    const float p = std::exp(scores[j] - best);
    total += p;
    const float* vj = kv.v + page_row(kv, table, kept[j]) * kv.kv_dim + kvh * at.head_dim;
    for (int d = 0; d < at.head_dim; ++d) oh[d] += p * vj[d];
  }
  const float inv = static_cast<float>(1.0 / total);
  for (int d = 0; d < at.head_dim; ++d) oh[d] *= inv;
}

}  // namespace

void qsa_attention_sparse(const StepLayout& step, const QsaArgs& a, ThreadPool& pool) {
  const AttentionArgs& at = a.attn;
  const KvLayer& kv = at.kv;
  if (!kv.idx || kv.idx_dim != a.index_dim)
    fail("qsa_attention: the layer's KV pool holds no indexer keys of width {}", a.index_dim);
  const int64_t q_dim = int64_t{at.n_head} * at.head_dim;
  const float* k_norm = ref::f32_data(a.k_norm);
  const Isa isa = active_isa();
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    const int32_t* table = step.page_tables + span.slot * step.page_table_stride;
    for (int64_t i = 0; i < span.count; ++i) {
      const int64_t row = page_row(kv, table, span.n_past + i), src = span.begin + i;
      std::memcpy(kv.k + row * kv.kv_dim, at.k + src * kv.kv_dim, kv.kv_dim * 4);
      std::memcpy(kv.v + row * kv.kv_dim, at.v + src * kv.kv_dim, kv.kv_dim * 4);
      std::memcpy(kv.idx + row * kv.idx_dim, a.index_k + src * kv.idx_dim, kv.idx_dim * 4);
    }
    // Pooled keys of every block complete at the span's end (as the reference: double sums).
    const int64_t n_total = int64_t{span.n_past} + span.count, n_blocks = n_total / a.ratio;
    std::vector<float> pooled(n_blocks * a.index_dim);
    std::vector<int32_t> starts(n_blocks);
    std::vector<double> sum(a.index_dim);
    for (int64_t b = 0; b < n_blocks; ++b) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t j = 0; j < a.ratio; ++j) {
        const float* r = kv.idx + page_row(kv, table, b * a.ratio + j) * kv.idx_dim;
        for (int d = 0; d < a.index_dim; ++d) sum[d] += r[d];
      }
      for (int d = 0; d < a.index_dim; ++d)
        pooled[b * a.index_dim + d] = static_cast<float>(sum[d] / a.ratio);
      starts[b] = static_cast<int32_t>(b * a.ratio);
    }
    ref::rmsnorm(pooled.data(), k_norm, pooled.data(), n_blocks, a.index_dim, a.eps);
    ref::rope_neox(pooled.data(), starts.data(), n_blocks, 1, a.index_dim, a.index_dim, a.n_rot,
                   a.rope_theta);
    // Queries in interleaved parts (later queries see more keys); a span of fewer queries than
    // parts (decode) splits each query's heads instead.
    const int64_t n_parts = pool.size();
    if (span.count >= n_parts) {
      pool.run(static_cast<int>(n_parts), [&](int part, int parts) {
        std::vector<int64_t> kept;
        std::vector<float> scores;
        for (int64_t i = part; i < span.count; i += parts) {
          const int64_t src = span.begin + i, n_kv = int64_t{span.n_past} + i + 1;
          ref::qsa_select(a.index_q + src * a.index_heads * a.index_dim, pooled.data(), n_kv,
                          a.index_heads, a.index_dim, a.ratio, a.budget, kept);
          for (int h = 0; h < at.n_head; ++h)
            attend_head(at, table, at.q + src * at.q_stride, kept, h, at.out + src * q_dim, scores,
                        isa);
        }
      });
      continue;
    }
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < span.count; ++i) {
      const int64_t src = span.begin + i, n_kv = int64_t{span.n_past} + i + 1;
      ref::qsa_select(a.index_q + src * a.index_heads * a.index_dim, pooled.data(), n_kv,
                      a.index_heads, a.index_dim, a.ratio, a.budget, kept);
      pool.run(static_cast<int>(n_parts), [&](int part, int parts) {
        std::vector<float> scores;
        for (int h = part; h < at.n_head; h += parts)
          attend_head(at, table, at.q + src * at.q_stride, kept, h, at.out + src * q_dim, scores,
                      isa);
      });
    }
  }
}

}  // namespace qwenrt::ops::cpu
