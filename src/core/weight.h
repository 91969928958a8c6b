// One weight tensor as the backends see it: its GGUF name (for error messages) and a view of its
// bytes in ggml order ([in, out]: ne[0] = in is contiguous). Model binding makes these; backends
// place them (ops/ never includes model/).
#pragma once

#include <string>
#include <string_view>

#include "core/tensor.h"

namespace qwenrt {

struct Weight {
  std::string name;
  TensorView view;

  bool present() const { return view.data != nullptr; }
  // The 2D slice for one expert of a 3D expert tensor [in, out, n_expert].
  Weight expert(int64_t e) const;
  // Its view alone (no name, no allocation): what kernels index experts with.
  TensorView expert_view(int64_t e) const;
};

// Whether a GGUF tensor name is a routed-expert tensor (blk.N.ffn_{gate,up,gate_up,down}_exps).
bool is_routed_expert_tensor(std::string_view name);

}  // namespace qwenrt
