// The qwen35 pre-tokenizer: splits normalised text into the pieces BPE sees, with PCRE2 (UTF +
// UCP, JIT-compiled when the platform allows).
#pragma once

#include <memory>
#include <string_view>

namespace qwenrt::tokenizer {

// The pattern as HF tokenizer.json spells it for Qwen3.5 (SPEC.md gives llama.cpp's expansion of
// the case-insensitive group). Kept case-insensitive: Onig (HF) and PCRE2 both fold U+017F (long s)
// to 's', so "'ſ" is a contraction for both, and not for the expanded form. `\s` is widened by
// U+0085 (NEL): Onig's \s is the White_Space property, PCRE2's (with UCP) the Z category plus
// \t\n\v\f\r, and NEL is the only character in one and not the other.
inline constexpr std::string_view kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N})"
    R"(| ?[^\s\x{85}\p{L}\p{M}\p{N}]+[\r\n]*|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

class PreTokenizer {
 public:
  PreTokenizer();  // compiles kQwen35Pattern; throws Error if PCRE2 refuses it
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Calls on_piece(piece) for each consecutive piece of `text`, which must be valid UTF-8 (it is
  // matched with PCRE2_NO_UTF_CHECK). Text between matches, if the pattern ever skipped any, is a
  // piece of its own, as in HF's Split(behavior = isolated). Thread-safe.
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
