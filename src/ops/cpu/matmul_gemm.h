// Batched (prefill) matmul for Q4_K/Q5_K/Q6_K/Q8_0/Q4_0 on AVX-512 VNNI: 16-row panels unpacked
// to int8 once per call and reused for every token row (matmul_gemm_avx512.cpp).
#pragma once

#include <cstdint>

#include "ops/cpu/isa.h"
#include "ops/cpu/matmul.h"

namespace qwenrt::ops::cpu {

// Batches at least this large take the panel path: measured on Q4_K [2048 x 8192], one core,
// n = 4 takes 2.14 ms as GEMV and less as panels; at n = 2 the two are even.
inline constexpr int64_t kGemmMinTokens = 4;
// Panel-layout weights (repack.h) take every batch on the tile kernels; up to this many tokens
// the matmul streams the weights like a GEMV (rows handed out in chunks).
inline constexpr int64_t kPanelStreamTokens = 8;

// Whether gemm_rows handles this row-layout weight type, batch and ISA level (it handles every
// panel-layout weight).
bool gemm_eligible(DType type, int64_t n_tokens, Isa isa);

// As matmul_rows (matmul.h): y[t * ldy + (r - r0)] = W row r . act row t, r in [r0, r1).
void gemm_rows(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
               int64_t ldy, ScratchBuffer& tmp);

}  // namespace qwenrt::ops::cpu
