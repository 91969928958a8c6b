#include "core/weight.h"

#include <fmt/format.h>

namespace qwenrt {

TensorView Weight::expert_view(int64_t e) const {
  TensorView v = view;
  v.n_dims = 2;
  v.ne[2] = 1;
  v.data = static_cast<const uint8_t*>(view.data) + e * view.nb[2];
  return v;
}

Weight Weight::expert(int64_t e) const {
  return {fmt::format("{}[expert {}]", name, e), expert_view(e)};
}

}  // namespace qwenrt
