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

bool is_routed_expert_tensor(std::string_view name) {
  for (const char* suffix : {".ffn_gate_exps.weight", ".ffn_up_exps.weight",
                             ".ffn_gate_up_exps.weight", ".ffn_down_exps.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

}  // namespace qwenrt
