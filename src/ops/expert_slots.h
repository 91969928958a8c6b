// Which slot of an expert pool holds which (layer, expert), and which slot a miss overwrites
// (the cuda backend's device pool, ops/cuda/expert_stream.h; host only, tested without a GPU).
//
// Replacement, never a slot the current run holds (a run's resident experts are marked first, so
// its misses cannot take them): a free slot; else, for a layer holding less than its share of the
// pool (capacity / layers seen), a slot of the most recently used layer among those holding more
// than their share; else its own least recently used slot; else one of the most recently used
// other layer. Within a layer the least recently used slot goes. A layer's next use is furthest
// away right after it ran (the layers come round in order), which is why slots are taken from the
// most recently used layer: plain LRU over the pool reads every expert again in each prefill once
// the pool is smaller than the experts (the least recently used slot is always one the next layer
// is about to ask for), and so does taking from the least recently used layer.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <utility>
#include <vector>

namespace qwenrt::ops {

class ExpertSlots {
 public:
  explicit ExpertSlots(int capacity);

  // The slots of a run of experts ids[0, count) of `layer` (any pointer naming the layer): slots[i]
  // holds expert ids[i] until the next run; miss[i]: the slot was given to it (its old expert
  // dropped) and the caller loads it. Id -1 (routed nowhere) gets slot -1. Error when the run's
  // distinct experts do not fit.
  void run(const void* layer, const int32_t* ids, int64_t count, int32_t* slots, uint8_t* miss);

  int capacity() const { return static_cast<int>(slots_.size()); }

 private:
  struct Slot {
    std::pair<const void*, int> key{nullptr, -1};
    int layer = -1;    // index into layers_ (-1: free)
    uint64_t run = 0;  // the run that last asked for it
    std::list<int>::iterator lru;
  };
  int layer_index(const void* layer);
  int victim(int layer);
  // The least recently used slot of layer l not held by this run (-1: none).
  int oldest(int l) const;

  std::vector<Slot> slots_;
  std::vector<int> free_;                // slots holding no expert yet
  std::map<const void*, int> layer_of_;  // layer -> its index in layers_
  std::vector<std::list<int>> layers_;   // each layer's held slots; front: most recently used
  std::vector<uint64_t> layer_run_;      // the run that last asked for each layer
  std::map<std::pair<const void*, int>, int> where_;
  uint64_t run_ = 0;
};

}  // namespace qwenrt::ops
