#include "model/checkpoints.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace qwenrt::model {
namespace {

// What every checkpoint of the family shares (SPEC.md): 256-dim attention heads with 64 rotary
// dims in IMROPE sections [11, 11, 10, 0], theta 1e7, eps 1e-6, DeltaNet heads of 128 with a
// 4-tap conv, one attention layer in four, 248320 vocabulary rows.
Config family_base(Arch arch) {
  Config c;
  c.arch = arch;
  c.arch_name = arch == Arch::kQwen35      ? "qwen35"
                : arch == Arch::kQwen35Moe ? "qwen35moe"
                                           : "qwen4exp";
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

// Qwen3.8-Flash-Next (HF Qwen/Qwen3.8-Flash-Next, model_type qwen4_exp, GGUF arch qwen4exp).
// The release's config.json text_config was not reachable from here; its values come from
// copies of it in public code (each checked against the others, none disagreeing):
//  - a TP8 serving prototype's config guard ("expected" dict, model_type qwen4_exp): hidden_size
//    2560, num_hidden_layers 48, hc_count 4, hc_lowrank 320, num_attention_heads 24,
//    num_key_value_heads 2, head_dim 256, linear_num_key_heads 16, linear_num_value_heads 48,
//    linear_key/value_head_dim 128, linear_conv_kernel_dim 4, num_experts 512,
//    num_experts_per_tok 10, moe_intermediate_size 640, shared_expert_intermediate_size 640,
//    output_gate_type sigmoid, indexer_budget 2048, indexer_compress_ratio 4, indexer_head_dim
//    128, indexer_kv_heads 1, indexer_n_heads 4, ngram_size 3, heads_per_ngram 8,
//    ple_conv_kernel_size 4, ple_embed_dim 2560, ple_layer_ids [2], split_ngram_parts 128,
//    make_ngram_vocab_size_divisible_by 128, bos/eos_token_id 248044, rms_norm_eps 1e-6,
//    vocab_size 248320, layer_types (["linear_attention"] * 3 + ["full_attention"]) * 12,
//    rope_parameters {rope_theta 1e7, partial_rotary_factor 0.25, rope_type default};
//  - config.json transcriptions in other ports' tests (Rust, Go, Python, Swift, MLX):
//    ngram_vocab_size_base 20000000, seed 1234, max_position_embeddings 262144,
//    mrope_section [11, 11, 10] (interleaved), mtp_num_hidden_layers 1;
//  - header dumps of published GGUFs (unsloth UD-Q4_K_XL, 1224 tensors): general.size_label
//    "512x56B", general.description "A Preview of the Qwen4 Architecture", compress_ratios
//    [0, 0, 0, 4] * 12, ple.layers [1], embedding_length_per_layer_input 160,
//    per_layer_token_embd [160, 320001536], blk.1.ple_key [2560, 10240], ple.eos_token_id and
//    tokenizer.ggml.eos_token_id 248044.
// The "16 K / 48 V heads, head dim 128" agrees. No value had to fall back to transformers'
// defaults (configuration_qwen4_exp.py); several equal them anyway (hc_count 4, hc_lowrank 320,
// ngram_size 3, heads_per_ngram 8, ngram_vocab_size_base 20000000, seed 1234, num_experts 512,
// num_experts_per_tok 10, divisor 128). general.name is the registry name (unsloth's files say
// "Qwen3.8 Flash Next", which identifies the same). eos_token_id is one id (248044) in the
// release, so transformers' eos[0] and the converter's eos[-1] agree on the PLE's EOS.
// The top-level image_token_id 248056 is transformers' Qwen4ExpConfig default (the converter
// merges the top level into hparams and writes it as ple.image_token_id).
// Derived exactly as llama.cpp's converter (conversion/qwen4exp.py) and transformers do: the PLE
// layer is ple_layer_ids[0] - 1 = 1 (a DeltaNet layer); its row width is ple_embed_dim / heads =
// 2560 / 16 = 160; the hash constants come from derive_ple_tables; the compress ratio sits on
// the full-attention layers only; n_rot = 0.25 * 256. No MTP block: the converter drops it.
Config flash_next() {
  Config c = family_base(Arch::kQwen4Exp);
  c.n_layer = 48;
  c.n_embd = 2560;
  c.n_head = 24;
  c.n_head_kv = 2;
  c.ssm_k_heads = 16;
  c.ssm_v_heads = 48;
  c.ssm_inner = 48 * 128;
  c.n_expert = 512;
  c.n_expert_used = 10;
  c.n_ff_exp = 640;
  c.n_ff_shexp = 640;
  Qwen4ExpConfig& q = c.q4;
  q.hc_count = 4;
  q.hc_lowrank = 320;
  q.indexer_heads = 4;
  q.indexer_head_dim = 128;
  q.indexer_budget = 2048;
  for (int il = 0; il < c.n_layer; ++il)
    q.compress_ratios.push_back(c.is_attention_layer(il) ? 4 : 0);
  q.ple_layer = 1;
  q.ple_ngram = 3;
  q.ple_heads_per_ngram = 8;
  q.ple_conv_kernel = 4;
  q.ple_head_dim = 2560 / ((3 - 1) * 8);
  q.ple_eos = 248044;
  derive_ple_tables(c, PleHashParams{});
  return c;
}

CheckpointShape flash_next_shape() {
  CheckpointShape s{Checkpoint::kQwen38_FlashNext, checkpoint_name(Checkpoint::kQwen38_FlashNext),
                    "512x56B", flash_next()};
  s.description = "A Preview of the Qwen4 Architecture";
  s.eos_token_id = 248044;
  s.ple_image_token_id = 248056;
  s.ple = PleHashParams{};
  return s;
}

}  // namespace

const std::vector<CheckpointShape>& checkpoint_shapes() {
  // Qwen3.8-27B runs the 27B graph unchanged; only general.name tells them apart.
  static const std::vector<CheckpointShape> shapes = {
      {Checkpoint::kQwen36_27B, checkpoint_name(Checkpoint::kQwen36_27B), "27B", dense_27b()},
      {Checkpoint::kQwen36_35B_A3B, checkpoint_name(Checkpoint::kQwen36_35B_A3B), "35B-A3B",
       moe_35b_a3b()},
      {Checkpoint::kQwen38_27B, checkpoint_name(Checkpoint::kQwen38_27B), "27B", dense_27b()},
      flash_next_shape(),
  };
  return shapes;
}

std::optional<CheckpointShape> checkpoint_shape(std::string_view name) {
  for (const auto& shape : checkpoint_shapes()) {
    if (shape.name == name) return shape;
  }
  return std::nullopt;
}

// ---- PLE hash constants -------------------------------------------------------------------------

namespace {
constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kPrime1 = 10007;  // transformers' _PRIME_1
}  // namespace

uint64_t ple_splitmix64(uint64_t value) {
  value += kSplitmixGamma;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
  return value ^ (value >> 31);
}

std::vector<uint64_t> ple_layer_multipliers(int64_t unigram_vocab, int ngram, int ple_layer_index,
                                            uint64_t seed) {
  const uint64_t max_long = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const uint64_t multiplier_max =
      max_long / static_cast<uint64_t>(std::max<int64_t>(unigram_vocab, 1));
  const uint64_t half_bound = std::max<uint64_t>(1, multiplier_max / 2);
  // Python's ints are unbounded; every sum below is taken mod 2^64 there too.
  const uint64_t base_seed = seed + kPrime1 * static_cast<uint64_t>(ple_layer_index);
  std::vector<uint64_t> out;
  for (int i = 0; i < ngram; ++i) {
    const uint64_t value = base_seed + kSplitmixGamma * static_cast<uint64_t>(i + 1);
    out.push_back(2 * (ple_splitmix64(value) % half_bound) + 1);
  }
  return out;
}

namespace {
bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2) {
    if (v % d == 0) return false;
  }
  return true;
}
}  // namespace

int64_t ple_find_nth_prime_after(int64_t start, int count) {
  int64_t prime = start;
  for (int i = 0; i < count; ++i) {
    ++prime;
    while (!is_prime(prime)) ++prime;
  }
  return prime;
}

PleHeadLayout ple_head_layout(const PleHashParams& h, int n_heads) {
  if (h.ngram_vocab_size_base < 2 || h.vocab_divisible_by < 1 || n_heads < 1) {
    fail("PLE hash layout: ngram_vocab_size_base {} / divisor {} / {} heads out of range",
         h.ngram_vocab_size_base, h.vocab_divisible_by, n_heads);
  }
  PleHeadLayout out;
  for (int head = 0; head < n_heads; ++head) {
    const int global = h.ple_layer_index * n_heads + head;
    const int64_t size = ple_find_nth_prime_after(h.ngram_vocab_size_base - 1, global + 1);
    out.vocab_sizes.push_back(size);
    out.offsets.push_back(out.total_rows);
    out.total_rows += size;
  }
  out.padded_rows =
      (out.total_rows + h.vocab_divisible_by - 1) / h.vocab_divisible_by * h.vocab_divisible_by;
  return out;
}

void derive_ple_tables(Config& c, const PleHashParams& h) {
  Qwen4ExpConfig& q = c.q4;
  const PleHeadLayout layout = ple_head_layout(h, q.ple_heads());
  if (layout.padded_rows > std::numeric_limits<int32_t>::max()) {
    fail("PLE table of {} rows (base {}) exceeds the int32 row index", layout.padded_rows,
         h.ngram_vocab_size_base);
  }
  q.ple_multipliers = ple_layer_multipliers(c.n_vocab, q.ple_ngram, h.ple_layer_index, h.seed);
  q.ple_head_offsets = layout.offsets;
  q.ple_head_vocab = layout.vocab_sizes;
  q.ple_rows = layout.padded_rows;
}

}  // namespace qwenrt::model
