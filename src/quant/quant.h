// Block formats and reference (de)quantisation for GGML types.
//
// Layouts and arithmetic follow ggml's reference C code (ggml-quants.c), so dequantised values
// equal the PyPI gguf package's gguf.quants.dequantize. These are reference routines: plain loops,
// one row at a time; fast kernels live in ops/.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace qwenrt::quant {

// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

bool can_dequantize(DType type);
bool can_quantize(DType type);

// Dequantises n elements (n a multiple of the block size) from `src` blocks into dst.
// Throws Error naming `what` (a tensor name) and the type when the type is not supported.
void dequantize(DType type, const void* src, float* dst, int64_t n, std::string_view what = "");

// Quantises n floats (n a multiple of the block size) into blocks at dst.
// Supported: every type can_dequantize accepts (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K..Q6_K, IQ4_NL, IQ4_XS), with ggml's reference quantisers (no importance matrix).
void quantize(DType type, const float* src, void* dst, int64_t n, std::string_view what = "");

}  // namespace qwenrt::quant
