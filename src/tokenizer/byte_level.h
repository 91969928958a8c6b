// GPT-2's byte-level alphabet (bytes_to_unicode): BPE vocabularies spell byte b as one code point,
// b itself for the 188 printable bytes, U+0100 + k for the k-th of the other 68 in byte order.
#pragma once

#include <array>
#include <cstdint>

namespace qwenrt::tokenizer::byte_level {

constexpr bool is_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

inline constexpr std::array<uint16_t, 256> kByteToCodepoint = [] {
  std::array<uint16_t, 256> table{};
  uint16_t next = 0x100;
  for (int b = 0; b < 256; ++b) table[b] = is_printable(b) ? static_cast<uint16_t>(b) : next++;
  return table;
}();

// Inverse of kByteToCodepoint over U+0000..U+0143; -1 for code points outside the alphabet.
inline constexpr std::array<int16_t, 0x144> kCodepointToByte = [] {
  std::array<int16_t, 0x144> table{};
  table.fill(-1);
  for (int b = 0; b < 256; ++b) table[kByteToCodepoint[b]] = static_cast<int16_t>(b);
  return table;
}();

inline int codepoint_to_byte(uint32_t cp) {
  return cp < kCodepointToByte.size() ? kCodepointToByte[cp] : -1;
}

}  // namespace qwenrt::tokenizer::byte_level
