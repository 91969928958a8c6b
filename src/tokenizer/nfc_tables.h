// Unicode NFC data (generated into nfc_tables.cpp by tools/tokenizer/gen_nfc_tables.py).
// Arrays are sorted by code point; Hangul syllables are algorithmic and not listed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qwenrt::tokenizer::nfc_data {

struct CombiningClass {
  uint32_t cp;
  uint32_t ccc;  // non-zero
};
// One level of canonical decomposition: cp -> first (+ second, 0 for a singleton). `composes` marks
// the primary composites, the pairs canonical composition puts back together.
struct Decomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;
  uint32_t composes;
};

// Two-stage bitmap of the code points NFC may change (non-zero class, not NFC alone, or able to
// combine with the previous one): kUnsafeBlocks[kUnsafeBlockIndex[cp >> 8]], bit cp & 255.
extern const uint16_t kUnsafeBlockIndex[0x110000 >> 8];
extern const uint32_t kUnsafeBlocks[][8];
extern const CombiningClass kCombiningClass[];
extern const Decomposition kDecomposition[];
extern const size_t kUnsafeBlockCount, kCombiningClassCount, kDecompositionCount;

}  // namespace qwenrt::tokenizer::nfc_data
