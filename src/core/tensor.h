// A non-owning view of a tensor's bytes: type, shape (ggml order: ne[0] is the contiguous
// dimension), and byte strides.
#pragma once

#include <array>
#include <cstdint>

#include "core/dtype.h"

namespace qwenrt {

constexpr int kMaxDims = 4;

// How a view's blocks lie in memory. kRows: as GGUF stores them (row r at data + r * nb[1]).
// kPanels16: the cpu backend's placed form (ops/cpu/repack.h): groups of 16 rows whose blocks are
// interleaved, the same bytes in another order; only ops/cpu reads it.
enum class Layout : uint8_t { kRows, kPanels16 };

struct TensorView {
  DType dtype = DType::F32;
  int n_dims = 0;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // elements per dimension; unused dims are 1
  std::array<int64_t, kMaxDims> nb{0, 0, 0, 0};  // byte stride per dimension (nb[0] = block bytes)
  const void* data = nullptr;
  Layout layout = Layout::kRows;

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  // Bytes of one row of ne[0] elements (ne[0] is a multiple of the block size).
  int64_t row_bytes() const;
  const uint8_t* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<const uint8_t*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }

  // A contiguous view; the caller vouches that ne[0] is a multiple of the block size.
  static TensorView contiguous(DType dtype, int n_dims, std::array<int64_t, kMaxDims> ne,
                               const void* data);
};

}  // namespace qwenrt
