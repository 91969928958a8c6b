#include "ops/expert_slots.h"

#include "core/error.h"

namespace qwenrt::ops {

ExpertSlots::ExpertSlots(int capacity) {
  if (capacity < 1) fail("expert slots: capacity {} (at least one slot)", capacity);
  slots_.resize(static_cast<size_t>(capacity));
  for (int s = capacity - 1; s >= 0; --s) free_.push_back(s);
}

int ExpertSlots::layer_index(const void* layer) {
  const auto [at, added] = layer_of_.try_emplace(layer, static_cast<int>(layers_.size()));
  if (added) {
    layers_.emplace_back();
    layer_run_.push_back(0);
  }
  return at->second;
}

void ExpertSlots::run(const void* layer, const int32_t* ids, int64_t count, int32_t* slots,
                      uint8_t* miss) {
  ++run_;
  const int li = layer_index(layer);
  layer_run_[li] = run_;
  std::list<int>& held = layers_[li];
  const auto use = [&](int s) {
    slots_[s].run = run_;
    held.splice(held.begin(), held, slots_[s].lru);
  };
  // The run's resident experts first, so that its misses leave them.
  for (int64_t i = 0; i < count; ++i) {
    miss[i] = 0;
    slots[i] = -1;
    if (ids[i] == -1) continue;
    if (auto it = where_.find({layer, ids[i]}); it != where_.end()) {
      slots[i] = it->second;
      use(it->second);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] == -1 || slots[i] >= 0) continue;
    const auto key = std::make_pair(layer, static_cast<int>(ids[i]));
    if (auto it = where_.find(key); it != where_.end()) {  // a repeat of a miss of this run
      slots[i] = it->second;
      continue;
    }
    const int s = victim(li);
    Slot& v = slots_[s];
    if (v.layer >= 0) {
      where_.erase(v.key);
      layers_[v.layer].erase(v.lru);
    }
    v.key = key;
    v.layer = li;
    v.lru = held.insert(held.begin(), s);
    v.run = run_;
    where_[key] = s;
    slots[i] = s;
    miss[i] = 1;
  }
}

int ExpertSlots::oldest(int l) const {
  const std::list<int>& held = layers_[l];
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (slots_[*it].run != run_) return *it;
  }
  return -1;
}

int ExpertSlots::victim(int layer) {
  if (!free_.empty()) {
    const int s = free_.back();
    free_.pop_back();
    return s;
  }
  const size_t share = slots_.size() / layers_.size();
  // A slot of the most recently used layer other than this one among those `which` accepts.
  const auto of_latest_layer = [&](auto which) {
    int best = -1, best_layer = -1;
    for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
      if (l == layer || !which(l) || (best_layer >= 0 && layer_run_[l] <= layer_run_[best_layer]))
        continue;
      if (const int s = oldest(l); s >= 0) best = s, best_layer = l;
    }
    return best;
  };
  int s = -1;
  if (layers_[layer].size() < share)
    s = of_latest_layer([&](int l) { return layers_[l].size() > share; });
  if (s < 0) s = oldest(layer);
  if (s < 0) s = of_latest_layer([](int) { return true; });
  if (s < 0) fail("expert slots: all {} slots hold experts of this run", slots_.size());
  return s;
}

}  // namespace qwenrt::ops
