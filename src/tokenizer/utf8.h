// UTF-8 checks and repair for text the tokenizer takes in and gives out.
//
// Invalid input is repaired the way Python's bytes.decode(errors="replace") and Rust's
// String::from_utf8_lossy do (Unicode's "substitution of maximal subparts"): each maximal prefix
// of a well-formed sequence that cannot be completed, and each byte that starts none, becomes one
// U+FFFD. HF tokenizers only ever sees text repaired that way, so encoding repairs first too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qwenrt::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at text[pos]; 0 when it is invalid or cut short.
size_t utf8_sequence_length(std::string_view text, size_t pos);

bool is_valid_utf8(std::string_view text);

// Appends `bytes` to `out` with every invalid part replaced by U+FFFD (rule above). When
// `hold_incomplete_tail` is set, a trailing sequence that is valid so far but unfinished is not
// written; the return value is its length (the caller keeps those bytes for later), else 0.
size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool hold_incomplete_tail);

inline std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  append_utf8_lossy(bytes, out, false);
  return out;
}

// Decodes the well-formed sequence of `length` bytes at text[pos].
uint32_t decode_utf8(std::string_view text, size_t pos, size_t length);
void append_utf8(uint32_t cp, std::string& out);

}  // namespace qwenrt::tokenizer
