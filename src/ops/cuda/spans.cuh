// The span of a step that holds a row (qsa.cu, qwen4exp.cu): kernels that walk rows read the
// spans on the device, so a captured step replays with new ones.
#pragma once

#include <cstdint>

#include "ops/types.h"

namespace qwenrt::ops::cuda {

// The index of the span holding row r (spans cover the rows in order; the last one past them).
__device__ __forceinline__ int span_index(const Span* spans, int n_spans, int64_t r) {
  for (int s = 0; s < n_spans; ++s) {
    if (r < int64_t{spans[s].begin} + spans[s].count) return s;
  }
  return n_spans - 1;
}

}  // namespace qwenrt::ops::cuda
