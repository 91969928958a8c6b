// The CPU backend's matmul: y [n, out] = x [n, in] @ W^T for W a view [in, out] (ne[0] = in
// contiguous, row r at data + r * nb[1]).
//
// Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q4_0, Q5_0 run as integer dots against activations quantised once
// per call (quant_dot.h); F32, F16, BF16 against fp32 activations; every other type quant/ supports
// is dequantised row by row into fp32. Batches below kGemmMinTokens (4) stream each weight row once
// for all tokens (GEMV: memory-bound, rows handed out to threads in chunks); larger
// batches on AVX-512 VNNI unpack 16-row panels of Q4_K/Q5_K/Q6_K/Q8_0/Q4_0 weights to int8 once
// and reuse them for every token (matmul_gemm_avx512.cpp). Weights placed in the panel layout
// (repack.h) take the AVX-512 panel kernels for every batch. Not reentrant per Context (one Scratch
// per concurrent caller); must not be called from inside a ThreadPool part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace qwenrt::ops::cpu {

// A grow-only 64-byte-aligned buffer: allocates only when asked for more than it holds.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ScratchBuffer(ScratchBuffer&& o) noexcept;
  ScratchBuffer& operator=(ScratchBuffer&&) = delete;

  void* get(size_t bytes);
  template <class T>
  T* get(size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Reusable buffers, grown during warm-up, never freed per call. One Scratch per concurrent caller.
struct Scratch {
  ScratchBuffer act;                      // quantised activations of the current matmul
  std::vector<ScratchBuffer> per_thread;  // per pool part: weight rows / panels / tiles
  // MoE (moe.cpp): router logits, routing, expert groups, quantised inputs (per token, then
  // gathered per expert), hidden activations and their quantised form, per-thread gate/up tiles.
  ScratchBuffer moe_logits, moe_route, moe_groups, moe_act_x, moe_act_gathered, moe_hidden,
      moe_act_h;
  std::vector<ScratchBuffer> moe_per_thread;

  // Per-thread buffers for a pool of n parts (grows the vector only when the pool is larger).
  void reserve_threads(int n);
};

struct Context {
  ThreadPool& pool;
  Scratch& scratch;
};

// y [n, out] (row t at y + t * out) = x [n, in] @ W^T. x rows are `in` floats apart.
// W: 2D view of any type quant/ dequantises; in a multiple of the type's block size.
void matmul(const TensorView& w, const float* x, float* y, int64_t n, Context& ctx);

// --- building blocks shared with moe.cpp -------------------------------------------------------

// Activation rows prepared for a weight type: n rows, row t at data + t * stride bytes, in the
// type's ActFormat (quant_dot.h).
struct PreparedAct {
  const uint8_t* data;
  int64_t stride;
  int64_t n;
};
// Bytes per prepared activation row for a weight of `type` with `in` inputs.
int64_t prepared_row_bytes(DType type, int64_t in);
// Prepares n rows of x (rows x_stride floats apart) into dst (n * prepared_row_bytes bytes).
void prepare_act_rows(DType type, const float* x, int64_t x_stride, int64_t in, int64_t n,
                      uint8_t* dst);

// Single-threaded: y[t * ldy + (r - r0)] = W row r . act row t for r in [r0, r1), t < act.n.
// `tmp` is the calling thread's scratch.
void matmul_rows(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
                 int64_t ldy, ScratchBuffer& tmp);

// Rows per thread-split unit for a weight type: GEMM panels want multiples of 16.
inline constexpr int64_t kRowAlign = 16;

}  // namespace qwenrt::ops::cpu
