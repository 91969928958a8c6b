// The reference kernels of qwen4exp's own blocks (Qwen3.8-Flash-Next): hyper-connections, the
// PLE n-gram embedding and its dilated conv, Qwen Sparse Attention. Written against transformers'
// modeling_qwen4_exp.py (the model's definition); ops.h and ops/types.h state each one. Frozen
// like the rest of ops/ref: fix, never optimise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"

namespace qwenrt::ops::ref {
namespace {

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

int64_t kv_row(const KvLayer& kv, const int32_t* table, int64_t t) {
  const int32_t page = table[t / kv.page_size];
  if (page < 0) fail("KV position {} has no page", t);
  return int64_t{page} * kv.page_size + t % kv.page_size;
}

}  // namespace

void rmsnorm_grouped(const float* x, const float* w, float* out, int64_t rows, int groups,
                     int64_t dim, float eps) {
  for (int64_t r = 0; r < rows * groups; ++r) {
    const int64_t g = r % groups;
    rmsnorm(x + r * dim, w + g * dim, out + r * dim, 1, dim, eps);
  }
}

void silu_scaled(const float* x, float scale, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = double(x[i]) * scale;
    out[i] = static_cast<float>(v * sigmoid(v));
  }
}

void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc, int64_t dim) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      double acc = 0;
      for (int s = 0; s < hc; ++s) {
        const int64_t i = (r * hc + s) * dim + d;
        acc += sigmoid(gate[i]) * xn[i];
      }
      out[r * dim + d] = static_cast<float>(acc / hc);
    }
  }
}

void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
               int64_t dim) {
  for (int64_t r = 0; r < n; ++r) {
    for (int s = 0; s < hc; ++s) {
      const double w = 2.0 * sigmoid(double(inject[r * hc + s]) / hc);
      float* x = streams + (r * hc + s) * dim;
      for (int64_t d = 0; d < dim; ++d) x[d] = static_cast<float>(x[d] + block[r * dim + d] * w);
    }
  }
}

void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
              int hc, int64_t dim) {
  for (int64_t r = 0; r < n; ++r) {
    for (int s = 0; s < hc; ++s) {
      const int64_t o = (r * hc + s) * dim;
      double dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += double(key[o + d]) * query[o + d];
      const double g = dot / std::sqrt(double(dim));
      const double sign = g > 0 ? 1.0 : g < 0 ? -1.0 : 0.0;
      const double gate = sigmoid(sign * std::sqrt(std::max(std::abs(g), 1e-6)));
      for (int64_t d = 0; d < dim; ++d) out[o + d] = static_cast<float>(gate * value[r * dim + d]);
    }
  }
}

void ple_rows(const PleEmbedArgs& a, const int64_t* ctx, int64_t* rows) {
  for (int n = 2; n <= a.ngram; ++n) {
    uint64_t mixed = static_cast<uint64_t>(ctx[0]) * a.multipliers[0];
    for (int j = 1; j < n; ++j) mixed ^= static_cast<uint64_t>(ctx[j]) * a.multipliers[j];
    for (int g = 0; g < a.heads_per_ngram; ++g) {
      const int h = (n - 2) * a.heads_per_ngram + g;
      rows[h] = static_cast<int64_t>(mixed % static_cast<uint64_t>(a.vocab[h])) + a.offsets[h];
    }
  }
}

// Per span: the sequence of the slot's remembered ngram - 1 tokens followed by the span's, each
// row's window cut at the sequence start and at eos, the hashed rows read from the table.
void ple_embed_spans(const StepLayout& step, const PleEmbedArgs& a) {
  const int ctx_len = a.ngram - 1, heads = (a.ngram - 1) * a.heads_per_ngram;
  const int64_t head_dim = a.table.view.ne[0], n_rows = a.table.view.ne[1];
  std::vector<int64_t> ctx(a.ngram), rows(heads);
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    float* remembered = a.state.ple_tokens + int64_t{span.slot} * ctx_len;
    // seq[i]: the token at position n_past - ctx_len + i.
    std::vector<int64_t> seq(ctx_len + span.count);
    for (int i = 0; i < ctx_len; ++i) seq[i] = static_cast<int64_t>(remembered[i]);
    for (int32_t i = 0; i < span.count; ++i) seq[ctx_len + i] = step.tokens[span.begin + i];
    for (int32_t i = 0; i < span.count; ++i) {
      const int64_t pos = int64_t{span.n_past} + i;
      ctx[0] = seq[ctx_len + i];
      bool cut = false;
      for (int j = 1; j < a.ngram; ++j) {
        const int64_t t = pos - j < 0 ? -1 : seq[ctx_len + i - j];
        cut = cut || t < 0 || t == a.eos;
        ctx[j] = cut ? a.eos : t;
      }
      ple_rows(a, ctx.data(), rows.data());
      for (int h = 0; h < heads; ++h) {
        if (rows[h] < 0 || rows[h] >= n_rows) {
          fail("PLE row {} of head {} is outside '{}' ({} rows)", rows[h], h, a.table.name, n_rows);
        }
        const int32_t id = static_cast<int32_t>(rows[h]);
        embed_rows(a.table, &id, a.out + ((span.begin + i) * int64_t{heads} + h) * head_dim, 1);
      }
      if (span.keep_states && i + 1 < span.count && i < a.state.history_rows) {
        float* h =
            a.state.ple_tokens_history + (int64_t{span.slot} * a.state.history_rows + i) * ctx_len;
        for (int j = 0; j < ctx_len; ++j) h[j] = static_cast<float>(seq[i + 1 + j]);
      }
    }
    for (int j = 0; j < ctx_len; ++j) remembered[j] = static_cast<float>(seq[span.count + j]);
  }
}

// Per span: the window of the slot's last (K-1) * dilation inputs followed by the span's.
void ple_conv_spans(const StepLayout& step, const PleConvArgs& a) {
  const int64_t K = a.kernel.view.ne[0], C = a.kernel.view.ne[1];
  const int64_t hist = (K - 1) * a.dilation;
  std::vector<float> kernel(K * C);
  quant::dequantize(a.kernel.view.dtype, a.kernel.view.data, kernel.data(), K * C, a.kernel.name);
  const float* w = kernel.data();
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    float* state = a.state.ple_conv + int64_t{span.slot} * hist * C;
    std::vector<float> window((hist + span.count) * C);
    std::memcpy(window.data(), state, hist * C * 4);
    std::memcpy(window.data() + hist * C, a.x + int64_t{span.begin} * C, span.count * C * 4);
    for (int64_t t = 0; t < span.count; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += double(w[c * K + k]) * window[(hist + t - (K - 1 - k) * a.dilation) * C + c];
        a.out[(span.begin + t) * C + c] = static_cast<float>(acc * sigmoid(acc));
      }
      if (span.keep_states && t + 1 < span.count && t < a.state.history_rows) {
        std::memcpy(
            a.state.ple_conv_history + (int64_t{span.slot} * a.state.history_rows + t) * hist * C,
            window.data() + (t + 1) * C, hist * C * 4);
      }
    }
    std::memcpy(state, window.data() + span.count * C, hist * C * 4);
  }
}

void qsa_select(const float* q, const float* pooled, int64_t n_kv, int heads, int dim, int ratio,
                int budget, std::vector<int64_t>& positions) {
  const int64_t n_blocks = n_kv / ratio, keep = budget / ratio;
  positions.clear();
  std::vector<int64_t> blocks(n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  if (n_blocks > keep) {
    std::vector<double> score(n_blocks);
    for (int64_t b = 0; b < n_blocks; ++b) {
      double sum = 0;
      for (int h = 0; h < heads; ++h) {
        double dot = 0;
        for (int d = 0; d < dim; ++d) dot += double(q[h * dim + d]) * pooled[b * dim + d];
        sum += std::max(dot, 0.0);
      }
      score[b] = sum / std::sqrt(double(dim));
    }
    // The best `keep` blocks, ties to the lower block; then back in position order.
    std::stable_sort(blocks.begin(), blocks.end(),
                     [&](int64_t x, int64_t y) { return score[x] > score[y]; });
    blocks.resize(keep);
    std::sort(blocks.begin(), blocks.end());
  }
  for (int64_t b : blocks) {
    for (int64_t j = 0; j < ratio; ++j) positions.push_back(b * ratio + j);
  }
  for (int64_t t = n_blocks * ratio; t < n_kv; ++t) positions.push_back(t);
}

std::vector<float> qsa_append_and_pool(const Span& span, const int32_t* table, const QsaArgs& a) {
  const AttentionArgs& at = a.attn;
  const KvLayer& kv = at.kv;
  if (!kv.idx || kv.idx_dim != a.index_dim)
    fail("qsa_attention: the layer's KV pool holds no indexer keys of width {}", a.index_dim);
  for (int64_t i = 0; i < span.count; ++i) {
    const int64_t row = kv_row(kv, table, span.n_past + i), src = span.begin + i;
    std::memcpy(kv.k + row * kv.kv_dim, at.k + src * kv.kv_dim, kv.kv_dim * 4);
    std::memcpy(kv.v + row * kv.kv_dim, at.v + src * kv.kv_dim, kv.kv_dim * 4);
    std::memcpy(kv.idx + row * kv.idx_dim, a.index_k + src * kv.idx_dim, kv.idx_dim * 4);
  }
  // Pooled keys of every block complete at the span's end.
  const int64_t n_total = int64_t{span.n_past} + span.count, n_blocks = n_total / a.ratio;
  std::vector<float> pooled(n_blocks * a.index_dim);
  std::vector<int32_t> starts(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int d = 0; d < a.index_dim; ++d) {
      double sum = 0;
      for (int64_t j = 0; j < a.ratio; ++j)
        sum += kv.idx[kv_row(kv, table, b * a.ratio + j) * kv.idx_dim + d];
      pooled[b * a.index_dim + d] = static_cast<float>(sum / a.ratio);
    }
    starts[b] = static_cast<int32_t>(b * a.ratio);
  }
  rmsnorm(pooled.data(), f32_data(a.k_norm), pooled.data(), n_blocks, a.index_dim, a.eps);
  rope_neox(pooled.data(), starts.data(), n_blocks, 1, a.index_dim, a.index_dim, a.n_rot,
            a.rope_theta);
  return pooled;
}

// Per span: qsa_append_and_pool, then each query attends (ref::attention over the gathered rows)
// to its selection.
void qsa_attention_spans(const StepLayout& step, const QsaArgs& a) {
  const AttentionArgs& at = a.attn;
  const KvLayer& kv = at.kv;
  const int64_t q_dim = int64_t{at.n_head} * at.head_dim;
  std::vector<int64_t> selected;
  for (int s = 0; s < step.n_spans; ++s) {
    const Span& span = step.spans[s];
    const int32_t* table = step.page_tables + span.slot * step.page_table_stride;
    const std::vector<float> pooled = qsa_append_and_pool(span, table, a);
    for (int64_t i = 0; i < span.count; ++i) {
      const int64_t src = span.begin + i, n_kv = int64_t{span.n_past} + i + 1;
      qsa_select(a.index_q + src * a.index_heads * a.index_dim, pooled.data(), n_kv, a.index_heads,
                 a.index_dim, a.ratio, a.budget, selected);
      const int64_t m = static_cast<int64_t>(selected.size());
      std::vector<float> k(m * kv.kv_dim), v(m * kv.kv_dim);
      for (int64_t j = 0; j < m; ++j) {
        const int64_t row = kv_row(kv, table, selected[j]);
        std::memcpy(k.data() + j * kv.kv_dim, kv.k + row * kv.kv_dim, kv.kv_dim * 4);
        std::memcpy(v.data() + j * kv.kv_dim, kv.v + row * kv.kv_dim, kv.kv_dim * 4);
      }
      attention(at.q + src * at.q_stride, at.q_stride, k.data(), v.data(), at.out + src * q_dim, 1,
                m, at.n_head, at.n_head_kv, at.head_dim, at.scale);
    }
  }
}

}  // namespace qwenrt::ops::ref
