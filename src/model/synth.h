// Synthetic models: a GGUF with the exact metadata keys and tensor table of a qwen35 / qwen35moe
// checkpoint, filled with seeded random but well-scaled weights (activations stay finite through
// every layer). Used by tests (tiny shapes) and by speed work (full shapes).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/config.h"

namespace qwenrt::model {

struct SynthSpec {
  Config config;                   // arch and every width; n_vocab included
  std::string name = "synthetic";  // general.name
  DType matrix_type = DType::F32;  // projections and embeddings (norms, router, conv stay F32)
  uint64_t seed = 1;
  bool tied_output = false;         // omit output.weight (head falls back to token_embd)
  bool fused_gate_up_exps = false;  // MoE: ffn_gate_up_exps instead of ffn_gate/up_exps
  bool fused_attn_qkv = false;      // attention layers: attn_qkv instead of attn_q/k/v
};

void write_synthetic(const SynthSpec& spec, const std::string& path);

// A tiny config with the real structure (K heads != V heads, GQA, interval 4, MoE top-k > 1 with
// a shared expert), small enough for the reference backend in tests.
Config tiny_config(Arch arch);

}  // namespace qwenrt::model
