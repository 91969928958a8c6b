#include "state/state.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace qwenrt::state {

Snapshot::Snapshot(Snapshot&& other) noexcept {
  *this = std::move(other);
}

Snapshot& Snapshot::operator=(Snapshot&& other) noexcept {
  if (this != &other) {
    release();
    store_ = std::exchange(other.store_, nullptr);
    recurrent_ = std::move(other.recurrent_);
    other.recurrent_.clear();
    host_ = std::move(other.host_);
    other.host_.clear();
    state_bytes_ = std::exchange(other.state_bytes_, 0);
    for (int t = 0; t < 2; ++t) {
      length_[t] = other.length_[t];
      pages_[t] = std::move(other.pages_[t]);
      other.pages_[t].clear();
    }
  }
  return *this;
}

Snapshot::~Snapshot() {
  release();
}

void Snapshot::release() {
  if (!store_) return;
  for (int t = 0; t < 2; ++t) {
    for (int32_t p : pages_[t]) store_->unref(store_->tracks_[t], p);
    pages_[t].clear();
  }
  for (size_t r = 0; r < recurrent_.size(); ++r)
    store_->give_state_buffer(static_cast<int>(r), recurrent_[r]);
  recurrent_.clear();
  host_.clear();
  host_.shrink_to_fit();
  state_bytes_ = 0;
  store_ = nullptr;
}

StateStore::StateStore(const model::Config& config, int n_slots, int64_t n_ctx, ops::Ops& backend,
                       int page_size, int64_t extra_pages, int history_rows)
    : StateStore(std::vector<model::Config>{config}, n_slots, n_ctx,
                 std::vector<ops::Ops*>{&backend}, page_size, extra_pages, history_rows) {}

StateStore::StateStore(const std::vector<model::Config>& configs, int n_slots, int64_t n_ctx,
                       const std::vector<ops::Ops*>& backends, int page_size, int64_t extra_pages,
                       int history_rows, const std::vector<model::Stage>& stages)
    : n_slots_(n_slots), n_ctx_(n_ctx), page_size_(page_size), history_rows_(history_rows) {
  if (configs.empty() || configs.size() != backends.size())
    fail("state: {} configs for {} backends", configs.size(), backends.size());
  if (!stages.empty() && stages.size() != configs.size())
    fail("state: {} pipeline stages for {} ranks", stages.size(), configs.size());
  if (history_rows < 0) fail("state: history rows must be >= 0, got {}", history_rows);
  if (n_slots < 1) fail("state: need at least one sequence slot, got {}", n_slots);
  if (n_ctx < 1) fail("state: context size must be positive, got {}", n_ctx);
  if (page_size < 1) fail("state: page size must be positive, got {}", page_size);
  max_pages_ = (n_ctx + page_size - 1) / page_size;
  // Every slot full, plus room for each slot's copied last page while snapshots hold the old one.
  if (extra_pages < 0) fail("state: extra pages must be >= 0, got {}", extra_pages);
  n_pages_ = n_slots * max_pages_ + 2 * int64_t{n_slots} + 2 + extra_pages;
  if (n_pages_ > INT32_MAX) fail("state: {} KV pages do not fit 32-bit page ids", n_pages_);
  ranks_.resize(configs.size());
  std::vector<bool> on_track(configs[0].n_layer + configs[0].n_layer_nextn, false);
  for (size_t ri = 0; ri < configs.size(); ++ri) {
    const model::Config& config = configs[ri];
    Rank& rank = ranks_[ri];
    rank.backend = backends[ri];
    const int n_state_layers = config.n_layer + config.n_layer_nextn;
    rank.kv.resize(n_state_layers);
    rank.recurrent.resize(n_state_layers);
    rank.conv_floats = int64_t{config.conv_kernel - 1} * config.conv_channels();
    rank.delta_floats = int64_t{config.ssm_v_heads} * config.ssm_head_dim * config.ssm_head_dim;
    const int64_t kv_dim = int64_t{config.n_head_kv} * config.head_dim;
    if (config.is_qwen4exp() && config.q4.ple_layer >= 0) {
      rank.ple_token_floats = config.q4.ple_ngram - 1;
      rank.ple_conv_floats =
          int64_t{config.q4.ple_conv_history()} * config.q4.hc_count * config.n_embd;
    }
    auto buffer = [&](int64_t floats) {
      rank.buffers.push_back(rank.backend->alloc_buffer(floats * int64_t{sizeof(float)}));
      return static_cast<float*>(rank.buffers.back());
    };
    for (int il = 0; il < n_state_layers; ++il) {
      if (!stages.empty() && !stages[ri].holds(il, config.n_layer)) continue;
      if (il >= config.n_layer || config.is_attention_layer(il)) {
        const int64_t floats = n_pages_ * page_size * kv_dim;
        rank.kv[il] = {
            .k = buffer(floats), .v = buffer(floats), .page_size = page_size, .kv_dim = kv_dim};
        if (il < config.n_layer && config.is_qsa_layer(il)) {
          rank.kv[il].idx_dim = config.q4.indexer_head_dim;
          rank.kv[il].idx = buffer(n_pages_ * page_size * rank.kv[il].idx_dim);
        }
        if (!on_track[il]) tracks_[il >= config.n_layer ? 1 : 0].layers.push_back(il);
        on_track[il] = true;
      } else {
        ops::RecurrentLayer& r = rank.recurrent[il];
        r = {.conv = buffer(n_slots * rank.conv_floats),
             .delta = buffer(n_slots * rank.delta_floats)};
        if (history_rows > 0) {
          r.conv_history = buffer(int64_t{n_slots} * history_rows * rank.conv_floats);
          r.delta_history = buffer(int64_t{n_slots} * history_rows * rank.delta_floats);
          r.history_rows = history_rows;
        }
        if (config.is_qwen4exp() && il == config.q4.ple_layer) {
          r.ple_tokens = buffer(n_slots * rank.ple_token_floats);
          r.ple_conv = buffer(n_slots * rank.ple_conv_floats);
          if (history_rows > 0) {
            r.ple_tokens_history = buffer(int64_t{n_slots} * history_rows * rank.ple_token_floats);
            r.ple_conv_history = buffer(int64_t{n_slots} * history_rows * rank.ple_conv_floats);
          }
        }
      }
    }
  }
  for (TrackState& t : tracks_) {
    t.tables.assign(n_slots * max_pages_, -1);
    t.length.assign(n_slots, 0);
    t.refcount.assign(n_pages_, 0);
    t.free_pages.resize(n_pages_);
    // A stack popping page 0 first.
    for (int64_t p = 0; p < n_pages_; ++p) t.free_pages[p] = static_cast<int32_t>(n_pages_ - 1 - p);
  }
}

StateStore::~StateStore() {
  for (Rank& r : ranks_) {
    for (void* b : r.spare_states) r.backend->free_buffer(b);
    for (void* b : r.buffers) r.backend->free_buffer(b);
  }
}

void* StateStore::take_state_buffer(int rank) {
  Rank& r = ranks_[rank];
  if (r.spare_states.empty()) return r.backend->alloc_buffer(r.state_bytes());
  void* b = r.spare_states.back();
  r.spare_states.pop_back();
  return b;  // not zeroed: snapshot() overwrites all of it
}

void StateStore::give_state_buffer(int rank, void* buffer) {
  Rank& r = ranks_[rank];
  if (r.spare_states.size() < kSpareStates) {
    r.spare_states.push_back(buffer);
  } else {
    r.backend->free_buffer(buffer);
  }
}

void StateStore::check_slot(int slot) const {
  if (slot < 0 || slot >= n_slots_) fail("state: slot {} out of range [0, {})", slot, n_slots_);
}

int64_t StateStore::length(int slot, Track track) const {
  check_slot(slot);
  return tracks_[int(track)].length[slot];
}

const ops::KvLayer& StateStore::kv(int il, int rank) const {
  const ops::KvLayer& kv = ranks_.at(rank).kv.at(il);
  if (!kv.k) fail("state: layer {} has no KV pool", il);
  return kv;
}

const ops::RecurrentLayer& StateStore::recurrent(int il, int rank) const {
  const ops::RecurrentLayer& r = ranks_.at(rank).recurrent.at(il);
  if (!r.conv) fail("state: layer {} has no recurrent state", il);
  return r;
}

int32_t StateStore::take_page(TrackState& t) {
  if (t.free_pages.empty()) fail("state: the KV page pool ({} pages) is exhausted", n_pages_);
  const int32_t p = t.free_pages.back();
  t.free_pages.pop_back();
  t.refcount[p] = 1;
  return p;
}

void StateStore::unref(TrackState& t, int32_t page) {
  if (--t.refcount[page] == 0) t.free_pages.push_back(page);
}

void StateStore::copy_page(const TrackState& t, int32_t from, int32_t to) {
  for (const Rank& rank : ranks_) {
    for (int il : t.layers) {
      const ops::KvLayer& kv = rank.kv[il];
      if (!kv.k) continue;  // on another pipeline stage
      const int64_t floats = int64_t{page_size_} * kv.kv_dim, bytes = floats * 4;
      rank.backend->copy(kv.k + to * floats, kv.k + from * floats, bytes);
      rank.backend->copy(kv.v + to * floats, kv.v + from * floats, bytes);
      if (kv.idx) {
        const int64_t idx = int64_t{page_size_} * kv.idx_dim;
        rank.backend->copy(kv.idx + to * idx, kv.idx + from * idx, idx * int64_t{sizeof(float)});
      }
    }
  }
}

StateStore::Blocks StateStore::Rank::blocks(const ops::RecurrentLayer& r) const {
  Blocks b{.items = {Block{r.conv, r.conv_history, conv_floats},
                     Block{r.delta, r.delta_history, delta_floats},
                     Block{r.ple_tokens, r.ple_tokens_history, ple_token_floats},
                     Block{r.ple_conv, r.ple_conv_history, ple_conv_floats}},
           .n = r.ple_tokens ? 4 : 2};
  return b;
}

int64_t StateStore::Rank::state_bytes() const {
  int64_t floats = 0;
  each_block([&](const Block& b) { floats += b.floats; });
  return floats * int64_t{sizeof(float)};
}

void StateStore::release_pages(int slot, Track track) {
  TrackState& t = tracks_[int(track)];
  int32_t* table = t.tables.data() + slot * max_pages_;
  for (int64_t i = 0; i < max_pages_ && table[i] >= 0; ++i) {
    unref(t, table[i]);
    table[i] = -1;
  }
  t.length[slot] = 0;
}

void StateStore::reset(int slot) {
  check_slot(slot);
  release_pages(slot, Track::kTrunk);
  release_pages(slot, Track::kMtp);
  for (const Rank& rank : ranks_) {
    rank.each_block([&](const Block& b) {
      rank.backend->fill_zero(b.live + slot * b.floats, b.floats * int64_t{sizeof(float)});
    });
  }
}

void StateStore::reserve(int slot, int64_t count, Track track) {
  check_slot(slot);
  TrackState& t = tracks_[int(track)];
  const int64_t begin = t.length[slot], end = begin + count;
  if (end > n_ctx_)
    fail("state: slot {} would hold {} tokens, the context is {}", slot, end, n_ctx_);
  if (count <= 0 || t.layers.empty()) return;
  int32_t* table = t.tables.data() + slot * max_pages_;
  for (int64_t i = begin / page_size_; i <= (end - 1) / page_size_; ++i) {
    if (table[i] < 0) {
      table[i] = take_page(t);
    } else if (t.refcount[table[i]] > 1) {  // shared: copy before writing
      const int32_t fresh = take_page(t);
      copy_page(t, table[i], fresh);
      unref(t, table[i]);
      table[i] = fresh;
    }
  }
}

void StateStore::advance(int slot, int64_t count, Track track) {
  check_slot(slot);
  tracks_[int(track)].length[slot] += count;
}

void StateStore::truncate(int slot, int64_t n_tokens, Track track) {
  check_slot(slot);
  TrackState& t = tracks_[int(track)];
  if (n_tokens < 0 || n_tokens > t.length[slot]) {
    fail("state: slot {} holds {} tokens, cannot truncate to {}", slot, t.length[slot], n_tokens);
  }
  int32_t* table = t.tables.data() + slot * max_pages_;
  for (int64_t i = (n_tokens + page_size_ - 1) / page_size_; i < max_pages_ && table[i] >= 0; ++i) {
    unref(t, table[i]);
    table[i] = -1;
  }
  t.length[slot] = n_tokens;
}

void StateStore::restore_history(int slot, int row) {
  check_slot(slot);
  if (row < 0 || row >= history_rows_) {
    fail("state: history row {} out of range [0, {})", row, history_rows_);
  }
  const int64_t h = int64_t{slot} * history_rows_ + row;
  for (const Rank& rank : ranks_) {
    rank.each_block([&](const Block& b) {
      rank.backend->copy(b.live + slot * b.floats, b.history + h * b.floats,
                         b.floats * int64_t{sizeof(float)});
    });
  }
}

int64_t StateStore::recurrent_bytes() const {
  int64_t bytes = 0;
  for (const Rank& rank : ranks_) bytes += rank.state_bytes();
  return bytes;
}

Snapshot StateStore::snapshot(int slot) {
  check_slot(slot);
  Snapshot s;
  s.store_ = this;
  if (const int64_t bytes = recurrent_bytes(); bytes > 0) {
    s.state_bytes_ = bytes;
    for (size_t ri = 0; ri < ranks_.size(); ++ri) {
      const Rank& rank = ranks_[ri];
      s.recurrent_.push_back(take_state_buffer(static_cast<int>(ri)));
      auto* dst = static_cast<float*>(s.recurrent_.back());
      rank.each_block([&](const Block& b) {
        rank.backend->copy(dst, b.live + slot * b.floats, b.floats * int64_t{sizeof(float)});
        dst += b.floats;
      });
    }
  }
  for (int ti = 0; ti < 2; ++ti) {
    TrackState& t = tracks_[ti];
    s.length_[ti] = t.length[slot];
    const int32_t* table = t.tables.data() + slot * max_pages_;
    for (int64_t i = 0; i < max_pages_ && table[i] >= 0; ++i) {
      ++t.refcount[table[i]];
      s.pages_[ti].push_back(table[i]);
    }
  }
  return s;
}

void StateStore::restore(int slot, const Snapshot& s) {
  check_slot(slot);
  if (s.store_ != this) fail("state: the snapshot belongs to another state store");
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    const Rank& rank = ranks_[ri];
    if (!s.recurrent_.empty()) {
      const auto* src = static_cast<const float*>(s.recurrent_[ri]);
      rank.each_block([&](const Block& b) {
        rank.backend->copy(b.live + slot * b.floats, src, b.floats * int64_t{sizeof(float)});
        src += b.floats;
      });
    } else if (s.on_host()) {
      const float* src = s.host_[ri].data();
      rank.each_block([&](const Block& b) {
        rank.backend->upload(src, b.live + slot * b.floats, b.floats);
        src += b.floats;
      });
    }
  }
  for (int ti = 0; ti < 2; ++ti) {
    release_pages(slot, Track(ti));
    TrackState& t = tracks_[ti];
    int32_t* table = t.tables.data() + slot * max_pages_;
    for (size_t i = 0; i < s.pages_[ti].size(); ++i) {
      table[i] = s.pages_[ti][i];
      ++t.refcount[table[i]];
    }
    t.length[slot] = s.length_[ti];
  }
}

void StateStore::share_kv(int src, int dst, int64_t n_tokens) {
  check_slot(src);
  check_slot(dst);
  TrackState& t = tracks_[0];
  if (src == dst) fail("state: cannot share a slot's KV with itself");
  if (t.length[dst] != 0) fail("state: slot {} must be empty to receive shared KV", dst);
  if (n_tokens < 0 || n_tokens > t.length[src]) {
    fail("state: slot {} holds {} tokens, cannot share {}", src, t.length[src], n_tokens);
  }
  const int32_t* from = t.tables.data() + src * max_pages_;
  int32_t* to = t.tables.data() + dst * max_pages_;
  for (int64_t i = 0; i < (n_tokens + page_size_ - 1) / page_size_; ++i) {
    to[i] = from[i];
    ++t.refcount[to[i]];
  }
  t.length[dst] = n_tokens;
}

void StateStore::spill(Snapshot& s) {
  if (s.store_ != this) fail("state: the snapshot belongs to another state store");
  if (s.recurrent_.empty()) return;
  s.host_.resize(ranks_.size());
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    std::vector<float>& host = s.host_[ri];
    host.resize(static_cast<size_t>(ranks_[ri].state_bytes() / int64_t{sizeof(float)}));
    ranks_[ri].backend->download(static_cast<const float*>(s.recurrent_[ri]), host.data(),
                                 static_cast<int64_t>(host.size()));
    give_state_buffer(static_cast<int>(ri), s.recurrent_[ri]);
  }
  s.recurrent_.clear();
}

int64_t StateStore::pages_held_by_slots(Track track) const {
  const TrackState& t = tracks_[int(track)];
  std::vector<uint8_t> held(static_cast<size_t>(n_pages_), 0);
  int64_t n = 0;
  for (int32_t p : t.tables) {
    if (p >= 0 && !held[p]) {
      held[p] = 1;
      ++n;
    }
  }
  return n;
}

int64_t StateStore::free_pages(Track track) const {
  return static_cast<int64_t>(tracks_[int(track)].free_pages.size());
}

int64_t StateStore::page_bytes(Track track) const {
  int64_t bytes = 0;
  for (const Rank& rank : ranks_) {
    for (int il : tracks_[int(track)].layers)
      bytes += (2 * rank.kv[il].kv_dim + rank.kv[il].idx_dim) * page_size_ * int64_t{sizeof(float)};
  }
  return bytes;
}

int64_t StateStore::pages_in_use(Track track) const {
  const TrackState& t = tracks_[int(track)];
  return n_pages_ - static_cast<int64_t>(t.free_pages.size());
}

}  // namespace qwenrt::state
