// NFC = canonical decomposition, canonical ordering, canonical composition (UAX #15).
#include "tokenizer/nfc.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/nfc_tables.h"
#include "tokenizer/utf8.h"

namespace qwenrt::tokenizer {
namespace {

namespace data = nfc_data;

// Hangul syllables decompose and compose arithmetically (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

bool is_unsafe(uint32_t cp) {
  const uint32_t* block = data::kUnsafeBlocks[data::kUnsafeBlockIndex[cp >> 8]];
  return (block[(cp & 255) >> 5] >> (cp & 31)) & 1;
}

uint32_t combining_class(uint32_t cp) {
  const auto* end = data::kCombiningClass + data::kCombiningClassCount;
  const auto* it =
      std::lower_bound(data::kCombiningClass, end, cp,
                       [](const data::CombiningClass& c, uint32_t v) { return c.cp < v; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

const data::Decomposition* find_decomposition(uint32_t cp) {
  const auto* end = data::kDecomposition + data::kDecompositionCount;
  const auto* it =
      std::lower_bound(data::kDecomposition, end, cp,
                       [](const data::Decomposition& d, uint32_t v) { return d.cp < v; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + s % kNCount / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const data::Decomposition* d = find_decomposition(cp);
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

// (first, second) -> primary composite, built once from the decomposition table.
uint32_t compose_pair(uint32_t first, uint32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  static const auto* const pairs = [] {
    auto* map = new std::unordered_map<uint64_t, uint32_t>();
    for (size_t i = 0; i < data::kDecompositionCount; ++i) {
      const auto& d = data::kDecomposition[i];
      if (d.composes) (*map)[uint64_t{d.first} << 32 | d.second] = d.cp;
    }
    return map;
  }();
  const auto it = pairs->find(uint64_t{first} << 32 | second);
  return it == pairs->end() ? 0 : it->second;
}

// The full algorithm on a stretch that starts at a normalization boundary and ends before one.
void normalize_span(std::string_view text, std::string& out) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_sequence_length(text, pos);
    decompose(decode_utf8(text, pos, length), cps);
    pos += length;
  }
  std::vector<uint32_t> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = combining_class(cps[i]);

  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc[j] != 0) ++j;
    std::vector<std::pair<uint32_t, uint32_t>> run;
    for (size_t k = i; k < j; ++k) run.emplace_back(ccc[k], cps[k]);
    std::stable_sort(run.begin(), run.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t k = i; k < j; ++k) std::tie(ccc[k], cps[k]) = run[k - i];
    i = j;
  }

  // Canonical composition: each character joins the last starter unless blocked (a character
  // between them has class 0 or a class not below its own).
  std::vector<uint32_t> composed;
  std::vector<uint32_t> composed_ccc;
  composed.reserve(cps.size());
  size_t starter = SIZE_MAX;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = ccc[i];
    if (starter != SIZE_MAX) {
      const bool adjacent = composed.size() - 1 == starter;
      const bool blocked = !adjacent && (composed_ccc.back() == 0 || composed_ccc.back() >= c);
      if (!blocked) {
        if (const uint32_t composite = compose_pair(composed[starter], cps[i])) {
          composed[starter] = composite;
          continue;
        }
      }
    }
    if (c == 0) starter = composed.size();
    composed.push_back(cps[i]);
    composed_ccc.push_back(c);
  }
  for (const uint32_t cp : composed) append_utf8(cp, out);
}

}  // namespace

std::string_view normalize_nfc(std::string_view text, std::string& storage) {
  // A code point the table does not flag is a normalization boundary: nothing before it interacts
  // with anything after it. So only the stretches from the boundary before a flagged code point
  // to the boundary after it need the full algorithm; the rest is copied. Code points below
  // U+0300 (lead bytes below 0xCC) are never flagged.
  size_t copied = 0;         // text[0, copied) has been dealt with
  size_t last_boundary = 0;  // start of the last unflagged code point seen
  bool changed = false;
  for (size_t pos = 0; pos < text.size();) {
    const auto lead = static_cast<uint8_t>(text[pos]);
    if (lead < 0xCC) {
      last_boundary = pos;
      pos += lead < 0x80 ? 1 : 2;
      continue;
    }
    size_t length = utf8_sequence_length(text, pos);
    if (!is_unsafe(decode_utf8(text, pos, length))) {
      last_boundary = pos;
      pos += length;
      continue;
    }
    if (!changed) {
      storage.clear();
      storage.reserve(text.size() + 16);
      changed = true;
    }
    const size_t start = std::max(last_boundary, copied);
    storage.append(text.substr(copied, start - copied));
    size_t end = pos + length;
    while (end < text.size()) {
      length = utf8_sequence_length(text, end);
      if (!is_unsafe(decode_utf8(text, end, length))) break;
      end += length;
    }
    normalize_span(text.substr(start, end - start), storage);
    copied = end;
    last_boundary = end;
    pos = end;
  }
  if (!changed) return text;
  storage.append(text.substr(copied));
  return storage;
}

}  // namespace qwenrt::tokenizer
