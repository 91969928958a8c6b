// The shapes of the checkpoints the engine serves (SPEC.md's table), as Configs: what
// `qwenrt synth` writes full-size files of, and what tests check a file's layout against.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/identity.h"

namespace qwenrt::model {

// The config.json fields transformers derives a qwen4exp PLE layer's hash constants from
// (Qwen4ExpTextNGramEmbedding in modeling_qwen4_exp.py).
struct PleHashParams {
  int64_t ngram_vocab_size_base = 20'000'000;  // ngram_vocab_size_base
  int64_t vocab_divisible_by = 128;            // make_ngram_vocab_size_divisible_by
  uint64_t seed = 1234;                        // seed
  int ple_layer_index = 0;                     // the layer's index in ple_layer_ids
};

struct CheckpointShape {
  Checkpoint checkpoint;
  std::string name;        // general.name of the official conversion: "Qwen3.6-27B"
  std::string size_label;  // general.size_label: "27B", "35B-A3B"
  Config config;           // every width, n_vocab 248320 (padded), context_length 262144
  // qwen4exp only.
  std::string description;           // general.description (empty: not written)
  int32_t eos_token_id = -1;         // tokenizer.ggml.eos_token_id when >= 0 (else <|im_end|>)
  int32_t ple_image_token_id = -1;   // {arch}.ple.image_token_id when >= 0
  std::optional<PleHashParams> ple;  // how config.q4's PLE tables were derived
};

// The registered checkpoints with known shapes, in registry order.
const std::vector<CheckpointShape>& checkpoint_shapes();
// By exact registry name ("Qwen3.6-35B-A3B"); nullopt for any other text.
std::optional<CheckpointShape> checkpoint_shape(std::string_view name);

// ---- qwen4exp PLE hash constants, exactly as transformers computes them ----------------------
// (modeling_qwen4_exp.py: _splitmix64, _build_layer_multipliers, _find_nth_prime_after and
// Qwen4ExpTextNGramEmbedding.__init__; every value fits the uint64 / int64 used here.)

// One splitmix64 step of `value` (the function of the value, not a stateful generator).
uint64_t ple_splitmix64(uint64_t value);
// ngram odd multipliers below (2^63 - 1) / unigram_vocab, from seed + 10007 * ple_layer_index.
std::vector<uint64_t> ple_layer_multipliers(int64_t unigram_vocab, int ngram, int ple_layer_index,
                                            uint64_t seed);
// The count-th prime after `start` (count >= 1): the first prime > start for count 1.
int64_t ple_find_nth_prime_after(int64_t start, int count);

struct PleHeadLayout {
  std::vector<int64_t> vocab_sizes;  // rows of each hash head: distinct primes >= the base
  std::vector<int64_t> offsets;      // first table row of each head
  int64_t total_rows = 0;            // sum of vocab_sizes
  int64_t padded_rows = 0;           // total_rows rounded up to vocab_divisible_by: the table
};
// The n_heads heads of PLE layer h.ple_layer_index: head i (global index
// ple_layer_index * n_heads + i) has the (global + 1)-th prime after base - 1 rows.
PleHeadLayout ple_head_layout(const PleHashParams& h, int n_heads);

// Fills c.q4.ple_multipliers, ple_head_offsets, ple_head_vocab and ple_rows from h, c.n_vocab,
// c.q4.ple_ngram and c.q4.ple_heads_per_ngram. Error when the table would not fit int32 rows.
void derive_ple_tables(Config& c, const PleHashParams& h);

}  // namespace qwenrt::model
