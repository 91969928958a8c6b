// On-disk block layouts of the GGML quantised types we support, and the per-block reference
// routines the families implement (legacy.cpp, kquants.cpp, iquants.cpp).
//
// Every field is a byte array or a uint16_t, so each struct has alignment <= 2 and no padding;
// sizes are checked below against ggml's table (and against core/dtype.cpp in tests). f16 fields
// are stored as raw IEEE half bits. Callers copy a block out of the byte stream before decoding
// (the source need not be aligned), so these structs never alias mapped file memory.
#pragma once

#include <bit>
#include <cstdint>

#include "core/dtype.h"

namespace qwenrt::quant {

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little-endian; a big-endian host needs byte swaps here");

inline constexpr int kQK_K = 256;  // elements in a k-quant / IQ4_XS super-block
inline constexpr int kQK32 = 32;   // elements in a legacy / IQ4_NL block

// --- legacy: 32 elements, one scale (and min) per block --------------------------------------
// Element j < 16 is in the low nibble of qs[j], element j + 16 in the high nibble.
struct BlockQ4_0 {
  static constexpr DType kType = DType::Q4_0;
  static constexpr int kElems = kQK32;
  uint16_t d;  // scale (f16); x = d * (q - 8)
  uint8_t qs[kQK32 / 2];
};
struct BlockQ4_1 {
  static constexpr DType kType = DType::Q4_1;
  static constexpr int kElems = kQK32;
  uint16_t d;  // scale (f16); x = d * q + m
  uint16_t m;  // min (f16)
  uint8_t qs[kQK32 / 2];
};
struct BlockQ5_0 {
  static constexpr DType kType = DType::Q5_0;
  static constexpr int kElems = kQK32;
  uint16_t d;     // scale (f16); x = d * (q - 16)
  uint8_t qh[4];  // fifth bits: bit j of the little-endian u32 belongs to element j
  uint8_t qs[kQK32 / 2];
};
struct BlockQ5_1 {
  static constexpr DType kType = DType::Q5_1;
  static constexpr int kElems = kQK32;
  uint16_t d;  // scale (f16); x = d * q + m
  uint16_t m;  // min (f16)
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
struct BlockQ8_0 {
  static constexpr DType kType = DType::Q8_0;
  static constexpr int kElems = kQK32;
  uint16_t d;  // scale (f16); x = d * q
  int8_t qs[kQK32];
};

// --- k-quants: 256-element super-blocks of 16 or 32-element sub-blocks -----------------------
struct BlockQ2_K {
  static constexpr DType kType = DType::Q2_K;
  static constexpr int kElems = kQK_K;
  uint8_t scales[kQK_K / 16];  // per 16: low nibble scale, high nibble min (4 bits each)
  uint8_t qs[kQK_K / 4];       // 2-bit quants, four 32-element groups per 32 bytes
  uint16_t d;                  // super-block scale for scales (f16)
  uint16_t dmin;               // super-block scale for mins (f16)
};
struct BlockQ3_K {
  static constexpr DType kType = DType::Q3_K;
  static constexpr int kElems = kQK_K;
  uint8_t hmask[kQK_K / 8];  // third bits (set means "no -4 offset")
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // sixteen 6-bit signed scales (+32 bias), packed
  uint16_t d;                // super-block scale (f16)
};
struct BlockQ4_K {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kElems = kQK_K;
  uint16_t d;             // super-block scale for scales (f16)
  uint16_t dmin;          // super-block scale for mins (f16)
  uint8_t scales[12];     // eight 6-bit scales and eight 6-bit mins (get_scale_min_k4 packing)
  uint8_t qs[kQK_K / 2];  // 4-bit quants, 64 elements per 32 bytes
};
struct BlockQ5_K {
  static constexpr DType kType = DType::Q5_K;
  static constexpr int kElems = kQK_K;
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];  // fifth bits
  uint8_t qs[kQK_K / 2];  // low 4 bits
};
struct BlockQ6_K {
  static constexpr DType kType = DType::Q6_K;
  static constexpr int kElems = kQK_K;
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit signed sub-block scales
  uint16_t d;                 // super-block scale (f16)
};

// --- non-linear 4-bit: nibbles index kIQ4NLValues -------------------------------------------
struct BlockIQ4_NL {
  static constexpr DType kType = DType::IQ4_NL;
  static constexpr int kElems = kQK32;
  uint16_t d;  // scale (f16)
  uint8_t qs[kQK32 / 2];
};
struct BlockIQ4_XS {
  static constexpr DType kType = DType::IQ4_XS;
  static constexpr int kElems = kQK_K;
  uint16_t d;                    // super-block scale (f16)
  uint16_t scales_h;             // high 2 bits of the eight 6-bit sub-block scales
  uint8_t scales_l[kQK_K / 64];  // low 4 bits, two per byte
  uint8_t qs[kQK_K / 2];         // per 32-element sub-block: 16 bytes laid out as IQ4_NL
};

// Sizes from ggml's type table (also checked against traits() in tests/test_quant.cpp).
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);

// Per-block reference routines: dequantize writes Block::kElems floats to y; quantize reads
// Block::kElems floats from x and writes every byte of the block.
void dequantize_block(const BlockQ4_0& b, float* y);
void dequantize_block(const BlockQ4_1& b, float* y);
void dequantize_block(const BlockQ5_0& b, float* y);
void dequantize_block(const BlockQ5_1& b, float* y);
void dequantize_block(const BlockQ8_0& b, float* y);
void dequantize_block(const BlockQ2_K& b, float* y);
void dequantize_block(const BlockQ3_K& b, float* y);
void dequantize_block(const BlockQ4_K& b, float* y);
void dequantize_block(const BlockQ5_K& b, float* y);
void dequantize_block(const BlockQ6_K& b, float* y);
void dequantize_block(const BlockIQ4_NL& b, float* y);
void dequantize_block(const BlockIQ4_XS& b, float* y);

void quantize_block(const float* x, BlockQ4_0& b);
void quantize_block(const float* x, BlockQ4_1& b);
void quantize_block(const float* x, BlockQ5_0& b);
void quantize_block(const float* x, BlockQ5_1& b);
void quantize_block(const float* x, BlockQ8_0& b);
void quantize_block(const float* x, BlockQ2_K& b);
void quantize_block(const float* x, BlockQ3_K& b);
void quantize_block(const float* x, BlockQ4_K& b);
void quantize_block(const float* x, BlockQ5_K& b);
void quantize_block(const float* x, BlockQ6_K& b);
void quantize_block(const float* x, BlockIQ4_NL& b);
void quantize_block(const float* x, BlockIQ4_XS& b);

// ggml's nearest_int: round half to even via the 1.5 * 2^23 trick, valid for |v| <= 2^22 - 1.
// Outside that range (or for NaN, which only garbage input produces) we saturate instead of
// returning ggml's garbage, so the result is always defined; every caller clamps it further.
int nearest_int(float v);

}  // namespace qwenrt::quant
