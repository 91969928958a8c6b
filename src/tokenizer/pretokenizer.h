// The qwen35 pre-tokenizer: splits normalised text into the pieces BPE sees, with PCRE2 (UTF +
// UCP, JIT-compiled when the platform allows).
#pragma once

#include <memory>
#include <string_view>

namespace qwenrt::tokenizer {

// The pattern as HF tokenizer.json spells it for Qwen3.5, with two changes that make PCRE2 match
// what HF's Onig matches:
// - the contraction group stays case-insensitive (SPEC.md gives llama.cpp's expansion into
//   character classes): both engines fold U+017F (long s) to 's', so apostrophe + U+017F is a
//   contraction for HF and must be for us;
// - \s is spelled out as the White_Space property, which is Onig's \s. PCRE2's (with UCP) is the
//   Z category plus \t\n\v\f\r, and 10.42 also takes U+180E (a format character
//   since Unicode 6.3) but not U+0085.
#define QWENRT_WHITE_SPACE \
  R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"
inline constexpr std::string_view kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^)" QWENRT_WHITE_SPACE
    R"(\p{L}\p{M}\p{N}]+[\r\n]*|[)" QWENRT_WHITE_SPACE R"(]*[\r\n]+|[)" QWENRT_WHITE_SPACE
    R"(]+(?![^)" QWENRT_WHITE_SPACE R"(])|[)" QWENRT_WHITE_SPACE R"(]+)";
#undef QWENRT_WHITE_SPACE

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
