#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "core/error.h"
#include "tokenizer/unicode_extras.h"
#include "tokenizer/utf8.h"

namespace qwenrt::tokenizer {

namespace {

// with_extras = false leaves out unicode_extras.h: the same splits on text without those code
// points, and much faster (PCRE2's JIT tests a long class range by range).
std::string build_pattern(bool with_extras) {
  const std::string space =
      R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string letter = R"(\p{L})", mark = R"(\p{M})", number = R"(\p{N})";
  if (with_extras) {
    letter += kExtraLetters;
    mark += kExtraMarks;
    number += kExtraNumbers;
  }
  std::string p = R"((?i:'s|'t|'re|'ve|'m|'ll|'d))";
  p += "|[^\\r\\n" + letter + number + "]?[" + letter + mark + "]+";
  p += "|[" + number + "]";
  p += "| ?[^" + space + letter + mark + number + "]+[\\r\\n]*";
  p += "|[" + space + "]*[\\r\\n]+";
  p += "|[" + space + "]+(?![^" + space + "])";
  p += "|[" + space + "]+";
  return p;
}

// Whether `text` (valid UTF-8) holds a code point of kExtraRanges; all of them are U+0800 or above,
// so only sequences with a lead byte from 0xE0 up are decoded.
bool has_extra_code_point(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size(); ++i) {
    if (p[i] < 0xE0) continue;
    const uint32_t cp = p[i] < 0xF0
                            ? (p[i] & 0x0Fu) << 12 | (p[i + 1] & 0x3Fu) << 6 | (p[i + 2] & 0x3Fu)
                            : (p[i] & 0x07u) << 18 | (p[i + 1] & 0x3Fu) << 12 |
                                  (p[i + 2] & 0x3Fu) << 6 | (p[i + 3] & 0x3Fu);
    const auto* end = std::end(kExtraRanges);
    const auto* it = std::upper_bound(std::begin(kExtraRanges), end, cp,
                                      [](uint32_t v, const uint32_t(&r)[2]) { return v < r[0]; });
    if (it != std::begin(kExtraRanges) && cp <= (*(it - 1))[1]) return true;
  }
  return false;
}

}  // namespace

std::string qwen35_pattern() {
  return build_pattern(true);
}

struct PreTokenizer::Compiled {
  struct Code {
    pcre2_code* code = nullptr;
    bool jit = false;
  };
  Code plain, extended;
  ~Compiled() {
    pcre2_code_free(plain.code);
    pcre2_code_free(extended.code);
  }
};

namespace {

void compile(const std::string& pattern, pcre2_code*& code, bool& jit) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                       PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail("tokenizer: PCRE2 rejects the qwen35 pattern at offset {}: {}", offset,
         reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation: without it (unsupported platform, no executable memory) the
  // interpreter gives the same matches.
  jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

}  // namespace

PreTokenizer::PreTokenizer() : compiled_(std::make_unique<Compiled>()) {
  compile(build_pattern(false), compiled_->plain.code, compiled_->plain.jit);
  compile(build_pattern(true), compiled_->extended.code, compiled_->extended.jit);
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split_impl(std::string_view text, void* fn,
                              void (*call)(void*, std::string_view)) const {
  struct MatchData {
    pcre2_match_data* data;
    ~MatchData() { pcre2_match_data_free(data); }
  } match{pcre2_match_data_create(1, nullptr)};
  if (match.data == nullptr) fail("tokenizer: out of memory for PCRE2 match data");
  // PCRE2_NO_UTF_CHECK below reads invalid UTF-8 out of bounds; one check here (a few percent of
  // the encode time) keeps that impossible whoever calls.
  if (!is_valid_utf8(text)) fail("tokenizer: pre-tokenizer input is not valid UTF-8");

  const Compiled::Code& c = has_extra_code_point(text) ? compiled_->extended : compiled_->plain;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = c.jit ? pcre2_jit_match(c.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                           match.data, nullptr)
                         : pcre2_match(c.code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                       match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      fail("tokenizer: PCRE2 match failed at byte {} of {}: {}", pos, text.size(),
           reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t start = ovector[0], end = ovector[1];
    if (start > pos) call(fn, text.substr(pos, start - pos));
    if (end == start) {
      // Every alternative consumes a character, so this cannot happen; guard the loop anyway.
      fail("tokenizer: qwen35 pattern matched the empty string at byte {}", start);
    }
    call(fn, text.substr(start, end - start));
    pos = end;
  }
  if (pos < text.size()) call(fn, text.substr(pos));
}

}  // namespace qwenrt::tokenizer
