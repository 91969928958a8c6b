// Test support: random inputs and F32 weights over host data for the op tests.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"

namespace qwenrt::testing_support {

// n values from N(0, scale^2).
inline std::vector<float> randn(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// An F32 weight over `data` (which must outlive it), dimensions `ne` (ggml order).
inline Weight f32_weight(const std::vector<float>& data, std::vector<int64_t> ne,
                         const char* name) {
  std::array<int64_t, kMaxDims> dims{1, 1, 1, 1};
  for (size_t i = 0; i < ne.size(); ++i) dims[i] = ne[i];
  return Weight{name,
                TensorView::contiguous(DType::F32, static_cast<int>(ne.size()), dims, data.data())};
}

}  // namespace qwenrt::testing_support
