#include "ops/ref/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "quant/quant.h"

namespace qwenrt::ops::ref {
namespace {

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// A weight row dequantised to fp32.
void weight_row(const Weight& w, int64_t row, float* dst) {
  if (w.view.layout != Layout::kRows)
    fail("{}: the reference kernels read a weight as GGUF rows, not a backend's repacked form",
         w.name);
  quant::dequantize(w.view.dtype, w.view.row(row), dst, w.view.ne[0], w.name);
}

}  // namespace

void matmul(const Weight& w, const float* x, float* y, int64_t n) {
  const int64_t in = w.view.ne[0], out = w.view.ne[1];
  std::vector<float> row(in);
  for (int64_t o = 0; o < out; ++o) {
    weight_row(w, o, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(row[i]) * x[t * in + i];
      y[t * out + o] = static_cast<float>(acc);
    }
  }
}

void embed_rows(const Weight& table, const int32_t* ids, float* out, int64_t n) {
  const int64_t dim = table.view.ne[0];
  for (int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0 || ids[t] >= table.view.ne[1]) {
      fail("token id {} is outside the vocabulary of {} tokens", ids[t], table.view.ne[1]);
    }
    weight_row(table, ids[t], out + t * dim);
  }
}

void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = x[r * dim + i] * inv * w[i];
  }
}

void l2norm(float* x, int64_t rows, int64_t dim, int64_t stride, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * stride;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(v[i]) * v[i];
    const double scale = 1.0 / std::max(std::sqrt(ss), double(eps));
    for (int64_t i = 0; i < dim; ++i) v[i] = static_cast<float>(v[i] * scale);
  }
}

void rope_neox(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
               int64_t token_stride, int n_rot, float theta) {
  const int half = n_rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + t * token_stride + int64_t{h} * head_dim;
      for (int i = 0; i < half; ++i) {
        const double freq = std::pow(double(theta), -2.0 * i / n_rot);
        const double angle = positions[t] * freq;
        const double c = std::cos(angle), s = std::sin(angle);
        const double a = v[i], b = v[i + half];
        v[i] = static_cast<float>(a * c - b * s);
        v[i + half] = static_cast<float>(a * s + b * c);
      }
    }
  }
}

void attention(const float* q, int64_t q_stride, const float* k, const float* v, float* out,
               int64_t n_q, int64_t n_kv, int n_head, int n_head_kv, int head_dim, float scale) {
  const int group = n_head / n_head_kv;
  const int64_t kv_stride = int64_t{n_head_kv} * head_dim;
  std::vector<double> scores(n_kv);
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t last = n_kv - n_q + i;  // the query's own position
    for (int h = 0; h < n_head; ++h) {
      const float* qh = q + i * q_stride + int64_t{h} * head_dim;
      const int64_t kvh = h / group;
      double max_score = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        const float* kj = k + j * kv_stride + kvh * head_dim;
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += double(qh[d]) * kj[d];
        scores[j] = dot * scale;
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += scores[j] = std::exp(scores[j] - max_score);
      float* oh = out + (i * n_head + h) * head_dim;
      for (int d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= last; ++j)
          acc += scores[j] * v[j * kv_stride + kvh * head_dim + d];
        oh[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

void conv1d_silu(const float* x, int64_t x_stride, float* state, const float* w, int K, float* out,
                 int64_t n, int64_t channels) {
  // The input window: K-1 remembered inputs followed by the n new ones.
  std::vector<float> window((K - 1 + n) * channels);
  std::memcpy(window.data(), state, (K - 1) * channels * 4);
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(window.data() + (K - 1 + t) * channels, x + t * x_stride, channels * 4);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += double(w[c * K + j]) * window[(t + j) * channels + c];
      out[t * channels + c] = silu(static_cast<float>(acc));
    }
  }
  std::memcpy(state, window.data() + n * channels, (K - 1) * channels * 4);
}

void deltanet_gates(float* alpha_to_g, float* beta, const float* bias, const float* a, int64_t n,
                    int n_v_heads) {
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < n_v_heads; ++h) {
      float& g = alpha_to_g[t * n_v_heads + h];
      g = a[h] * softplus(g + bias[h]);
      float& b = beta[t * n_v_heads + h];
      b = sigmoid(b);
    }
  }
}

// Token by token, per V head h (K head h % Hk), state S [D_k][D_v]:
//   S = exp(g) S;  d = (v - S^T k) beta;  S += k d^T;  o = S^T q / sqrt(D)
void gated_delta_recurrent(const GatedDeltaArgs& a) {
  const int D = a.head_dim;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> d(D);
  for (int64_t t = 0; t < a.n; ++t) {
    for (int h = 0; h < a.n_v_heads; ++h) {
      const int hk = h % a.n_k_heads;
      const float* q = a.q + t * a.q_stride + int64_t{hk} * D;
      const float* k = a.k + t * a.k_stride + int64_t{hk} * D;
      const float* v = a.v + t * a.v_stride + int64_t{h} * D;
      const double decay = std::exp(double(a.g[t * a.n_v_heads + h]));
      const double beta = a.beta[t * a.n_v_heads + h];
      float* S = a.state + int64_t{h} * D * D;
      for (int64_t i = 0; i < int64_t{D} * D; ++i) S[i] = static_cast<float>(S[i] * decay);
      for (int j = 0; j < D; ++j) {
        double sk = 0;
        for (int i = 0; i < D; ++i) sk += double(S[i * D + j]) * k[i];
        d[j] = (v[j] - sk) * beta;
      }
      for (int i = 0; i < D; ++i) {
        for (int j = 0; j < D; ++j)
          S[i * D + j] = static_cast<float>(S[i * D + j] + double(k[i]) * d[j]);
      }
      float* o = a.out + (t * a.n_v_heads + h) * D;
      for (int j = 0; j < D; ++j) {
        double acc = 0;
        for (int i = 0; i < D; ++i) acc += double(S[i * D + j]) * q[i];
        o[j] = static_cast<float>(acc * scale);
      }
    }
  }
}

// The same recurrence in chunks of C = 64 tokens (the WY form used for prefill): within a chunk,
// with G = cumsum(g), A = -(strictly lower (k_beta k^T) * exp(G_i - G_j)) solved by forward
// substitution into T = (I - A)^-1, U = T v_beta and W = T (k_beta exp(G)); then per chunk
//   v_new = U - W S;  o = (q exp(G)) S + (lower-incl (q k^T) * exp(G_i - G_j)) v_new
//   S = exp(G_last) S + (k exp(G_last - G))^T v_new.
void gated_delta_chunked(const GatedDeltaArgs& a) {
  constexpr int C = 64;
  const int D = a.head_dim;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> q(C * D), k(C * D), kb(C * D), vb(C * D), G(C), T(C * C), U(C * D), W(C * D),
      vnew(C * D), S(D * D), scratch_row(C);
  for (int h = 0; h < a.n_v_heads; ++h) {
    const int hk = h % a.n_k_heads;
    float* state = a.state + int64_t{h} * D * D;
    for (int i = 0; i < D * D; ++i) S[i] = state[i];
    for (int64_t c0 = 0; c0 < a.n; c0 += C) {
      const int len = static_cast<int>(std::min<int64_t>(C, a.n - c0));
      double cum = 0;
      for (int i = 0; i < len; ++i) {
        const int64_t t = c0 + i;
        const double beta = a.beta[t * a.n_v_heads + h];
        cum += a.g[t * a.n_v_heads + h];
        G[i] = cum;
        for (int d = 0; d < D; ++d) {
          q[i * D + d] = a.q[t * a.q_stride + int64_t{hk} * D + d] * scale;
          k[i * D + d] = a.k[t * a.k_stride + int64_t{hk} * D + d];
          kb[i * D + d] = k[i * D + d] * beta;
          vb[i * D + d] = a.v[t * a.v_stride + int64_t{h} * D + d] * beta;
        }
      }
      // T = (I + strictly_lower(kb k^T * decay))^-1 by forward substitution, row by row.
      for (int i = 0; i < len; ++i) {
        for (int j = 0; j < len; ++j) T[i * C + j] = 0;
        for (int j = 0; j < i; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += kb[i * D + d] * k[j * D + d];
          T[i * C + j] = -dot * std::exp(G[i] - G[j]);
        }
        for (int j = 0; j < i; ++j) {
          // row i of the inverse: A_ij + sum_{j<m<i} A_im T_mj (T rows above are final)
          double acc = T[i * C + j];
          for (int m = j + 1; m < i; ++m) acc += T[i * C + m] * T[m * C + j];
          scratch_row[j] = acc;
        }
        for (int j = 0; j < i; ++j) T[i * C + j] = scratch_row[j];
        T[i * C + i] = 1;
      }
      for (int i = 0; i < len; ++i) {
        for (int d = 0; d < D; ++d) {
          double u = 0, w = 0;
          for (int j = 0; j <= i; ++j) {
            u += T[i * C + j] * vb[j * D + d];
            w += T[i * C + j] * kb[j * D + d] * std::exp(G[j]);
          }
          U[i * D + d] = u;
          W[i * D + d] = w;
        }
      }
      // v_new = U - W S; o = (q exp(G)) S + masked (q k^T decay) v_new
      for (int i = 0; i < len; ++i) {
        for (int d = 0; d < D; ++d) {
          double ws = 0;
          for (int e = 0; e < D; ++e) ws += W[i * D + e] * S[e * D + d];
          vnew[i * D + d] = U[i * D + d] - ws;
        }
      }
      for (int i = 0; i < len; ++i) {
        const int64_t t = c0 + i;
        float* o = a.out + (t * a.n_v_heads + h) * D;
        for (int d = 0; d < D; ++d) {
          double inter = 0;
          for (int e = 0; e < D; ++e) inter += q[i * D + e] * S[e * D + d];
          inter *= std::exp(G[i]);
          double intra = 0;
          for (int j = 0; j <= i; ++j) {
            double qk = 0;
            for (int e = 0; e < D; ++e) qk += q[i * D + e] * k[j * D + e];
            intra += qk * std::exp(G[i] - G[j]) * vnew[j * D + d];
          }
          o[d] = static_cast<float>(inter + intra);
        }
      }
      const double g_last = G[len - 1];
      for (int e = 0; e < D; ++e) {
        for (int d = 0; d < D; ++d) {
          double acc = S[e * D + d] * std::exp(g_last);
          for (int j = 0; j < len; ++j)
            acc += k[j * D + e] * std::exp(g_last - G[j]) * vnew[j * D + d];
          S[e * D + d] = acc;
        }
      }
    }
    for (int i = 0; i < D * D; ++i) state[i] = static_cast<float>(S[i]);
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                 int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = x[r * cols + c] * sigmoid(gate[r * gate_stride + c]);
    }
  }
}

void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights) {
  std::vector<double> p(n_expert);
  std::vector<int32_t> order(n_expert);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * n_expert;
    const double mx = *std::max_element(l, l + n_expert);
    double sum = 0;
    for (int e = 0; e < n_expert; ++e) sum += p[e] = std::exp(double(l[e]) - mx);
    for (int e = 0; e < n_expert; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Ties go to the lower expert id, as a stable sort by probability would.
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return p[x] > p[y]; });
    double picked = 0;
    for (int j = 0; j < k; ++j) picked += p[order[j]];
    picked = std::max(picked, 6.103515625e-5);
    for (int j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = static_cast<float>(p[order[j]] / picked);
    }
  }
}

void moe_experts(const MoeWeights& w, const float* x, const int32_t* ids, const float* weights,
                 float* out, int64_t n, int k) {
  const int64_t dim = w.down_exps.view.ne[1], ff = w.down_exps.view.ne[0];
  std::vector<float> gate(ff), up(ff), down(dim), gate_up(2 * ff);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    for (int j = 0; j < k; ++j) {
      const int e = ids[t * k + j] - w.expert_base;
      if (e < 0 || e >= w.down_exps.view.ne[2]) continue;  // another rank's expert
      if (w.gate_up_exps.present()) {
        matmul(w.gate_up_exps.expert(e), xt, gate_up.data(), 1);
        std::copy(gate_up.begin(), gate_up.begin() + ff, gate.begin());
        std::copy(gate_up.begin() + ff, gate_up.end(), up.begin());
      } else {
        matmul(w.gate_exps.expert(e), xt, gate.data(), 1);
        matmul(w.up_exps.expert(e), xt, up.data(), 1);
      }
      silu_mul(gate.data(), up.data(), gate.data(), ff);
      matmul(w.down_exps.expert(e), gate.data(), down.data(), 1);
      for (int64_t i = 0; i < dim; ++i) out[t * dim + i] += weights[t * k + j] * down[i];
    }
  }
}

void moe_ffn(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert, int k) {
  const int64_t dim = w.down_exps.view.ne[1], sff = w.shared_down.view.ne[0];
  std::vector<float> router_logits(n * n_expert), weights(n * k), gate(n * sff), up(n * sff),
      shared_scale(n);
  std::vector<int32_t> ids(n * k);
  matmul(w.router, x, router_logits.data(), n);
  moe_route(router_logits.data(), n, n_expert, k, ids.data(), weights.data());
  matmul(w.shared_gate, x, gate.data(), n);
  matmul(w.shared_up, x, up.data(), n);
  silu_mul(gate.data(), up.data(), gate.data(), n * sff);
  matmul(w.shared_down, gate.data(), out, n);
  matmul(w.shared_gate_inp, x, shared_scale.data(), n);  // [n_embd] as a one-row matrix
  for (int64_t t = 0; t < n; ++t) {
    const float s = sigmoid(shared_scale[t]);
    for (int64_t i = 0; i < dim; ++i) out[t * dim + i] *= s;
  }
  moe_experts(w, x, ids.data(), weights.data(), out, n, k);
}

}  // namespace qwenrt::ops::ref
