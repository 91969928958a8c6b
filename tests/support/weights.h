// Random quantised weight tensors for kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/weight.h"
#include "ops/cpu/repack.h"
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

// A copy of a row-layout view in the cpu backend's panel layout (ops/cpu/repack.h), owning its
// 64-byte aligned bytes.
struct PanelCopy {
  std::vector<uint8_t> bytes;
  TensorView view;
};
inline PanelCopy panel_copy(const TensorView& w) {
  PanelCopy p;
  p.bytes.resize(static_cast<size_t>(w.nb[2] * w.ne[2]) + 64);
  auto* at = p.bytes.data() + (64 - reinterpret_cast<uintptr_t>(p.bytes.data()) % 64) % 64;
  p.view = ops::cpu::repack_panels(w, at);
  return p;
}

}  // namespace qwenrt::testing_support
