#include "ops/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/common.h"

#define QWENRT_CPU_BODY "ops/cpu/elementwise_body.inc"
#include "ops/cpu/simd_instances.inc"

namespace qwenrt::ops::cpu {
namespace {

// Below this many floats a call runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelFloats = 1 << 15;

// Splits [0, n) items of `item_floats` each over the pool when the total is large.
template <class Fn>
void split(ThreadPool& pool, int64_t n, int64_t item_floats, const Fn& fn) {
  if (n <= 0) return;
  if (n * item_floats < kParallelFloats || pool.size() == 1) {
    fn(0, n);
    return;
  }
  const Fn* f = &fn;
  pool.parallel_for(n, [f](int64_t b, int64_t e) { (*f)(b, e); });
}

}  // namespace

void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
             ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(rmsnorm_rows);
  split(pool, rows, dim, [&](int64_t b, int64_t e) { fn(x, weight, out, b, e, dim, eps); });
}

void add_rmsnorm(float* x, const float* mixed, const float* weight, float* out, int64_t rows,
                 int64_t dim, float eps, ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(add_rmsnorm_rows);
  split(pool, rows, dim, [&](int64_t b, int64_t e) { fn(x, mixed, weight, out, b, e, dim, eps); });
}

void l2norm(float* x, int64_t rows, int64_t dim, int64_t stride, float eps, ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(l2norm_rows);
  split(pool, rows, dim, [&](int64_t b, int64_t e) { fn(x, b, e, dim, stride, eps); });
}

void rope_neox_table(const int32_t* positions, int64_t n_tokens, int n_rot, float theta,
                     float* cos_sin, ThreadPool& pool) {
  const int half = n_rot / 2;
  // The same double-precision angles as ref::rope_neox; the pow per pair is hoisted out.
  double freq[512];
  double* freqs = freq;
  std::vector<double> big;
  if (half > 512) {
    big.resize(half);
    freqs = big.data();
  }
  for (int i = 0; i < half; ++i) freqs[i] = std::pow(double(theta), -2.0 * i / n_rot);
  // sin/cos in double cost ~40 ns a pair: worth the pool for a prefill's table.
  split(pool, n_tokens, 16 * half, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* row = cos_sin + t * n_rot;
      for (int i = 0; i < half; ++i) {
        const double angle = positions[t] * freqs[i];
        row[i] = static_cast<float>(std::cos(angle));
        row[half + i] = static_cast<float>(std::sin(angle));
      }
    }
  });
}

void rope_neox_apply(float* x, const float* cos_sin, int64_t n_tokens, int n_heads, int head_dim,
                     int64_t token_stride, int n_rot, ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(rope_rows);
  split(pool, n_tokens, int64_t{n_heads} * n_rot, [&](int64_t b, int64_t e) {
    fn(x, cos_sin, b, e, n_heads, head_dim, token_stride, n_rot);
  });
}

void rope_neox(float* x, const int32_t* positions, int64_t n_tokens, int n_heads, int head_dim,
               int64_t token_stride, int n_rot, float theta, ThreadPool& pool) {
  float* table = thread_scratch(static_cast<size_t>(n_tokens * n_rot));
  rope_neox_table(positions, n_tokens, n_rot, theta, table, pool);
  rope_neox_apply(x, table, n_tokens, n_heads, head_dim, token_stride, n_rot, pool);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(silu_mul_range);
  // Chunks of 1024 floats: whole vectors, and no false sharing between threads.
  const int64_t chunks = (n + 1023) / 1024;
  split(pool, chunks, 1024,
        [&](int64_t b, int64_t e) { fn(gate, up, out, b * 1024, std::min(n, e * 1024)); });
}

void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                 int64_t cols, ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(sigmoid_mul_rows);
  split(pool, rows, cols, [&](int64_t b, int64_t e) { fn(x, gate, gate_stride, out, b, e, cols); });
}

void add(const float* a, const float* b, float* out, int64_t n, ThreadPool& pool) {
  auto fn = QWENRT_CPU_PICK(add_range);
  const int64_t chunks = (n + 1023) / 1024;
  split(pool, chunks, 1024,
        [&](int64_t lo, int64_t hi) { fn(a, b, out, lo * 1024, std::min(n, hi * 1024)); });
}

}  // namespace qwenrt::ops::cpu
