// Micro-benchmark of the CPU DeltaNet and attention kernels at the Qwen3.6-35B-A3B shape
// (DeltaNet Hk 16, Hv 32, D 128, C 8192, conv K 4; attention 16 q heads, 2 kv heads, head dim 256,
// pages of 64). Prints the median of repeats per figure. Built by build-h2/Makefile:
//   build-h2/gcc/bench [threads]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "ops/cpu/attention.h"
#include "ops/cpu/common.h"
#include "ops/cpu/deltanet.h"

using namespace qwenrt;
using namespace qwenrt::ops::cpu;

namespace {

std::vector<float> randn(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Median wall time of fn in microseconds over `reps` runs after one warm-up.
double median_us(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  ThreadPool& pool = *new ThreadPool(threads);  // never destroyed
  std::mt19937_64 rng(1);
  std::printf("simd %s, %d threads\n", simd_level_name(simd_level()), threads);

  // DeltaNet: 48 layers' state, rotated, so each decode call finds its 2 MB of state cold as it
  // is in a real forward pass; "warm" reuses one layer's state.
  const int Hk = 16, Hv = 32, D = 128, K = 4, n_layers = 48;
  const int64_t C = (2 * Hk + Hv) * D, nv = int64_t{Hv} * D;
  auto kernel = randn(C * K, rng, 0.5f), dt_bias = randn(Hv, rng), norm = randn(D, rng);
  std::vector<float> a = randn(Hv, rng, 0.5f);
  for (auto& x : a) x = -std::exp(x);
  std::vector<std::vector<float>> conv_state(n_layers), delta_state(n_layers);
  for (int l = 0; l < n_layers; ++l) {
    conv_state[l] = randn((K - 1) * C, rng);
    delta_state[l] = randn(size_t(Hv) * D * D, rng, 0.05f);
  }
  auto layer_args = [&](int l) {
    return DeltaNetLayerArgs{.conv_kernel = kernel.data(),
                             .conv_k = K,
                             .dt_bias = dt_bias.data(),
                             .a = a.data(),
                             .norm = norm.data(),
                             .eps = 1e-6f,
                             .n_k_heads = Hk,
                             .n_v_heads = Hv,
                             .head_dim = D,
                             .conv_state = conv_state[l].data(),
                             .delta_state = delta_state[l].data()};
  };
  const int n_pre = 512;
  auto qkv = randn(n_pre * C, rng), z = randn(n_pre * nv, rng), alpha = randn(n_pre * Hv, rng),
       beta = randn(n_pre * Hv, rng);
  std::vector<float> out(n_pre * nv), ws(deltanet_prefill_workspace_floats(layer_args(0), n_pre));
  const Span one{0, 0, 1, 100};
  int layer = 0;
  const double dec_cold = median_us(2000, [&] {
    layer = (layer + 1) % n_layers;
    deltanet_decode(layer_args(layer), &one, 1, qkv.data(), z.data(), alpha.data(), beta.data(),
                    out.data(), pool);
  });
  const double dec_warm = median_us(2000, [&] {
    deltanet_decode(layer_args(0), &one, 1, qkv.data(), z.data(), alpha.data(), beta.data(),
                    out.data(), pool);
  });
  std::printf("deltanet decode, 1 token, per layer: %.1f us (state cold), %.1f us (warm)\n",
              dec_cold, dec_warm);
  std::vector<Span> batch8;
  for (int s = 0; s < 8; ++s) batch8.push_back({0, s, 1, 100});  // same slot: timing only
  const double dec8 = median_us(500, [&] {
    layer = (layer + 1) % n_layers;
    deltanet_decode(layer_args(layer), batch8.data(), 1, qkv.data(), z.data(), alpha.data(),
                    beta.data(), out.data(), pool);
  });
  (void)dec8;
  const Span pre{0, 0, n_pre, 0};
  const double prefill = median_us(20, [&] {
    deltanet_prefill(layer_args(1), &pre, 1, qkv.data(), z.data(), alpha.data(), beta.data(),
                     out.data(), ws.data(), pool);
  });
  std::printf("deltanet prefill core, %d tokens, per layer: %.2f ms\n", n_pre, prefill / 1000);
  {
    auto q = randn(size_t(n_pre) * Hk * D, rng), k = randn(size_t(n_pre) * Hk * D, rng);
    for (int64_t r = 0; r < int64_t{n_pre} * Hk; ++r) {  // unit rows, as after the l2norm
      for (float* x : {q.data() + r * D, k.data() + r * D}) {
        double ss = 0;
        for (int d = 0; d < D; ++d) ss += double(x[d]) * x[d];
        for (int d = 0; d < D; ++d) x[d] = float(x[d] / std::sqrt(ss));
      }
    }
    auto v = randn(size_t(n_pre) * nv, rng);
    std::vector<float> g(n_pre * Hv, -0.1f), b(n_pre * Hv, 0.5f), o(n_pre * nv);
    const GatedDeltaBatch gb{.q = q.data(),
                             .k = k.data(),
                             .v = v.data(),
                             .q_stride = Hk * D,
                             .k_stride = Hk * D,
                             .v_stride = nv,
                             .g = g.data(),
                             .beta = b.data(),
                             .delta_state = delta_state[2].data(),
                             .out = o.data(),
                             .n_k_heads = Hk,
                             .n_v_heads = Hv,
                             .head_dim = D};
    const double chk = median_us(20, [&] { gated_delta_chunked(gb, &pre, 1, pool); });
    const double rec = median_us(5, [&] { gated_delta_recurrent(gb, &pre, 1, pool); });
    std::printf("gated delta rule alone, %d tokens: chunked %.2f ms, recurrent %.2f ms\n", n_pre,
                chk / 1000, rec / 1000);
  }

  // Attention: pages scattered through the pool.
  const int n_head = 16, n_kv = 2, hd = 256, ps = 64, max_ctx = 4096 + 512;
  const int n_pages = max_ctx / ps;
  std::vector<int32_t> table(n_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  auto kp = randn(size_t(n_pages) * ps * n_kv * hd, rng),
       vp = randn(size_t(n_pages) * ps * n_kv * hd, rng);
  auto q = randn(size_t(n_pre) * n_head * hd, rng);
  std::vector<float> ao(size_t(n_pre) * n_head * hd);
  auto attn = [&](int count, int n_past) {
    const Span s{0, 0, count, n_past};
    attention(&s, 1, q.data(), int64_t{n_head} * hd, kp.data(), vp.data(), table.data(), n_pages,
              ps, ao.data(), n_head, n_kv, hd, 1.0f / 16, pool);
  };
  for (int past : {512, 4096}) {
    std::printf("attention decode, %d past: %.1f us\n", past,
                median_us(200, [&] { attn(1, past); }));
  }
  std::printf("attention prefill, %d tokens: %.2f ms\n", n_pre,
              median_us(10, [&] { attn(n_pre, 0); }) / 1000);
  return 0;
}
