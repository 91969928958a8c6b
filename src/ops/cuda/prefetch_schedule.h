// Which weights to pull into L2 ahead of a decode step's kernels (host side, no CUDA).
//
// A batch-1 decode step reads 2.6 GB of weights (35B-A3B) in hundreds of GEMVs, and between
// them run small kernels (norms, the conv and delta rule, routing) that leave the memory bus idle;
// a GEMV of a few MB spends much of its time ramping up against cold DRAM. So after each launch
// that reads weights, the backend asks L2 for the weights the step reads next, and they arrive
// while the small kernels run.
//
// The order is learned, not declared: every read event (one launch's weights: a matrix, or the
// projections one pass reads) is keyed by its first range's address, and the schedule remembers
// which event followed it. The arch code calls the same ops in the same order every step, so after
// one step each event knows its successor, the last of a step (the LM head) the first of the next.
// A step that reads in another order only costs prefetches that miss; the next step relearns.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace qwenrt::ops::cuda {

class PrefetchSchedule {
 public:
  struct Range {
    const void* p = nullptr;
    int64_t bytes = 0;
  };

  // lead: how many events ahead to prefetch; budget: at most this many bytes after one event (a
  // range cut short there: a GEMV larger than L2 gets its first part).
  PrefetchSchedule(int lead, int64_t budget) : lead_(lead), budget_(budget) {}

  // Records a read event and returns what to prefetch after it: the ranges of the `lead` events
  // that followed it last time, in order, up to the budget. Empty ranges are dropped.
  std::vector<Range> read(std::span<const Range> ranges) {
    std::vector<Range> out;
    if (ranges.empty() || ranges[0].p == nullptr) return out;
    const void* key = ranges[0].p;
    Event& e = events_[key];
    e.ranges.assign(ranges.begin(), ranges.end());
    if (last_ != nullptr && last_ != key) events_[last_].next = key;
    last_ = key;
    int64_t left = budget_;
    const void* at = e.next;
    for (int i = 0; i < lead_ && at != nullptr && at != key && left > 0; ++i) {
      auto it = events_.find(at);
      if (it == events_.end()) break;
      for (const Range& r : it->second.ranges) {
        if (left <= 0) break;
        if (r.p == nullptr || r.bytes <= 0) continue;
        out.push_back({r.p, r.bytes < left ? r.bytes : left});
        left -= out.back().bytes;
      }
      at = it->second.next;
    }
    return out;
  }

  // Forgets the order (weights moved or were freed).
  void clear() {
    events_.clear();
    last_ = nullptr;
  }

 private:
  struct Event {
    std::vector<Range> ranges;
    const void* next = nullptr;
  };
  int lead_;
  int64_t budget_;
  std::unordered_map<const void*, Event> events_;
  const void* last_ = nullptr;
};

}  // namespace qwenrt::ops::cuda
