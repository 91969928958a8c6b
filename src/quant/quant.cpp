// Dispatch from a DType to the per-block reference routines, and the argument checks.
#include "quant/quant.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "quant/blocks.h"

namespace qwenrt::quant {
namespace {

// Calls fn(Block{}) with a value of the block struct for `type`; false if there is none.
template <class Fn>
bool with_block_type(DType type, Fn&& fn) {
  // clang-format off
  switch (type) {
    case DType::Q4_0:   fn(BlockQ4_0{});   return true;
    case DType::Q4_1:   fn(BlockQ4_1{});   return true;
    case DType::Q5_0:   fn(BlockQ5_0{});   return true;
    case DType::Q5_1:   fn(BlockQ5_1{});   return true;
    case DType::Q8_0:   fn(BlockQ8_0{});   return true;
    case DType::Q2_K:   fn(BlockQ2_K{});   return true;
    case DType::Q3_K:   fn(BlockQ3_K{});   return true;
    case DType::Q4_K:   fn(BlockQ4_K{});   return true;
    case DType::Q5_K:   fn(BlockQ5_K{});   return true;
    case DType::Q6_K:   fn(BlockQ6_K{});   return true;
    case DType::IQ4_NL: fn(BlockIQ4_NL{}); return true;
    case DType::IQ4_XS: fn(BlockIQ4_XS{}); return true;
    default:            return false;
  }
  // clang-format on
}

bool is_float_type(DType type) {
  return type == DType::F32 || type == DType::F16 || type == DType::BF16;
}

bool is_implemented(DType type) {
  return is_float_type(type) || with_block_type(type, [](auto) {});
}

// "tensor 'blk.0.ffn_up.weight': " or "" when the caller gave no name.
std::string subject(std::string_view what) {
  return what.empty() ? std::string() : fmt::format("tensor '{}': ", what);
}

// "type Q4_K", or "unknown type id 77" for ids GGUF does not define.
std::string type_label(DType type) {
  const auto id = static_cast<uint32_t>(type);
  return dtype_traits(id) ? fmt::format("type {}", dtype_name(id))
                          : fmt::format("unknown type id {}", id);
}

std::string supported_list(bool (*can)(DType)) {
  std::string list;
  for (uint32_t id = 0; id < 64; ++id) {
    if (!dtype_traits(id) || !can(static_cast<DType>(id))) continue;
    if (!list.empty()) list += ", ";
    list += dtype_name(id);
  }
  return list;
}

// Checks everything but the pointers' targets; returns the block geometry of `type`.
const DTypeTraits& check_args(const char* verb, bool (*can)(DType), DType type, const void* in,
                              const void* out, int64_t n, std::string_view what) {
  if (!can(type)) {
    fail("{}{} is not supported for {} (supported: {})", subject(what), type_label(type), verb,
         supported_list(can));
  }
  const DTypeTraits& t = traits(type);
  if (n < 0) fail("{}{}: negative element count {}", subject(what), verb, n);
  if (n % t.block_elems != 0) {
    fail("{}{} elements is not a multiple of the {} block size {}", subject(what), n, t.name,
         t.block_elems);
  }
  if (n > 0 && (in == nullptr || out == nullptr)) {
    fail("{}{}: null buffer for {} elements", subject(what), verb, n);
  }
  return t;
}

// One block at a time: copy it out of the byte stream (the source may be unaligned), decode.
template <class Block>
void dequantize_blocks(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    Block block;
    std::memcpy(&block, src + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
    dequantize_block(block, dst + i * Block::kElems);
  }
}

template <class Block>
void quantize_blocks(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    Block block{};
    quantize_block(src + i * Block::kElems, block);
    std::memcpy(dst + i * static_cast<int64_t>(sizeof(Block)), &block, sizeof(Block));
  }
}

// F32 is copied; F16 and BF16 are widened one element at a time (the source may be unaligned).
void float_type_to_f32(DType type, const uint8_t* src, float* dst, int64_t n) {
  if (type == DType::F32) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, sizeof h);
    dst[i] = type == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}

// The inverse: F32 is copied; F16 and BF16 are rounded to 16 bits.
void f32_to_float_type(DType type, const float* src, uint8_t* dst, int64_t n) {
  if (type == DType::F32) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = type == DType::F16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &h, sizeof h);
  }
}

}  // namespace

bool can_dequantize(DType type) {
  return is_implemented(type);
}

bool can_quantize(DType type) {
  return is_implemented(type);
}

void dequantize(DType type, const void* src, float* dst, int64_t n, std::string_view what) {
  const DTypeTraits& t = check_args("dequantisation", can_dequantize, type, src, dst, n, what);
  const auto* bytes = static_cast<const uint8_t*>(src);
  if (is_float_type(type)) return float_type_to_f32(type, bytes, dst, n);
  const int64_t n_blocks = n / t.block_elems;
  with_block_type(type,
                  [&](auto block) { dequantize_blocks<decltype(block)>(bytes, dst, n_blocks); });
}

void quantize(DType type, const float* src, void* dst, int64_t n, std::string_view what) {
  const DTypeTraits& t = check_args("quantisation", can_quantize, type, src, dst, n, what);
  auto* bytes = static_cast<uint8_t*>(dst);
  if (is_float_type(type)) return f32_to_float_type(type, src, bytes, n);
  const int64_t n_blocks = n / t.block_elems;
  with_block_type(type,
                  [&](auto block) { quantize_blocks<decltype(block)>(src, bytes, n_blocks); });
}

}  // namespace qwenrt::quant
