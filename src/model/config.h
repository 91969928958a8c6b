// Model hyperparameters, parsed once from GGUF metadata and validated.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "gguf/reader.h"

namespace qwenrt::model {

enum class Arch { kQwen35, kQwen35Moe };

struct Config {
  Arch arch = Arch::kQwen35;
  std::string arch_name;  // general.architecture: "qwen35" or "qwen35moe"

  int n_layer = 0;          // trunk layers (block_count minus the MTP blocks stored after them)
  int n_layer_nextn = 0;    // nextn_predict_layers: MTP blocks, stored as blk.{n_layer}...
  int64_t n_ctx_train = 0;  // context_length
  int n_embd = 0;           // embedding_length
  int n_vocab = 0;          // rows of token_embd
  float rms_eps = 1e-6f;    // attention.layer_norm_rms_epsilon (every RMSNorm and the l2norm)

  // Full attention layers.
  int n_head = 0;        // attention.head_count (query heads)
  int n_head_kv = 0;     // attention.head_count_kv
  int head_dim = 0;      // attention.key_length (== value_length)
  int n_rot = 0;         // rope.dimension_count: leading dims of each head that rotate
  float rope_theta = 0;  // rope.freq_base
  std::array<int, 4> rope_sections{};  // rope.dimension_sections (validated, NeoX computed)
  int full_attention_interval = 4;     // layer i is attention iff (i + 1) % interval == 0

  // Gated DeltaNet layers.
  int conv_kernel = 0;   // ssm.conv_kernel
  int ssm_head_dim = 0;  // ssm.state_size: DeltaNet head dim D (keys and values)
  int ssm_k_heads = 0;   // ssm.group_count: K heads (Hk)
  int ssm_v_heads = 0;   // ssm.time_step_rank: V heads (Hv), a multiple of Hk
  int ssm_inner = 0;     // ssm.inner_size: Hv * D

  // FFN.
  int n_ff = 0;           // feed_forward_length (dense only)
  int n_expert = 0;       // expert_count (MoE only)
  int n_expert_used = 0;  // expert_used_count: top-k
  int n_ff_exp = 0;       // expert_feed_forward_length
  int n_ff_shexp = 0;     // expert_shared_feed_forward_length

  bool is_moe() const { return arch == Arch::kQwen35Moe; }
  bool is_attention_layer(int il) const { return (il + 1) % full_attention_interval == 0; }
  int conv_channels() const { return 2 * ssm_k_heads * ssm_head_dim + ssm_v_heads * ssm_head_dim; }
  int n_attention_layers() const { return n_layer / full_attention_interval; }

  // Reads and validates; Error names the file, the key and expected vs actual values.
  static Config from_gguf(const gguf::File& file);
};

}  // namespace qwenrt::model
