// The fusable sequences of the Ops interface, as the ops they consist of: the definition a fused
// backend kernel is tested against, and what ref and cpu run.
#include "ops/ops.h"

namespace qwenrt::ops {

void Ops::add_rmsnorm(float* x, const float* delta, const Weight& weight, float* out, int64_t rows,
                      int64_t dim, float eps) {
  add(x, delta, x, rows * dim);
  rmsnorm(x, weight, out, rows, dim, eps);
}

void Ops::matmuls(const float* x, int64_t n, std::span<const Projection> projections) {
  for (const Projection& p : projections) matmul(*p.w, x, p.y, n);
}

void Ops::ffn_swiglu(const Weight& gate, const Weight& up, const Weight& down, const float* x,
                     float* out, int64_t n) {
  const int64_t ff = gate.view.ne[1];
  float* g = alloc(n * ff);
  float* u = alloc(n * ff);
  matmul(gate, x, g, n);
  matmul(up, x, u, n);
  silu_mul(g, u, g, n * ff);
  matmul(down, g, out, n);
}

}  // namespace qwenrt::ops
