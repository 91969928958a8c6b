#include "gen/prefix_cache.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace qwenrt::gen {
namespace {

// splitmix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t kSeed = 0x7177656e72742d31ull;  // "qwenrt-1"

uint64_t chain(uint64_t h, int32_t token) {
  return mix(h ^ static_cast<uint32_t>(token));
}

}  // namespace

uint64_t prefix_key(std::span<const int32_t> tokens) {
  uint64_t h = kSeed;
  for (int32_t t : tokens) h = chain(h, t);
  return h;
}

PrefixCache::PrefixCache(state::StateStore& store, PrefixCacheOptions options)
    : store_(store), options_(options) {
  if (options_.state_bytes < 0 || options_.host_bytes < 0)
    fail("prefix cache: budgets must be >= 0 (state {}, host {})", options_.state_bytes,
         options_.host_bytes);
  if (options_.snapshot_every_pages < 0)
    fail("prefix cache: snapshot interval must be >= 0 pages, got {}",
         options_.snapshot_every_pages);
}

PrefixCache::~PrefixCache() {
  clear();
}

void PrefixCache::clear() {
  by_key_.clear();
  lengths_.clear();
  entries_.clear();
  stats_.entries = 0;
  stats_.state_bytes = stats_.host_bytes = stats_.kv_page_refs = 0;
}

PrefixCache::List::iterator PrefixCache::find(std::span<const int32_t> prompt, int64_t length,
                                              uint64_t hash) const {
  auto [lo, hi] = by_key_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const Entry& e = *it->second;
    if (static_cast<int64_t>(e.tokens.size()) == length &&
        std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin()))
      return it->second;
  }
  return entries_.end();
}

int64_t PrefixCache::longest(std::span<const int32_t> prompt, List::iterator* found) const {
  *found = entries_.end();
  const auto n = static_cast<int64_t>(prompt.size());
  if (lengths_.empty() || n < 2) return 0;
  // The hash chain up to the longest usable length, then the entry lengths longest first.
  const int64_t limit = std::min(n - 1, lengths_.front());
  std::vector<uint64_t> hashes(static_cast<size_t>(limit) + 1);
  hashes[0] = kSeed;
  for (int64_t i = 0; i < limit; ++i) hashes[i + 1] = chain(hashes[i], prompt[i]);
  for (int64_t len : lengths_) {
    if (len > limit) continue;
    auto it = find(prompt, len, hashes[len]);
    if (it != entries_.end()) {
      *found = it;
      return len;
    }
  }
  return 0;
}

int64_t PrefixCache::longest(std::span<const int32_t> prompt) const {
  List::iterator it;
  return longest(prompt, &it);
}

int64_t PrefixCache::restore_longest(int slot, std::span<const int32_t> prompt) {
  ++stats_.lookups;
  List::iterator it;
  const int64_t n = longest(prompt, &it);
  if (n == 0) return 0;
  store_.restore(slot, it->snapshot);
  entries_.splice(entries_.begin(), entries_, it);  // most recently used
  ++stats_.hits;
  stats_.hit_tokens += static_cast<uint64_t>(n);
  return n;
}

void PrefixCache::insert(int slot, std::span<const int32_t> tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return;
  if (store_.n_tokens(slot) != n) {
    fail("prefix cache: slot {} holds {} tokens, the entry names {}", slot, store_.n_tokens(slot),
         n);
  }
  const uint64_t key = prefix_key(tokens);
  if (auto it = find(tokens, n, key); it != entries_.end()) {
    entries_.splice(entries_.begin(), entries_, it);
    return;
  }
  entries_.push_front(Entry{
      .tokens = {tokens.begin(), tokens.end()}, .key = key, .snapshot = store_.snapshot(slot)});
  by_key_.emplace(key, entries_.begin());
  if (std::find(lengths_.begin(), lengths_.end(), n) == lengths_.end()) {
    lengths_.insert(std::upper_bound(lengths_.begin(), lengths_.end(), n, std::greater<>()), n);
  }
  ++stats_.inserts;
  stats_.state_bytes += entries_.front().snapshot.state_bytes();
  fit_state_budget();
  count_pages();
}

void PrefixCache::evict(List::iterator it) {
  auto [lo, hi] = by_key_.equal_range(it->key);
  for (auto k = lo; k != hi; ++k) {
    if (k->second == it) {
      by_key_.erase(k);
      break;
    }
  }
  const auto n = static_cast<int64_t>(it->tokens.size());
  (it->snapshot.on_host() ? stats_.host_bytes : stats_.state_bytes) -= it->snapshot.state_bytes();
  entries_.erase(it);
  const bool length_left = std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) {
    return static_cast<int64_t>(e.tokens.size()) == n;
  });
  if (!length_left) lengths_.erase(std::find(lengths_.begin(), lengths_.end(), n));
  ++stats_.evictions;
}

// Backend memory over budget: the least recently used entries move to host memory while that
// has room (making it from the oldest spilled ones), the rest are evicted.
void PrefixCache::fit_state_budget() {
  auto last_where = [&](bool on_host) {
    for (auto it = entries_.end(); it != entries_.begin();) {
      --it;
      if (it->snapshot.on_host() == on_host && it->snapshot.state_bytes() > 0) return it;
    }
    return entries_.end();
  };
  while (stats_.state_bytes > options_.state_bytes) {
    const auto it = last_where(false);
    if (it == entries_.end()) break;
    const int64_t bytes = it->snapshot.state_bytes();
    while (stats_.host_bytes + bytes > options_.host_bytes) {
      const auto victim = last_where(true);
      if (victim == entries_.end()) break;
      evict(victim);
    }
    if (stats_.host_bytes + bytes <= options_.host_bytes) {
      store_.spill(it->snapshot);
      stats_.state_bytes -= bytes;
      stats_.host_bytes += bytes;
      ++stats_.spills;
    } else {
      evict(it);
    }
  }
  stats_.entries = static_cast<int64_t>(entries_.size());
}

bool PrefixCache::make_room(int64_t pages) {
  while (store_.free_pages(state::Track::kTrunk) < pages && !entries_.empty())
    evict(std::prev(entries_.end()));
  count_pages();
  return store_.free_pages(state::Track::kTrunk) >= pages;
}

void PrefixCache::count_pages() {
  int64_t pages = 0;
  for (const Entry& e : entries_) pages += e.snapshot.kv_pages();
  stats_.kv_page_refs = pages;
  stats_.entries = static_cast<int64_t>(entries_.size());
}

}  // namespace qwenrt::gen
