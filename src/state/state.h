// Sequence state in backend memory (DESIGN.md, "Backends" 2): the KV of attention layers in pools
// of fixed-size pages with a page table and a length per slot, and one recurrent-state block per
// slot per DeltaNet layer. The store does the bookkeeping on the host (which pages a slot holds,
// reference counts); the bytes live in buffers the backend allocated and only it touches.
//
// Two page tracks: the trunk's attention layers share one length and one page table per slot
// (page p of every trunk layer belongs to the same tokens); the MTP block's attention layer has its
// own length (n_mtp_tokens) and table. Pages are shared read-only between slots and snapshots by
// reference count; a write into a shared page copies it first (copy on write), so sharing never
// changes what another holder reads. Recurrent state cannot be truncated: a snapshot copies it, and
// restore copies it back and sets the KV lengths (truncating).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/pipeline.h"
#include "ops/ops.h"

namespace qwenrt::state {

enum class Track { kTrunk = 0, kMtp = 1 };

class StateStore;

// A saved copy of one slot's state: its recurrent state (a backend buffer) and its KV pages (held
// by reference). Move-only; releases what it holds when destroyed. Must not outlive its store.
class Snapshot {
 public:
  Snapshot() = default;
  Snapshot(Snapshot&& other) noexcept;
  Snapshot& operator=(Snapshot&& other) noexcept;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot();

  int64_t n_tokens() const { return length_[0]; }
  // Bytes of recurrent state it holds, and whether they were moved to host memory (spill).
  int64_t state_bytes() const { return state_bytes_; }
  bool on_host() const { return !host_.empty(); }
  // KV pages it holds a reference to on the trunk track.
  int64_t kv_pages() const { return static_cast<int64_t>(pages_[0].size()); }

 private:
  friend class StateStore;
  void release();
  StateStore* store_ = nullptr;
  // Per rank, a backend buffer: every DeltaNet layer's conv then delta block (empty: none).
  std::vector<void*> recurrent_;
  std::vector<std::vector<float>> host_;  // the same floats after spill() (recurrent_ then empty)
  int64_t state_bytes_ = 0;
  int64_t length_[2] = {0, 0};
  std::vector<int32_t> pages_[2];
};

class StateStore {
 public:
  // Pools for n_slots sequences of up to n_ctx tokens (plus spare pages for copy on write).
  // extra_pages: pool pages beyond those, for KV that outlives its sequence (the prefix cache).
  // history_rows: recurrent states kept per slot for speculative checks (RecurrentLayer).
  StateStore(const model::Config& config, int n_slots, int64_t n_ctx, ops::Ops& backend,
             int page_size = 64, int64_t extra_pages = 0, int history_rows = 0);
  // The same for the ranks of a tensor-parallel model (model/shard.h): rank r's layers take the
  // shapes of configs[r] (its heads) in backends[r]'s memory; the page tables, lengths and
  // snapshots are one for all ranks, and every operation applies to every rank. Under pipeline
  // parallelism (model/pipeline.h) rank r holds only the layers of stages[r] (empty: every rank
  // holds every layer).
  StateStore(const std::vector<model::Config>& configs, int n_slots, int64_t n_ctx,
             const std::vector<ops::Ops*>& backends, int page_size = 64, int64_t extra_pages = 0,
             int history_rows = 0, const std::vector<model::Stage>& stages = {});
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  int n_slots() const { return n_slots_; }
  int64_t n_ctx() const { return n_ctx_; }
  int page_size() const { return page_size_; }
  // Tokens a slot holds on a track (the next position).
  int64_t length(int slot, Track track = Track::kTrunk) const;
  int64_t n_tokens(int slot) const { return length(slot, Track::kTrunk); }
  int64_t n_mtp_tokens(int slot) const { return length(slot, Track::kMtp); }

  // Empties a slot: zero recurrent state, no KV pages.
  void reset(int slot);
  // Makes the slot's pages for positions [length, length + count) writable: allocates pages
  // and copies a shared last page. Error when the context or the pool would overflow.
  void reserve(int slot, int64_t count, Track track);
  // Adds count tokens to the slot's length (after a step wrote them).
  void advance(int slot, int64_t count, Track track);
  // Shortens the slot's KV on a track to n_tokens (<= its length), releasing whole pages past
  // it. Recurrent state is not touched: see restore_history.
  void truncate(int slot, int64_t n_tokens, Track track);
  // Copies the slot's recurrent history row `row` (the state after that row of the last
  // keep_states span) into its live state, every DeltaNet layer.
  void restore_history(int slot, int row);
  int history_rows() const { return history_rows_; }

  // Backend memory of layer il: KV pool (attention and MTP layers) or recurrent blocks (DeltaNet).
  // rank: the rank whose share of the layer is asked for (error where it holds none).
  const ops::KvLayer& kv(int il, int rank = 0) const;
  const ops::RecurrentLayer& recurrent(int il, int rank = 0) const;
  int n_ranks() const { return static_cast<int>(ranks_.size()); }
  // Page tables of every slot on a track, [n_slots, page_table_stride()].
  const int32_t* page_tables(Track track) const { return tracks_[int(track)].tables.data(); }
  int64_t page_table_stride() const { return max_pages_; }

  Snapshot snapshot(int slot);
  void restore(int slot, const Snapshot& snapshot);
  // Moves a snapshot's recurrent state to host memory (restore copies it back from there).
  void spill(Snapshot& snapshot);
  // Gives the empty slot `dst` the first n_tokens of `src`'s trunk KV, sharing src's pages (no copy
  // until one of them writes into a shared page). Recurrent state is not shared: restore a
  // snapshot into dst for that.
  void share_kv(int src, int dst, int64_t n_tokens);

  // Pages in use on a track (for tests and metrics), pages free, and the bytes of one page over
  // every layer of the track.
  int64_t pages_in_use(Track track) const;
  // Of those, the pages some slot's table holds (the rest only snapshots hold).
  int64_t pages_held_by_slots(Track track) const;
  int64_t free_pages(Track track) const;
  int64_t page_bytes(Track track) const;
  // Bytes of one slot's recurrent state (a snapshot's state_bytes), over every rank.
  int64_t recurrent_bytes() const;

 private:
  friend class Snapshot;
  struct TrackState {
    std::vector<int> layers;          // state layers whose pools this track's tables index
    std::vector<int32_t> tables;      // [n_slots, max_pages]; -1 = none
    std::vector<int64_t> length;      // per slot
    std::vector<int32_t> refcount;    // per page
    std::vector<int32_t> free_pages;  // a stack
  };
  void check_slot(int slot) const;
  int32_t take_page(TrackState& t);
  void unref(TrackState& t, int32_t page);
  void copy_page(const TrackState& t, int32_t from, int32_t to);
  void release_pages(int slot, Track track);
  // Snapshots' recurrent buffers, a few kept for reuse: a CUDA allocation and free each
  // synchronise the device, and the prefix cache takes and drops snapshots every request.
  void* take_state_buffer(int rank);
  void give_state_buffer(int rank, void* buffer);

  int n_slots_;
  int64_t n_ctx_;
  int page_size_;
  int64_t max_pages_;  // per slot
  int64_t n_pages_;    // per pool
  // The per-slot blocks of one recurrent layer: (buffer, history buffer, floats per slot).
  struct Block {
    float* live;
    float* history;
    int64_t floats;
  };
  struct Blocks {
    std::array<Block, 4> items;
    int n;
    const Block* begin() const { return items.data(); }
    const Block* end() const { return items.data() + n; }
  };
  // One rank's layers in its backend's memory.
  struct Rank {
    ops::Ops* backend;
    int64_t conv_floats = 0, delta_floats = 0;  // per slot per DeltaNet layer
    // Per slot, the PLE layer only (qwen4exp): its token context and its conv inputs.
    int64_t ple_token_floats = 0, ple_conv_floats = 0;
    std::vector<ops::KvLayer> kv;                // per state layer (empty for DeltaNet)
    std::vector<ops::RecurrentLayer> recurrent;  // per state layer (empty for attention)
    std::vector<void*> buffers;                  // every backend buffer this store owns
    std::vector<void*> spare_states;             // at most kSpareStates, state_bytes() each
    Blocks blocks(const ops::RecurrentLayer& r) const;
    // fn(block) for every block of every DeltaNet layer, in layer order (a snapshot's order).
    template <class Fn>
    void each_block(Fn&& fn) const {
      for (const ops::RecurrentLayer& r : recurrent) {
        if (!r.conv) continue;
        for (const Block& b : blocks(r)) fn(b);
      }
    }
    int64_t state_bytes() const;  // one slot's recurrent state
  };
  int history_rows_ = 0;
  std::vector<Rank> ranks_;
  static constexpr size_t kSpareStates = 2;
  TrackState tracks_[2];
};

}  // namespace qwenrt::state
