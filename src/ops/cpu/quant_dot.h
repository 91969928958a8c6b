// Quantised activations and the weight-row x activation-row dot products the CPU matmul is made
// of, one table of kernels per ISA level.
//
// Activations are quantised once per matmul input and reused by every weight row (as ggml does):
//  - BlockQ8K (256 values, fp32 scale, per-16 sums) for the K-quants and IQ4_XS: the sums fold the
//    K-quants' mins and the unsigned-code offsets out of the inner loop;
//  - BlockQ8_32 (32 values, fp32 scale, block sum) for Q8_0, Q4_0 and Q5_0 (the sum folds their
//    -8 / -16 offsets).
// Weight blocks are read from their byte stream with memcpy / unaligned loads (GGUF blocks are not
// naturally aligned, and ASan/UBSan builds check).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/isa.h"

namespace qwenrt::ops::cpu {

struct BlockQ8K {
  float d;            // x = d * q
  int16_t bsums[16];  // sum of q over each 16 consecutive values
  int8_t qs[256];
};
struct BlockQ8_32 {
  float d;      // x = d * q
  int32_t sum;  // sum of q over the block
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8K) == 292 && sizeof(BlockQ8_32) == 40);

// What a weight type multiplies against.
enum class ActFormat { kF32, kQ8K, kQ8_32 };
ActFormat act_format(DType weight_type);
// Bytes of one quantised activation row of `in` values (in a multiple of the format's block).
int64_t act_row_bytes(ActFormat f, int64_t in);
// Quantises x [in] into one row of the format (kF32: a plain copy). dst is 4-byte aligned. The
// same bytes at every ISA level (active_isa() picks the code).
void quantize_act_row(ActFormat f, const float* x, int64_t in, void* dst);
// The int8 formats at one level (quant_dot_avx2.cpp, quant_dot_avx512.cpp).
void quantize_act_row_avx2(ActFormat f, const float* x, int64_t in, void* dst);
void quantize_act_row_avx512(ActFormat f, const float* x, int64_t in, void* dst);

// sum_i w[i] * a[i] over one weight row of n_blocks blocks (of the weight type) and one
// activation row in act_format(type).
using DotFn = float (*)(int64_t n_blocks, const uint8_t* w_row, const void* act_row);

// The fast dot for `type` at `isa`, or nullptr when the type has none (the matmul then
// dequantises rows to fp32). The scalar level has one for every fast type, so lower levels are
// always available.
DotFn dot_kernel(DType type, Isa isa);

// Per-ISA tables (quant_dot_scalar.cpp, quant_dot_avx2.cpp, quant_dot_avx512.cpp).
DotFn dot_kernel_scalar(DType type);
DotFn dot_kernel_avx2(DType type);
DotFn dot_kernel_avx512(DType type);

// fp32 dot of n floats at the given level (n any length).
float dot_f32(const float* a, const float* b, int64_t n, Isa isa);
float dot_f32_avx2(const float* a, const float* b, int64_t n);
float dot_f32_avx512(const float* a, const float* b, int64_t n);

// The IQ4_NL / IQ4_XS code book (ggml's kvalues_iq4nl).
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// The j-th of the eight 6-bit (scale, min) pairs of a Q4_K / Q5_K block (ggml's
// get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace qwenrt::ops::cpu
