// Host code of the streamed MoE block (expert_stream.h): the step's rows split into runs whose
// routed experts fit the device pool together. Plain C++, tested without a GPU
// (tests/test_expert_runs.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"

namespace qwenrt::ops::cuda {

// The number of rows, from row r0 of ids [n_rows, k] (expert ids in [0, n_expert); -1: a row the
// routing sent nowhere, a NaN logit), that run together: as many as come before the distinct
// experts would exceed `capacity`; at least one. Error if a row alone picks more than
// `capacity` distinct experts or an id is out of range.
inline int64_t next_expert_run(const int32_t* ids, int64_t n_rows, int k, int n_expert,
                               int64_t capacity, int64_t r0) {
  std::vector<uint8_t> seen(static_cast<size_t>(n_expert), 0);
  int64_t distinct = 0, r = r0;
  for (; r < n_rows; ++r) {
    int64_t added = 0;
    const int32_t* row = ids + r * k;
    for (int j = 0; j < k; ++j) {
      if (row[j] == -1) continue;
      if (row[j] < 0 || row[j] >= n_expert)
        fail("cuda expert cache: expert id {} of row {} is outside [0, {})", row[j], r, n_expert);
      bool again = seen[static_cast<size_t>(row[j])] != 0;
      for (int i = 0; i < j && !again; ++i) again = row[i] == row[j];
      added += again ? 0 : 1;
    }
    if (distinct + added > capacity) {
      if (r == r0)
        fail("cuda expert cache: row {} picks {} experts, the cache holds {}", r, added, capacity);
      break;
    }
    for (int j = 0; j < k; ++j) {
      if (row[j] >= 0) seen[static_cast<size_t>(row[j])] = 1;
    }
    distinct += added;
  }
  return r - r0;
}

}  // namespace qwenrt::ops::cuda
