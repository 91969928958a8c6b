// Routed experts streamed from the GGUF file into a budgeted cache (issue: experts streamed from
// disk). The trunk stays where it is (mapped, prefaulted); each (layer, expert) of the MoE tensors
// is read with pread into one fixed-size slot on first use and evicted when the budget is full.
// Loader threads (four reads in flight) do the reads, so the MoE op computes the experts already
// resident while the misses load, and a prefetch (the next layer's router on this layer's input)
// can start loads before they are asked for. Read pages are dropped from the page cache
// (POSIX_FADV_DONTNEED) so the budget is the memory the experts take.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ops/types.h"

namespace qwenrt::ops::cpu {

enum class ExpertPolicy { kLru, kLfu };

using ExpertCacheStats = ExpertStats;

class ExpertCache {
 public:
  // Slots of slot_bytes in budget_bytes, reading the files whose mappings hold the experts (an
  // expert view's data lies in one of them). Error when the budget holds fewer than min_slots
  // slots (the experts of one token in one layer) or a file cannot be opened.
  ExpertCache(const std::vector<MappedPart>& files, int64_t budget_bytes, int64_t slot_bytes,
              int min_slots, ExpertPolicy policy = ExpertPolicy::kLru);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  int capacity() const { return static_cast<int>(slots_.size()); }

  // Expert e of w in cache memory, pinned (never evicted) until unpin(slot). On a miss its read is
  // queued; wait(slot) blocks until the bytes are in. Error when every slot is pinned.
  struct Entry {
    TensorView gate, up, gate_up, down;  // gate and up, or gate_up, as w holds them
    int slot;
  };
  Entry pin(const MoeWeights& w, int e);
  void wait(int slot);
  bool ready(int slot) const { return slots_[slot]->ready.load(std::memory_order_acquire); }
  void unpin(int slot);
  // Queues the read of expert e of w if it is not resident (evicting an unpinned slot); no wait.
  void prefetch(const MoeWeights& w, int e);

  ExpertCacheStats stats() const;

 private:
  using Key = std::pair<const void*, int>;  // (the layer's down_exps data, expert)
  struct Read {
    int file;        // index into files_
    int64_t offset;  // in the file
    int64_t bytes;
    int64_t at;  // offset in the slot's memory
  };
  struct Slot {
    uint8_t* mem = nullptr;
    Key key{nullptr, -1};
    int pins = 0;
    bool loading = false;
    bool prefetched = false;  // loaded by prefetch() and not asked for since
    uint64_t last_use = 0, uses = 0;
    std::atomic<bool> ready{false};
    std::vector<Read> parts;  // what to read, a matrix each
  };
  // The slot holding key, or a free / evicted one set up to load it (lock held). -1: all busy.
  int place(const MoeWeights& w, int e, bool* hit);
  void loader();

  struct File {
    MappedPart mapped;
    int fd = -1;
  };
  std::vector<File> files_;
  // The file whose mapping holds [data, data + bytes) (expert e of weight `name`), and the
  // offset there. Error when none does.
  std::pair<int, int64_t> locate(const void* data, int64_t bytes, int e,
                                 const std::string& name) const;
  int64_t slot_bytes_;
  ExpertPolicy policy_;
  uint8_t* arena_ = nullptr;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::map<Key, int> index_;
  uint64_t clock_ = 0;
  mutable std::mutex mu_;
  std::condition_variable loaded_, queued_;
  std::deque<int> queue_;
  bool stop_ = false;
  std::string error_;  // a failed read, reported by wait()
  std::atomic<bool> failed_{false};
  ExpertCacheStats stats_;
  std::vector<std::thread> readers_;
};

// Bytes of one slot: the largest expert (gate + up + down, or gate_up + down) of `layers`.
int64_t expert_slot_bytes(const MoeWeights& w);

}  // namespace qwenrt::ops::cpu
