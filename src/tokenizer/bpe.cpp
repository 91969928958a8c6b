#include "tokenizer/bpe.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <queue>

namespace qwenrt::tokenizer {
namespace {

constexpr int32_t kNoRank = INT32_MAX;
// Up to this many bytes a word merges by rescanning a small array (cheap, cache-resident); longer
// ones (CJK runs, long whitespace) use a heap so the work stays O(n log n).
constexpr size_t kShortWord = 48;

uint64_t hash(uint64_t key) {
  return key * 0x9E3779B97F4A7C15ull;
}

}  // namespace

void Bpe::reserve(size_t n_merges) {
  while ((keys_.size() >> 1) < n_merges + 1) grow();
}

void Bpe::grow() {
  const size_t capacity = keys_.empty() ? 64 : keys_.size() * 2;
  std::vector<uint64_t> old_keys(capacity, kEmpty);
  std::vector<Merge> old_values(capacity);
  old_keys.swap(keys_);
  old_values.swap(values_);
  shift_ = 64 - std::countr_zero(capacity);
  const size_t mask = capacity - 1;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] == kEmpty) continue;
    size_t slot = hash(old_keys[i]) >> shift_;
    while (keys_[slot] != kEmpty) slot = (slot + 1) & mask;
    keys_[slot] = old_keys[i];
    values_[slot] = old_values[i];
  }
}

bool Bpe::add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  if ((size_ + 1) * 2 > keys_.size()) grow();
  const uint64_t k = key(left, right);
  const size_t mask = keys_.size() - 1;
  size_t slot = hash(k) >> shift_;
  while (keys_[slot] != kEmpty) {
    if (keys_[slot] == k) return false;
    slot = (slot + 1) & mask;
  }
  keys_[slot] = k;
  values_[slot] = {rank, merged};
  ++size_;
  return true;
}

const Bpe::Merge* Bpe::find(int32_t left, int32_t right) const {
  if (keys_.empty()) return nullptr;
  const uint64_t k = key(left, right);
  const size_t mask = keys_.size() - 1;
  for (size_t slot = hash(k) >> shift_;; slot = (slot + 1) & mask) {
    if (keys_[slot] == k) return &values_[slot];
    if (keys_[slot] == kEmpty) return nullptr;
  }
}

void Bpe::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.size() == 1) {
    out.push_back(byte_token_[static_cast<uint8_t>(bytes[0])]);
  } else if (bytes.size() <= kShortWord) {
    encode_short(bytes, out);
  } else {
    encode_long(bytes, out);
  }
}

void Bpe::encode_short(std::string_view bytes, std::vector<int32_t>& out) const {
  // symbols[i] and the merge of (symbols[i], symbols[i + 1]) as rank/merged, kept in step.
  std::array<int32_t, kShortWord> symbols;
  std::array<int32_t, kShortWord> ranks;
  std::array<int32_t, kShortWord> merged;
  size_t n = bytes.size();
  for (size_t i = 0; i < n; ++i) symbols[i] = byte_token_[static_cast<uint8_t>(bytes[i])];
  auto update = [&](size_t i) {
    const Merge* m = find(symbols[i], symbols[i + 1]);
    ranks[i] = m ? m->rank : kNoRank;
    merged[i] = m ? m->merged : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) update(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoRank) break;
    symbols[best] = merged[best];
    std::copy(symbols.begin() + best + 2, symbols.begin() + n, symbols.begin() + best + 1);
    std::copy(ranks.begin() + best + 2, ranks.begin() + n, ranks.begin() + best + 1);
    std::copy(merged.begin() + best + 2, merged.begin() + n, merged.begin() + best + 1);
    --n;
    if (best > 0) update(best - 1);
    if (best + 1 < n) update(best);
  }
  out.insert(out.end(), symbols.begin(), symbols.begin() + n);
}

void Bpe::encode_long(std::string_view bytes, std::vector<int32_t>& out) const {
  // Symbols stay at their first byte's index in a linked list; a merge absorbs the right one.
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
  };
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const auto n = static_cast<int32_t>(bytes.size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_token_[static_cast<uint8_t>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* m = find(symbols[pos].id, symbols[next].id)) {
      heap.push({m->rank, pos, symbols[pos].id, symbols[next].id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    // Stale when either side has changed since the candidate was pushed.
    if (left.id != c.left || left.next < 0 || symbols[left.next].id != c.right) continue;
    Symbol& right = symbols[left.next];
    left.id = find(c.left, c.right)->merged;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    right.id = -1;  // absorbed: no candidate at its position validates again
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace qwenrt::tokenizer
