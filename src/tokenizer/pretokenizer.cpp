#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace qwenrt::tokenizer {

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer() : compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kQwen35Pattern.data()), kQwen35Pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail("tokenizer: PCRE2 rejects the qwen35 pattern at offset {}: {}", offset,
         reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation: without it (unsupported platform, no executable memory) the
  // interpreter gives the same matches.
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
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

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = compiled_->jit ? pcre2_jit_match(compiled_->code, subject, text.size(), pos,
                                                    PCRE2_NO_UTF_CHECK, match.data, nullptr)
                                  : pcre2_match(compiled_->code, subject, text.size(), pos,
                                                PCRE2_NO_UTF_CHECK, match.data, nullptr);
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
