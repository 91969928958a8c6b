#include "ops/cpu/qsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

bool qsa_keeps_every_key(const StepLayout& step, const QsaArgs& a) {
  const KvLayer& kv = a.attn.kv;
  if (kv.idx == nullptr || kv.idx_dim != a.index_dim || a.ratio <= 0) return false;
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    if ((int64_t{span.n_past} + span.count) / a.ratio > a.budget / a.ratio) return false;
  }
  return true;
}

void qsa_write_index_keys(const StepLayout& step, const QsaArgs& a) {
  const KvLayer& kv = a.attn.kv;
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    const int32_t* table = step.page_tables + span.slot * step.page_table_stride;
    for (int64_t i = 0; i < span.count; ++i) {
      std::memcpy(kv.idx + page_row(kv, table, span.n_past + i) * kv.idx_dim,
                  a.index_k + (span.begin + i) * kv.idx_dim, kv.idx_dim * 4);
    }
  }
}

void qsa_attention_sparse(const StepLayout& step, const QsaArgs& a, ThreadPool& pool) {
  const AttentionArgs& at = a.attn;
  const int64_t q_dim = int64_t{at.n_head} * at.head_dim;
  const Isa isa = active_isa();
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    const int32_t* table = step.page_tables + span.slot * step.page_table_stride;
    const std::vector<float> pooled = ref::qsa_append_and_pool(span, table, a);
    // Query i's kept positions.
    auto select = [&](int64_t i, std::vector<int64_t>& kept) {
      ref::qsa_select(a.index_q + (span.begin + i) * a.index_heads * a.index_dim, pooled.data(),
                      int64_t{span.n_past} + i + 1, a.index_heads, a.index_dim, a.ratio, a.budget,
                      kept);
    };
    auto attend = [&](int64_t i, const std::vector<int64_t>& kept, int h,
                      std::vector<float>& scores) {
      const int64_t src = span.begin + i;
      attend_head(at, table, at.q + src * at.q_stride, kept, h, at.out + src * q_dim, scores, isa);
    };
    // Queries in interleaved parts (later queries see more keys); a span of fewer queries than
    // parts (decode) splits each query's heads instead.
    const int n_parts = pool.size();
    if (span.count >= n_parts) {
      pool.run(n_parts, [&](int part, int parts) {
        std::vector<int64_t> kept;
        std::vector<float> scores;
        for (int64_t i = part; i < span.count; i += parts) {
          select(i, kept);
          for (int h = 0; h < at.n_head; ++h) attend(i, kept, h, scores);
        }
      });
      continue;
    }
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < span.count; ++i) {
      select(i, kept);
      pool.run(n_parts, [&](int part, int parts) {
        std::vector<float> scores;
        for (int h = part; h < at.n_head; h += parts) attend(i, kept, h, scores);
      });
    }
  }
}

}  // namespace qwenrt::ops::cpu
