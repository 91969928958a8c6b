// Synthetic models: a GGUF with the exact metadata keys and tensor table of a qwen35 / qwen35moe
// checkpoint, filled with seeded random but well-scaled weights (activations stay finite through
// every layer). Used by tests (tiny shapes) and by speed work (full shapes, `qwenrt synth`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/writer.h"
#include "model/config.h"

namespace qwenrt::model {

// The GGML type of each kind of matrix. Norms, router, conv, ssm_a, ssm_dt and the shared
// expert's scalar gate are always F32, as in every official file.
struct QuantMix {
  DType embedding = DType::F32;      // token_embd
  DType output = DType::F32;         // output.weight
  DType attention = DType::F32;      // attn_q / attn_k / attn_v / attn_output (attention layers)
  DType deltanet = DType::F32;       // attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out
  DType ffn = DType::F32;            // dense ffn_gate / ffn_up / ffn_down
  DType experts = DType::F32;        // ffn_{gate,up,down}_exps, ffn_gate_up_exps
  DType shared_expert = DType::F32;  // ffn_{gate,up,down}_shexp

  static QuantMix uniform(DType type);
  // The official Q4_K_M conversions (SPEC.md): attention, DeltaNet and shared-expert projections
  // Q8_0; FFN and expert matrices Q4_K (down included); output Q6_K; token_embd Q4_K.
  static QuantMix q4_k_m();
  // Q8_0 files: every matrix Q8_0, output and token_embd included (llama.cpp's quantizer only
  // moves output to Q6_K when the target type is not already Q8_0; convert --outtype q8_0 does
  // the same).
  static QuantMix q8_0() { return uniform(DType::Q8_0); }
};

enum class SynthVocab {
  kNone,       // no tokenizer keys (engine-only tests)
  kSynthetic,  // byte-level BPE: 256 byte tokens, generated merges, Qwen's added tokens at their
               // real ids (248044 <|endoftext|> ...), [PAD...] rows up to n_vocab
};

struct SynthSpec {
  Config config;  // arch and every width; n_vocab included; n_layer_nextn MTP blocks follow
  std::string name = "synthetic";  // general.name
  DType matrix_type = DType::F32;  // every matrix when `mix` is empty
  std::optional<QuantMix> mix;     // per-kind types (overrides matrix_type)
  uint64_t seed = 1;
  bool tied_output = false;         // omit output.weight (head falls back to token_embd)
  bool fused_gate_up_exps = false;  // MoE: ffn_gate_up_exps instead of ffn_gate/up_exps
  bool fused_attn_qkv = false;      // attention layers: attn_qkv instead of attn_q/k/v

  // Fast path for big files: Q8_0 / Q4_K / Q6_K blocks are drawn directly (random quants, finite
  // f16 scales giving ~N(0, scale^2) weights), every tensor's data from a seed derived from the
  // tensor's name, in parallel. Off: floats through the reference quantizer, one seeded stream.
  bool direct_blocks = false;
  int n_threads = 0;  // direct_blocks: threads filling tensors (0: hardware concurrency)

  // The converter's keys besides the model's own: general.type, general.size_label,
  // general.quantization_version, general.file_type, {arch}.attention.recurrent_layers.
  bool converter_keys = false;
  std::string size_label;  // general.size_label ("27B")
  uint32_t file_type = 0;  // general.file_type (llama_ftype: 7 Q8_0, 15 Q4_K_M)

  SynthVocab vocab = SynthVocab::kNone;
  std::string vocab_from;     // a GGUF to copy tokenizer.* keys from (overrides `vocab`)
  std::string chat_template;  // tokenizer.chat_template when not empty
};

// One entry of the tensor table, in file order.
struct SynthTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  DType type;
  uint64_t n_bytes;
};

// The tensor table write_synthetic produces for `spec` (nothing is generated or written).
std::vector<SynthTensor> synth_tensor_table(const SynthSpec& spec);

void write_synthetic(const SynthSpec& spec, const std::string& path);

// What `qwenrt synth` writes: the official conversion of `checkpoint` ("Qwen3.6-27B") in `quant`
// ("Q4_K_M" or "Q8_0"): its metadata keys, tensor table and types, a synthetic 248320-entry
// vocabulary, direct blocks. layers > 0 keeps only the first `layers` layers (same interval);
// mtp adds one MTP (nextn) block after them, as `convert_hf_to_gguf.py` without --no-mtp does.
// Error names the checkpoint / quant / layer count when one is not known or out of range.
SynthSpec synth_spec_like(const std::string& checkpoint, const std::string& quant, int layers = 0,
                          bool mtp = false);

// A tiny config with the real structure (K heads != V heads, GQA, interval 4, MoE top-k > 1 with
// a shared expert), small enough for the reference backend in tests.
Config tiny_config(Arch arch);

// Synthetic tokenizer metadata for n_vocab rows (n_vocab >= 256 + 33): tokens, token types and
// merges. With n_vocab 248320 the added tokens sit at their real ids and rows 248077.. are
// [PAD<id>]; smaller vocabularies put the 33 added tokens last.
struct SynthTokenizer {
  std::vector<std::string> tokens;
  std::vector<int32_t>
      types;  // llama.cpp token types: 1 normal, 3 control, 4 user-defined, 5 unused
  std::vector<std::string> merges;
  int32_t eos_id = 0;      // <|im_end|>
  int32_t padding_id = 0;  // <|endoftext|>
};
SynthTokenizer synthetic_tokenizer(int n_vocab, uint64_t seed);
// Sets tokenizer.ggml.{model, pre, tokens, token_type, merges, eos_token_id, padding_token_id,
// add_bos_token} as the converter writes them for Qwen3.5.
void set_tokenizer_keys(gguf::Writer& w, const SynthTokenizer& tok);

}  // namespace qwenrt::model
