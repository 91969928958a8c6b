// The qwen35 pre-tokenizer: splits normalised text into the pieces BPE sees, with PCRE2 (UTF +
// UCP, JIT-compiled when the platform allows).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace qwenrt::tokenizer {

// The pattern as HF tokenizer.json spells it for Qwen3.5:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}
//   | ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with three changes that make PCRE2 split exactly as HF's Onig does:
// - the contraction group stays case-insensitive (SPEC.md gives llama.cpp's expansion into
//   character classes): both engines fold U+017F (long s) to 's', so apostrophe + U+017F is a
//   contraction for HF and must be for us;
// - \s is spelled out as the White_Space property, which is Onig's \s. PCRE2's (with UCP) is the
//   Z category plus \t\n\v\f\r, and 10.42 also takes U+180E (a format character since Unicode
//   6.3) but not U+0085;
// - \p{L}, \p{M}, \p{N} get the code points Unicode added between PCRE2 10.42's tables (14.0) and
//   Onig's (16.0): unicode_extras.h. Text without any of them is matched with a second, plain
//   compilation, since the long classes slow PCRE2's JIT down by 70%.
std::string qwen35_pattern();

class PreTokenizer {
 public:
  PreTokenizer();  // compiles qwen35_pattern(); throws Error if PCRE2 refuses it
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Calls on_piece(piece) for each consecutive piece of `text`; throws Error if `text` is not valid
  // UTF-8 (Tokenizer::encode repairs it first). Text between matches, if the pattern ever skipped
  // any, is a piece of its own, as in HF's Split(behavior = isolated). Thread-safe.
  template <class OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const {
    split_impl(text, &on_piece,
               [](void* fn, std::string_view piece) { (*static_cast<OnPiece*>(fn))(piece); });
  }

 private:
  void split_impl(std::string_view text, void* fn, void (*call)(void*, std::string_view)) const;

  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace qwenrt::tokenizer
