// Model hyperparameters, parsed once from GGUF metadata and validated.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/reader.h"

namespace qwenrt::model {

enum class Arch { kQwen35, kQwen35Moe, kQwen4Exp };

// Qwen3.8-Flash-Next (qwen4exp) only: hyper-connections, Qwen Sparse Attention (QSA) and the
// Per-Layer Embedding (PLE). Zero / empty for the other architectures.
struct Qwen4ExpConfig {
  int hc_count = 0;    // hyper_connection.count: residual streams (> 1)
  int hc_lowrank = 0;  // hyper_connection.low_rank: rank of the input mixer
  // QSA indexer of every attention layer.
  int indexer_heads = 0;     // attention.indexer.head_count: indexer query heads (one key head)
  int indexer_head_dim = 0;  // attention.indexer.key_length
  int indexer_budget = 0;    // attention.indexer.top_k: tokens kept from whole blocks per query
  // attention.compress_ratios [n_layer]: tokens mean-pooled into one indexer block on attention
  // layers; 0 = dense attention there (and every entry 0 = QSA off, as some converters write).
  std::vector<int> compress_ratios;
  // PLE (one layer at most, a DeltaNet layer).
  int ple_layer = -1;           // ple.layers[0]; -1 = no PLE
  int ple_ngram = 0;            // ple.ngram_size: largest n-gram (>= 2); also the conv dilation
  int ple_heads_per_ngram = 0;  // ple.heads_per_ngram
  int ple_conv_kernel = 0;      // ple.conv_kernel
  int ple_head_dim = 0;         // embedding_length_per_layer_input: one table row
  int32_t ple_eos = 0;          // ple.eos_token_id: the n-gram windows stop at it
  std::vector<uint64_t> ple_multipliers;  // ple.layer_multipliers [ple_ngram]
  std::vector<int64_t> ple_head_offsets;  // ple.head_offsets [ple_heads]: first table row
  std::vector<int64_t> ple_head_vocab;    // ple.head_vocab_sizes [ple_heads]: rows of the head
  int64_t ple_rows = 0;                   // rows of per_layer_token_embd

  int ple_heads() const { return (ple_ngram - 1) * ple_heads_per_ngram; }
  int ple_dim() const { return ple_heads() * ple_head_dim; }
  // Inputs kept per slot for the dilated conv: (kernel - 1) * dilation rows.
  int ple_conv_history() const { return (ple_conv_kernel - 1) * ple_ngram; }
};

struct Config {
  Arch arch = Arch::kQwen35;
  std::string arch_name;  // general.architecture: "qwen35", "qwen35moe" or "qwen4exp"

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
  // attention.recurrent_layers when the file has it (1 = DeltaNet): it wins over the interval.
  std::vector<uint8_t> recurrent_layers;

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

  Qwen4ExpConfig q4;  // qwen4exp only

  bool is_moe() const { return arch != Arch::kQwen35; }
  bool is_qwen4exp() const { return arch == Arch::kQwen4Exp; }
  // The DeltaNet output gate: sigmoid(z) on qwen4exp, silu(z) on Qwen3.5.
  bool deltanet_sigmoid_gate() const { return is_qwen4exp(); }
  // Whether attention layer il runs QSA (a qwen4exp file with a compress ratio there).
  bool is_qsa_layer(int il) const {
    return is_qwen4exp() && il < static_cast<int>(q4.compress_ratios.size()) &&
           q4.compress_ratios[il] > 0;
  }
  bool is_attention_layer(int il) const {
    if (il >= 0 && il < static_cast<int>(recurrent_layers.size())) return !recurrent_layers[il];
    return (il + 1) % full_attention_interval == 0;
  }
  int conv_channels() const { return 2 * ssm_k_heads * ssm_head_dim + ssm_v_heads * ssm_head_dim; }
  int n_attention_layers() const {
    int n = 0;
    for (int il = 0; il < n_layer; ++il) n += is_attention_layer(il) ? 1 : 0;
    return n;
  }

  // Reads and validates; Error names the file, the key and expected vs actual values.
  static Config from_gguf(const gguf::File& file);
};

}  // namespace qwenrt::model
