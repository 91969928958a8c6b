// Test support: a prefill then one-token decode steps on one sequence, every step's logits.
#pragma once

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

}  // namespace qwenrt::testing_support
