// Synthetic models: a GGUF with the exact metadata keys and tensor table of a qwen35 / qwen35moe /
// qwen4exp checkpoint, filled with seeded random but well-scaled weights (activations stay finite
// through every layer). Used by tests (tiny shapes) and by speed work (full shapes, `qwenrt
// synth`).
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
  // qwen4exp only.
  DType hyper = DType::F32;      // hc_{attn,ffn}_{down,up}, output_hc_{down,up}
  DType hc_inject = DType::F32;  // hc_{attn,ffn}_inject [hc * n_embd, hc]
  DType indexer = DType::F32;    // indexer.q_proj / k_proj
  DType ple = DType::F32;        // ple_key, ple_value, ple_conv1d (F16 when 4 taps fit no block)
  DType ple_table = DType::F32;  // per_layer_token_embd (the n-gram table)

  // Every kind `type`, hc_inject included.
  static QuantMix uniform(DType type);
  // The official Q4_K_M conversions (SPEC.md): attention, DeltaNet and shared-expert projections
  // Q8_0; FFN and expert matrices Q4_K (down included); output Q6_K; token_embd Q4_K.
  // qwen4exp: hyper-connection and PLE projections Q8_0 (as in the published files);
  // hc_*_inject F32 (as published); indexer BF16 (llama.cpp's quantizer never quantizes
  // indexer.q_proj / k_proj, so they keep the BF16 of the conversion it starts from); the PLE
  // table follows token_embd (llama-quant.cpp counts per_layer_token_embd as a token embedding).
  // Rows no block divides fall back as llama.cpp does (fallback_type): the 640-wide
  // ffn_down_exps and the 160-wide PLE table Q5_0, ple_conv1d F16.
  static QuantMix q4_k_m();
  // Q8_0 files: every matrix Q8_0, output and token_embd included (llama.cpp's quantizer only
  // moves output to Q6_K when the target type is not already Q8_0; convert --outtype q8_0 does
  // the same). qwen4exp as convert --outtype q8_0 writes it (tests/fixtures/models/
  // qwen4exp.Q8_0.gguf): indexer and hc_*_inject Q8_0 too, the PLE table Q8_0.
  static QuantMix q8_0() { return uniform(DType::Q8_0); }
};

// The type a matrix of `type` with rows of `ncols` elements gets: `type` when its block divides
// the row, else llama.cpp's fallback (llama-quant.cpp tensor_type_fallback: Q4_K -> Q5_0,
// Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K -> Q4_0, the 256-block IQ types -> IQ4_NL), and F16
// when that does not divide it either. Qwen3.8-Flash-Next's 640-wide ffn_down_exps and 160-wide
// per_layer_token_embd take Q5_0 in Q4_K_M files this way.
DType fallback_type(DType type, int64_t ncols);

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
  std::string size_label;           // general.size_label ("27B")
  uint32_t file_type = 0;           // general.file_type (llama_ftype: 7 Q8_0, 15 Q4_K_M)
  std::string description;          // general.description when not empty
  int32_t ple_image_token_id = -1;  // qwen4exp: {arch}.ple.image_token_id when >= 0

  SynthVocab vocab = SynthVocab::kNone;
  std::string vocab_from;     // a GGUF to copy tokenizer.* keys from (overrides `vocab`)
  std::string chat_template;  // tokenizer.chat_template when not empty
  int32_t eos_token_id = -1;  // kSynthetic: tokenizer.ggml.eos_token_id when >= 0
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

// Writes the file as it is generated, a piece of a tensor at a time (so a tensor larger than
// memory, such as Qwen3.8-Flash-Next's 35-54 GB PLE table, streams through): the bytes are those
// gguf::Writer writes for the same keys and tensors.
void write_synthetic(const SynthSpec& spec, const std::string& path);

// What `qwenrt synth` writes: the official conversion of `checkpoint` ("Qwen3.6-27B") in `quant`
// ("Q4_K_M" or "Q8_0"): its metadata keys, tensor table and types, a synthetic 248320-entry
// vocabulary, direct blocks. layers > 0 keeps only the first `layers` layers (same interval);
// mtp adds one MTP (nextn) block after them, as `convert_hf_to_gguf.py` without --no-mtp does
// (not for qwen4exp: its converter drops the MTP block). ple_rows_scale > 1 (qwen4exp) divides
// ngram_vocab_size_base by it and derives the PLE heads, offsets and table rows from that base
// exactly as transformers would (a table ~1/scale the size; the multipliers do not change).
// Error names the checkpoint / quant / layer count when one is not known or out of range.
SynthSpec synth_spec_like(const std::string& checkpoint, const std::string& quant, int layers = 0,
                          bool mtp = false, int64_t ple_rows_scale = 1);

// A tiny config with the real structure (K heads != V heads, GQA, interval 4, MoE top-k > 1 with
// a shared expert), small enough for the reference backend in tests. kQwen4Exp adds 4
// hyper-connection streams of rank 16, QSA on layer 3 (2 indexer heads of 8, ratio 4, budget
// 8: sequences past 8 tokens drop blocks) and a PLE on DeltaNet layer 1 (trigrams, 2 heads per
// n-gram of 16 dims, a 4-tap conv, hash tables from base 101: 424 rows).
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
