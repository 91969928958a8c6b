#include "core/tensor.h"

namespace qwenrt {

int64_t TensorView::row_bytes() const {
  const auto& t = traits(dtype);
  return ne[0] / t.block_elems * t.block_bytes;
}

TensorView TensorView::contiguous(DType dtype, int n_dims, std::array<int64_t, kMaxDims> ne,
                                  const void* data) {
  TensorView v;
  v.dtype = dtype;
  v.n_dims = n_dims;
  v.ne = ne;
  v.data = data;
  v.nb[0] = traits(dtype).block_bytes;
  v.nb[1] = v.row_bytes();
  v.nb[2] = v.nb[1] * ne[1];
  v.nb[3] = v.nb[2] * ne[2];
  return v;
}

}  // namespace qwenrt
