#include "model/checkpoints.h"

namespace qwenrt::model {
namespace {

// What every checkpoint of the family shares (SPEC.md): 256-dim attention heads with 64 rotary
// dims in IMROPE sections [11, 11, 10, 0], theta 1e7, eps 1e-6, DeltaNet heads of 128 with a
// 4-tap conv, one attention layer in four, 248320 vocabulary rows.
Config family_base(Arch arch) {
  Config c;
  c.arch = arch;
  c.arch_name = arch == Arch::kQwen35 ? "qwen35" : "qwen35moe";
  c.n_ctx_train = 262144;
  c.n_vocab = 248320;
  c.rms_eps = 1e-6f;
  c.head_dim = 256;
  c.n_rot = 64;
  c.rope_theta = 1e7f;
  c.rope_sections = {11, 11, 10, 0};
  c.full_attention_interval = 4;
  c.conv_kernel = 4;
  c.ssm_head_dim = 128;
  return c;
}

Config dense_27b() {
  Config c = family_base(Arch::kQwen35);
  c.n_layer = 64;
  c.n_embd = 5120;
  c.n_head = 24;
  c.n_head_kv = 4;
  c.ssm_k_heads = 16;
  c.ssm_v_heads = 48;
  c.ssm_inner = 48 * 128;
  c.n_ff = 17408;
  return c;
}

Config moe_35b_a3b() {
  Config c = family_base(Arch::kQwen35Moe);
  c.n_layer = 40;
  c.n_embd = 2048;
  c.n_head = 16;
  c.n_head_kv = 2;
  c.ssm_k_heads = 16;
  c.ssm_v_heads = 32;
  c.ssm_inner = 32 * 128;
  c.n_expert = 256;
  c.n_expert_used = 8;
  c.n_ff_exp = 512;
  c.n_ff_shexp = 512;
  return c;
}

}  // namespace

const std::vector<CheckpointShape>& checkpoint_shapes() {
  // Qwen3.8-27B runs the 27B graph unchanged; only general.name tells them apart.
  static const std::vector<CheckpointShape> shapes = {
      {Checkpoint::kQwen36_27B, checkpoint_name(Checkpoint::kQwen36_27B), "27B", dense_27b()},
      {Checkpoint::kQwen36_35B_A3B, checkpoint_name(Checkpoint::kQwen36_35B_A3B), "35B-A3B",
       moe_35b_a3b()},
      {Checkpoint::kQwen38_27B, checkpoint_name(Checkpoint::kQwen38_27B), "27B", dense_27b()},
  };
  return shapes;
}

std::optional<CheckpointShape> checkpoint_shape(std::string_view name) {
  for (const auto& shape : checkpoint_shapes()) {
    if (shape.name == name) return shape;
  }
  return std::nullopt;
}

}  // namespace qwenrt::model
