// GGML tensor element types: ids as stored in GGUF, block geometry, names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace qwenrt {

// Values are the on-disk ids (ggml_type); gaps are ids ggml retired.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeTraits {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool dequant;          // qwenrt can dequantise it (quant/)
};

// Traits for a known id; nullopt for ids GGUF does not define.
std::optional<DTypeTraits> dtype_traits(uint32_t id);
// Traits of a known type (every enumerator is known).
const DTypeTraits& traits(DType type);
// "Q4_K", or "unknown type 77" for ids GGUF does not define.
std::string dtype_name(uint32_t id);
inline std::string_view dtype_name(DType type) {
  return traits(type).name;
}
// Type id by name ("q4_k" and "Q4_K" both match); nullopt if none.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace qwenrt
