// Random quantised weight tensors for kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/weight.h"
#include "quant/quant.h"

namespace qwenrt::testing_support {

// A tensor [in, out, n_mat] of Gaussian weights (std `scale`) quantised to `type`, owning its
// bytes.
struct QuantTensor {
  std::vector<uint8_t> bytes;
  Weight w;
};
inline QuantTensor quantized_tensor(const char* name, DType type, int64_t in, int64_t out,
                                    int64_t n_mat, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(in * out * n_mat);
  for (auto& f : v) f = normal(rng);
  const auto& tr = traits(type);
  QuantTensor t;
  t.bytes.resize(v.size() / tr.block_elems * tr.block_bytes);
  quant::quantize(type, v.data(), t.bytes.data(), static_cast<int64_t>(v.size()));
  const int n_dims = n_mat > 1 ? 3 : (out > 1 ? 2 : 1);
  t.w = Weight{name, TensorView::contiguous(type, n_dims, {in, out, n_mat, 1}, t.bytes.data())};
  return t;
}

}  // namespace qwenrt::testing_support
