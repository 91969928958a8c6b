// Test support: a prompt fed through Engine::step in chunks, every step's logits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace qwenrt::testing_support {

// Sequence 0: ids[0, n_prefill) as one prefill (logits for every row), then each later id alone.
inline std::vector<float> prefill_then_decode(engine::Engine& e, const std::vector<int32_t>& ids,
                                              int n_prefill) {
  std::vector<float> all;
  engine::Batch b;
  for (int i = 0; i < n_prefill; ++i) b.add(0, ids[i], i, true);
  auto l = e.step(b);
  all.insert(all.end(), l.begin(), l.end());
  for (int i = n_prefill; i < static_cast<int>(ids.size()); ++i) {
    b.clear();
    b.add(0, ids[i], i, true);
    l = e.step(b);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

// Logits of every prompt position of `slot`, the prompt fed in chunks of the given sizes (the
// last chunk runs to the end).
inline std::vector<float> run_prompt(engine::Engine& e, const std::vector<int32_t>& ids,
                                     const std::vector<size_t>& chunks, int slot = 0) {
  std::vector<float> all;
  size_t begin = 0, c = 0;
  while (begin < ids.size()) {
    const size_t count = c < chunks.size() ? chunks[c++] : ids.size() - begin;
    engine::Batch b;
    for (size_t i = begin; i < std::min(ids.size(), begin + count); ++i)
      b.add(slot, ids[i], static_cast<int32_t>(i), true);
    const auto l = e.step(b);
    all.insert(all.end(), l.begin(), l.end());
    begin += count;
  }
  return all;
}

}  // namespace qwenrt::testing_support
