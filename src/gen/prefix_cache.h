// The prefix cache: state kept after its sequence ended, so that a prompt that starts with tokens
// seen before resumes from there and prefills only the rest.
//
// On these hybrid models a prefix is usable only where its recurrent (DeltaNet) state was saved:
// KV can be cut at any length, recurrent state cannot. An entry is therefore a state::Snapshot
// at an exact position: the recurrent state there (a copy) and the KV pages of the tokens before
// it (by reference: the slot that made it, the entries taken from it and the slots restored from
// them share one copy of each page read-only; a write into a shared page copies it first).
// Entries are keyed by the hash chain of their token ids (the engine is one model with one KV
// dtype, so tokens are the whole key) and checked token by token on a hit.
//
// Budgets: KV pages live in the engine's pool (EngineOptions::cache_kv_bytes adds room for them);
// when a step needs pages the pool lacks, make_room evicts least recently used entries. Recurrent
// state is held in backend memory up to state_bytes, then moved to host memory up to host_bytes,
// then evicted.
//
// Single-threaded: the scheduler's thread owns it. stats() is a copy for others.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "state/state.h"

namespace qwenrt::gen {

struct PrefixCacheOptions {
  int64_t state_bytes = int64_t{2} << 30;  // snapshots' recurrent state in backend memory
  int64_t host_bytes = int64_t{4} << 30;   // spilled to host memory
  // Snapshots inside long prompts every this many KV pages (0: none).
  int snapshot_every_pages = 16;
};

struct PrefixCacheStats {
  uint64_t lookups = 0, hits = 0;  // hits: lookups that resumed from an entry
  uint64_t hit_tokens = 0;         // prompt tokens not prefilled thanks to hits
  uint64_t inserts = 0, evictions = 0, spills = 0;
  int64_t entries = 0;
  int64_t state_bytes = 0, host_bytes = 0;  // recurrent state held, in backend / host memory
  int64_t kv_page_refs = 0;  // page references entries hold (a page shared by two counts twice)
};

class PrefixCache {
 public:
  PrefixCache(state::StateStore& store, PrefixCacheOptions options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest cached prefix of `prompt` that is shorter than it (one token at least is left to
  // prefill, for the logits it gives): restored into `slot`, its length returned. 0: no entry,
  // the slot is left as it was.
  int64_t restore_longest(int slot, std::span<const int32_t> prompt);
  // The length restore_longest would give now, without restoring.
  int64_t longest(std::span<const int32_t> prompt) const;
  // Saves what `slot` holds, whose tokens are `tokens` (the slot's length), as an entry; an entry
  // of these tokens already there is only marked used.
  void insert(int slot, std::span<const int32_t> tokens);
  // Evicts least recently used entries until the trunk pool has `pages` free pages or no entry is
  // left; returns whether there are that many.
  bool make_room(int64_t pages);
  void clear();

  PrefixCacheStats stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    uint64_t key = 0;
    state::Snapshot snapshot;
  };
  using List = std::list<Entry>;  // most recently used first

  // Entry of exactly prompt[0, length), or end().
  List::iterator find(std::span<const int32_t> prompt, int64_t length, uint64_t hash) const;
  int64_t longest(std::span<const int32_t> prompt, List::iterator* found) const;
  void evict(List::iterator it);
  void fit_state_budget();
  void count_pages();

  state::StateStore& store_;
  PrefixCacheOptions options_;
  mutable List entries_;
  std::unordered_multimap<uint64_t, List::iterator> by_key_;
  std::vector<int64_t> lengths_;  // distinct entry lengths, longest first
  PrefixCacheStats stats_;
};

// The hash chain of token ids tokens[0, n): an entry's key.
uint64_t prefix_key(std::span<const int32_t> tokens);

}  // namespace qwenrt::gen
