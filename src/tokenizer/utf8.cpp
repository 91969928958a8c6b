#include "tokenizer/utf8.h"

namespace qwenrt::tokenizer {
namespace {

// Unicode Table 3-7: the sequence length a lead byte announces and the range its second byte must
// fall in (later bytes are always 80..BF). Length 0: not a lead byte.
struct Lead {
  uint8_t length, lo, hi;
};

constexpr Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes from text[pos] belong to the sequence its lead byte starts (at least 1), and
// whether they complete it.
struct Scan {
  size_t length;
  bool complete;
};

Scan scan(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const Lead lead = lead_of(p[pos]);
  if (lead.length <= 1) return {1, lead.length == 1};
  size_t n = 1;
  while (n < lead.length && pos + n < text.size()) {
    const uint8_t b = p[pos + n];
    const bool ok = n == 1 ? (b >= lead.lo && b <= lead.hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++n;
  }
  return {n, n == lead.length};
}

}  // namespace

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const Scan s = scan(text, pos);
  return s.complete ? s.length : 0;
}

bool is_valid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII runs are the common case: take eight bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word = 0;
      for (int i = 0; i < 8; ++i) word |= uint64_t{static_cast<uint8_t>(text[pos + i])} << (8 * i);
      if (word & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    const Scan s = scan(text, pos);
    if (!s.complete) return false;
    pos += s.length;
  }
  return true;
}

size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool hold_incomplete_tail) {
  size_t pos = 0;
  size_t run = 0;  // start of the pending run of valid bytes
  while (pos < bytes.size()) {
    const Scan s = scan(bytes, pos);
    if (s.complete) {
      pos += s.length;
      continue;
    }
    out.append(bytes.substr(run, pos - run));
    if (hold_incomplete_tail && pos + s.length == bytes.size() && s.length > 0 &&
        lead_of(static_cast<uint8_t>(bytes[pos])).length > 1) {
      return s.length;  // valid so far, more bytes may complete it
    }
    out.append(kReplacementChar);
    pos += s.length;
    run = pos;
  }
  out.append(bytes.substr(run));
  return 0;
}

uint32_t decode_utf8(std::string_view text, size_t pos, size_t length) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  switch (length) {
    case 1:
      return p[0];
    case 2:
      return (uint32_t{p[0]} & 0x1F) << 6 | (p[1] & 0x3F);
    case 3:
      return (uint32_t{p[0]} & 0x0F) << 12 | (uint32_t{p[1]} & 0x3F) << 6 | (p[2] & 0x3F);
    default:
      return (uint32_t{p[0]} & 0x07) << 18 | (uint32_t{p[1]} & 0x3F) << 12 |
             (uint32_t{p[2]} & 0x3F) << 6 | (p[3] & 0x3F);
  }
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace qwenrt::tokenizer
