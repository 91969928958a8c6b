#include "model/synth.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <span>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/checkpoints.h"
#include "model/synth_blocks.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwenrt::model {
namespace {

using namespace synth_blocks;

using gguf::Value;

// How a tensor's values are drawn.
enum class Init {
  kMatrix,    // N(0, scale^2) in the tensor's type
  kGaussian,  // F32 N(0, scale^2) (router, shared-expert gate)
  kNorm,      // 1 + U(-0.2, 0.2)
  kConv,      // N(0, 0.5^2)
  kDtBias,    // U(-1, 1)
  kSsmA,      // -exp(U(-1.5, 0.5)): decays exp(g) well inside (0, 1)
};

struct PlannedTensor {
  SynthTensor table;
  Init init;
  float scale;
};

// One value; the distributions are built per call on purpose: the seeded streams of the
// reference-quantizer path (tests' tiny models) must not change.
float draw(Init init, float scale, std::mt19937_64& rng) {
  switch (init) {
    case Init::kMatrix:
    case Init::kGaussian:
      return std::normal_distribution<float>(0.0f, scale)(rng);
    case Init::kNorm:
      return 1.0f + std::uniform_real_distribution<float>(-0.2f, 0.2f)(rng);
    case Init::kConv:
      return std::normal_distribution<float>(0.0f, 0.5f)(rng);
    case Init::kDtBias:
      return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    case Init::kSsmA:
      return -std::exp(std::uniform_real_distribution<float>(-1.5f, 0.5f)(rng));
  }
  return 0.0f;
}

std::string blk(int il, const char* suffix) {
  return fmt::format("blk.{}.{}", il, suffix);
}

// The tensor table in file order (the order the seeded reference path has always used).
std::vector<PlannedTensor> plan(const SynthSpec& spec) {
  const Config& c = spec.config;
  const QuantMix mix = spec.mix.value_or(QuantMix::uniform(spec.matrix_type));
  std::vector<PlannedTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> ne, DType type, Init init, float scale) {
    type = fallback_type(type, ne[0]);  // as llama.cpp's quantizer does for short rows
    uint64_t n = 1;
    for (int64_t d : ne) n *= static_cast<uint64_t>(d);
    const auto& tr = traits(type);
    if (ne[0] % tr.block_elems != 0) {
      fail("synth: tensor '{}': type {} needs rows of a multiple of {} elements, got {}", name,
           tr.name, tr.block_elems, ne[0]);
    }
    const uint64_t bytes = n / tr.block_elems * tr.block_bytes;
    out.push_back({{std::move(name), std::move(ne), type, bytes}, init, scale});
  };
  auto matrix = [&](std::string name, std::vector<int64_t> ne, DType type) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(ne[0]));  // fan-in
    add(std::move(name), std::move(ne), type, Init::kMatrix, scale);
  };
  auto f32 = [&](std::string name, std::vector<int64_t> ne, Init init, float scale = 0.0f) {
    add(std::move(name), std::move(ne), DType::F32, init, scale);
  };

  const int64_t e = c.n_embd;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(e));
  auto attention = [&](int il) {
    const int64_t hd = c.head_dim, nq = int64_t{c.n_head} * hd, nkv = int64_t{c.n_head_kv} * hd;
    if (spec.fused_attn_qkv) {
      matrix(blk(il, "attn_qkv.weight"), {e, 2 * nq + 2 * nkv}, mix.attention);
    } else {
      matrix(blk(il, "attn_q.weight"), {e, 2 * nq}, mix.attention);
      matrix(blk(il, "attn_k.weight"), {e, nkv}, mix.attention);
      matrix(blk(il, "attn_v.weight"), {e, nkv}, mix.attention);
    }
    matrix(blk(il, "attn_output.weight"), {nq, e}, mix.attention);
    f32(blk(il, "attn_q_norm.weight"), {hd}, Init::kNorm);
    f32(blk(il, "attn_k_norm.weight"), {hd}, Init::kNorm);
  };
  auto ffn = [&](int il) {
    if (c.is_moe()) {
      const int64_t ff = c.n_ff_exp, n = c.n_expert, sff = c.n_ff_shexp;
      // A router 4x sharper than fan-in scaling: clear top-k choices, still spread over experts.
      f32(blk(il, "ffn_gate_inp.weight"), {e, n}, Init::kGaussian, 4.0f * in_scale);
      if (spec.fused_gate_up_exps) {
        matrix(blk(il, "ffn_gate_up_exps.weight"), {e, 2 * ff, n}, mix.experts);
      } else {
        matrix(blk(il, "ffn_gate_exps.weight"), {e, ff, n}, mix.experts);
        matrix(blk(il, "ffn_up_exps.weight"), {e, ff, n}, mix.experts);
      }
      matrix(blk(il, "ffn_down_exps.weight"), {ff, e, n}, mix.experts);
      f32(blk(il, "ffn_gate_inp_shexp.weight"), {e}, Init::kGaussian, in_scale);
      matrix(blk(il, "ffn_gate_shexp.weight"), {e, sff}, mix.shared_expert);
      matrix(blk(il, "ffn_up_shexp.weight"), {e, sff}, mix.shared_expert);
      matrix(blk(il, "ffn_down_shexp.weight"), {sff, e}, mix.shared_expert);
    } else {
      matrix(blk(il, "ffn_gate.weight"), {e, c.n_ff}, mix.ffn);
      matrix(blk(il, "ffn_up.weight"), {e, c.n_ff}, mix.ffn);
      matrix(blk(il, "ffn_down.weight"), {c.n_ff, e}, mix.ffn);
    }
  };
  auto deltanet = [&](int il) {
    const int64_t hv = c.ssm_v_heads, inner = c.ssm_inner, ch = c.conv_channels();
    matrix(blk(il, "attn_qkv.weight"), {e, ch}, mix.deltanet);
    matrix(blk(il, "attn_gate.weight"), {e, inner}, mix.deltanet);
    f32(blk(il, "ssm_conv1d.weight"), {c.conv_kernel, ch}, Init::kConv);
    f32(blk(il, "ssm_dt.bias"), {hv}, Init::kDtBias);
    f32(blk(il, "ssm_a"), {hv}, Init::kSsmA);
    matrix(blk(il, "ssm_beta.weight"), {e, hv}, mix.deltanet);
    matrix(blk(il, "ssm_alpha.weight"), {e, hv}, mix.deltanet);
    f32(blk(il, "ssm_norm.weight"), {c.ssm_head_dim}, Init::kNorm);
    matrix(blk(il, "ssm_out.weight"), {inner, e}, mix.deltanet);
  };
  add("token_embd.weight", {e, c.n_vocab}, mix.embedding, Init::kMatrix, 1.0f);
  if (c.is_qwen4exp()) {
    // llama.cpp's qwen4exp layout (src/models/qwen4exp.cpp, load_arch_tensors): no output_norm
    // and no per-layer norms: the hyper-connections' grouped norms take their place.
    const Qwen4ExpConfig& q = c.q4;
    const int64_t hc = q.hc_count, wide = hc * e, lowrank = q.hc_lowrank;
    auto hyper = [&](const std::string& prefix, bool inject) {
      // The per-stream gammas as the converter writes them: one [hc * n_embd] vector (llama.cpp's
      // loader reshapes it to [n_embd, hc]).
      f32(prefix + "_norm.weight", {wide}, Init::kNorm);
      matrix(prefix + "_down.weight", {wide, lowrank}, mix.hyper);
      matrix(prefix + "_up.weight", {lowrank, wide}, mix.hyper);
      if (inject) matrix(prefix + "_inject.weight", {wide, hc}, mix.hc_inject);
    };
    if (!spec.tied_output) matrix("output.weight", {e, c.n_vocab}, mix.output);
    hyper("output_hc", false);
    if (q.ple_layer >= 0) {
      // Unit-scale rows, as token_embd: key / value projections of their concatenation are then
      // fan-in scaled.
      add("per_layer_token_embd.weight", {q.ple_head_dim, q.ple_rows}, mix.ple_table, Init::kMatrix,
          1.0f);
    }
    for (int il = 0; il < c.n_layer; ++il) {
      hyper(blk(il, "hc_attn"), true);
      hyper(blk(il, "hc_ffn"), true);
      if (c.is_attention_layer(il)) {
        attention(il);
        if (c.is_qsa_layer(il)) {
          const int64_t d = q.indexer_head_dim;
          matrix(blk(il, "indexer.q_proj.weight"), {e, q.indexer_heads * d}, mix.indexer);
          matrix(blk(il, "indexer.k_proj.weight"), {e, d}, mix.indexer);
          f32(blk(il, "indexer.q_norm.weight"), {d}, Init::kNorm);
          f32(blk(il, "indexer.k_norm.weight"), {d}, Init::kNorm);
        }
      } else {
        deltanet(il);
      }
      if (il == q.ple_layer) {
        const int64_t ple_dim = q.ple_dim();
        matrix(blk(il, "ple_key.weight"), {ple_dim, wide}, mix.ple);
        matrix(blk(il, "ple_value.weight"), {ple_dim, e}, mix.ple);
        f32(blk(il, "ple_norm_key.weight"), {wide}, Init::kNorm);
        f32(blk(il, "ple_norm_query.weight"), {wide}, Init::kNorm);
        f32(blk(il, "ple_norm_conv.weight"), {wide}, Init::kNorm);
        // The converter's 2-D .weight rule: it tries the file's block type and falls back to
        // F16 (4 taps are shorter than any block); llama-quantize does the same. F32 only in
        // F32 files (and some published ones, e.g. unsloth's).
        add(blk(il, "ple_conv1d.weight"), {q.ple_conv_kernel, wide}, mix.ple, Init::kConv, 0.0f);
      }
      ffn(il);
    }
    return out;
  }
  f32("output_norm.weight", {e}, Init::kNorm);
  if (!spec.tied_output) matrix("output.weight", {e, c.n_vocab}, mix.output);
  for (int il = 0; il < c.n_layer; ++il) {
    f32(blk(il, "attn_norm.weight"), {e}, Init::kNorm);
    f32(blk(il, "post_attention_norm.weight"), {e}, Init::kNorm);
    if (c.is_attention_layer(il)) {
      attention(il);
    } else {
      deltanet(il);
    }
    ffn(il);
  }
  // The MTP (nextn) blocks after the trunk: a full-attention block with the trunk's FFN kind,
  // eh_proj over [enorm(embedding); hnorm(hidden)], and its own head norm (the head itself is
  // the trunk's output.weight, as the released checkpoints share it).
  for (int il = c.n_layer; il < c.n_layer + c.n_layer_nextn; ++il) {
    f32(blk(il, "attn_norm.weight"), {e}, Init::kNorm);
    f32(blk(il, "post_attention_norm.weight"), {e}, Init::kNorm);
    attention(il);
    ffn(il);
    matrix(blk(il, "nextn.eh_proj.weight"), {2 * e, e}, mix.attention);
    f32(blk(il, "nextn.enorm.weight"), {e}, Init::kNorm);
    f32(blk(il, "nextn.hnorm.weight"), {e}, Init::kNorm);
    f32(blk(il, "nextn.shared_head_norm.weight"), {e}, Init::kNorm);
  }
  return out;
}

// Rows through the reference quantizer go in chunks of this many rows.
constexpr int64_t kRowsPerChunk = 64;

// Floats through the reference quantizer, rows in parallel chunks (types without a direct path):
// rows [first_row, first_row + dst.size() / row_bytes), first_row a multiple of kRowsPerChunk.
void fill_rows(ThreadPool& pool, const PlannedTensor& t, uint64_t seed, std::span<uint8_t> dst,
               int64_t first_row) {
  const int64_t row = t.table.ne[0];
  const size_t row_bytes = static_cast<size_t>(t.table.n_bytes / row_count(t.table));
  const int64_t rows = static_cast<int64_t>(dst.size() / row_bytes);
  const int64_t n_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t first_chunk = first_row / kRowsPerChunk;
  pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
    std::vector<float> values(static_cast<size_t>(row));
    for (int64_t c = c0; c < c1; ++c) {
      std::mt19937_64 rng(mix_seed(seed, static_cast<uint64_t>(first_chunk + c)));
      for (int64_t r = c * kRowsPerChunk; r < std::min(rows, (c + 1) * kRowsPerChunk); ++r) {
        for (auto& v : values) v = draw(t.init, t.scale, rng);
        quant::quantize(t.table.type, values.data(), dst.data() + r * row_bytes, row, t.table.name);
      }
    }
  });
}

// ---- metadata ----------------------------------------------------------------------------------

// The keys in order, as gguf::Writer keeps them (set replaces a key in place).
struct KeyList {
  std::vector<gguf::KeyValue> kv;
  void set(const std::string& key, Value value) {
    for (auto& e : kv) {
      if (e.key == key) {
        e.value = std::move(value);
        return;
      }
    }
    kv.push_back({key, std::move(value)});
  }
};

template <class Keys>
void put_tokenizer_keys(Keys& w, const SynthTokenizer& tok) {
  w.set("tokenizer.ggml.model", Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::str("qwen35"));
  w.set("tokenizer.ggml.tokens", Value::strings(tok.tokens));
  std::vector<Value> types;
  types.reserve(tok.types.size());
  for (int32_t t : tok.types) types.push_back(Value::i32(t));
  w.set("tokenizer.ggml.token_type", Value::array(gguf::ValueType::INT32, std::move(types)));
  w.set("tokenizer.ggml.merges", Value::strings(tok.merges));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(tok.eos_id)));
  w.set("tokenizer.ggml.padding_token_id", Value::u32(static_cast<uint32_t>(tok.padding_id)));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(false));
}

// The qwen4exp keys, in the order conversion/qwen4exp.py writes them after the Qwen3.5 MoE ones.
template <class Keys>
void put_qwen4exp_keys(Keys& w, const SynthSpec& spec) {
  const Config& c = spec.config;
  const Qwen4ExpConfig& q = c.q4;
  const std::string a = c.arch_name;
  auto u32 = [&](const char* key, int64_t v) {
    w.set(a + "." + key, Value::u32(static_cast<uint32_t>(v)));
  };
  auto i32s = [&](const char* key, const std::vector<int64_t>& v) {
    std::vector<Value> items;
    for (int64_t x : v) items.push_back(Value::i32(static_cast<int32_t>(x)));
    w.set(a + "." + key, Value::array(gguf::ValueType::INT32, std::move(items)));
  };
  // gguf_writer._add_u64_array: the multipliers reach ~2.4e13 (and far more in tiny vocabularies).
  auto u64s = [&](const char* key, const auto& v) {
    std::vector<Value> items;
    for (auto x : v) items.push_back(Value::u64(static_cast<uint64_t>(x)));
    w.set(a + "." + key, Value::array(gguf::ValueType::UINT64, std::move(items)));
  };
  u32("hyper_connection.count", q.hc_count);
  u32("hyper_connection.low_rank", q.hc_lowrank);
  u32("attention.indexer.head_count", q.indexer_heads);
  u32("attention.indexer.key_length", q.indexer_head_dim);
  u32("attention.indexer.top_k", q.indexer_budget);
  std::vector<int64_t> ratios(q.compress_ratios.begin(), q.compress_ratios.end());
  ratios.resize(static_cast<size_t>(c.n_layer), 0);
  i32s("attention.compress_ratios", ratios);
  if (q.ple_layer < 0) return;  // no PLE: the converter writes none of its keys
  i32s("ple.layers", {q.ple_layer});
  u32("ple.ngram_size", q.ple_ngram);
  u32("ple.heads_per_ngram", q.ple_heads_per_ngram);
  u32("ple.conv_kernel", q.ple_conv_kernel);
  u32("ple.eos_token_id", q.ple_eos);
  if (spec.ple_image_token_id >= 0) u32("ple.image_token_id", spec.ple_image_token_id);
  u32("embedding_length_per_layer_input", q.ple_head_dim);
  u64s("ple.layer_multipliers", q.ple_multipliers);
  u64s("ple.head_offsets", q.ple_head_offsets);
  u64s("ple.head_vocab_sizes", q.ple_head_vocab);
}

template <class Keys>
void set_model_keys(Keys& w, const SynthSpec& spec) {
  const Config& c = spec.config;
  const std::string a = c.arch_name;
  auto u32 = [&](const char* key, int64_t v) {
    w.set(a + "." + key, Value::u32(static_cast<uint32_t>(v)));
  };
  // The converter's key order (tests/fixtures/models/*.gguf).
  w.set("general.architecture", Value::str(a));
  if (spec.converter_keys) w.set("general.type", Value::str("model"));
  w.set("general.name", Value::str(spec.name));
  if (!spec.description.empty()) w.set("general.description", Value::str(spec.description));
  if (spec.converter_keys && !spec.size_label.empty()) {
    w.set("general.size_label", Value::str(spec.size_label));
  }
  u32("block_count", c.n_layer + c.n_layer_nextn);
  u32("context_length", c.n_ctx_train);
  u32("embedding_length", c.n_embd);
  if (!c.is_moe()) u32("feed_forward_length", c.n_ff);
  u32("attention.head_count", c.n_head);
  u32("attention.head_count_kv", c.n_head_kv);
  std::vector<Value> sections;
  for (int s : c.rope_sections) sections.push_back(Value::i32(s));
  w.set(a + ".rope.dimension_sections", Value::array(gguf::ValueType::INT32, sections));
  w.set(a + ".rope.freq_base", Value::f32(c.rope_theta));
  w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(c.rms_eps));
  if (c.is_moe()) {
    u32("expert_count", c.n_expert);
    u32("expert_used_count", c.n_expert_used);
  }
  u32("attention.key_length", c.head_dim);
  u32("attention.value_length", c.head_dim);
  if (c.is_moe()) {
    u32("expert_feed_forward_length", c.n_ff_exp);
    u32("expert_shared_feed_forward_length", c.n_ff_shexp);
  }
  u32("ssm.conv_kernel", c.conv_kernel);
  u32("ssm.state_size", c.ssm_head_dim);
  u32("ssm.group_count", c.ssm_k_heads);
  u32("ssm.time_step_rank", c.ssm_v_heads);
  u32("ssm.inner_size", c.ssm_inner);
  if (spec.converter_keys) {
    std::vector<Value> recurrent;
    for (int il = 0; il < c.n_layer + c.n_layer_nextn; ++il) {
      recurrent.push_back(Value::boolean(il < c.n_layer && !c.is_attention_layer(il)));
    }
    w.set(a + ".attention.recurrent_layers", Value::array(gguf::ValueType::BOOL, recurrent));
  }
  u32("full_attention_interval", c.full_attention_interval);
  u32("rope.dimension_count", c.n_rot);
  if (c.n_layer_nextn > 0) u32("nextn_predict_layers", c.n_layer_nextn);
  if (c.is_qwen4exp()) put_qwen4exp_keys(w, spec);
}

template <class Keys>
void set_vocab_keys(Keys& w, const SynthSpec& spec) {
  const int n_vocab = spec.config.n_vocab;
  if (!spec.vocab_from.empty()) {
    const gguf::File src = gguf::File::open(spec.vocab_from).value();
    const gguf::Array* tokens = src.get_array("tokenizer.ggml.tokens");
    if (!tokens) fail("{}: no tokenizer.ggml.tokens to copy", spec.vocab_from);
    if (tokens->items.size() != static_cast<size_t>(n_vocab)) {
      fail("{}: tokenizer.ggml.tokens has {} entries, the model has {} vocabulary rows",
           spec.vocab_from, tokens->items.size(), n_vocab);
    }
    for (const auto& kv : src.metadata()) {
      if (kv.key.rfind("tokenizer.", 0) == 0) w.set(kv.key, kv.value);
    }
  } else if (spec.vocab == SynthVocab::kSynthetic) {
    SynthTokenizer tok = synthetic_tokenizer(n_vocab, spec.seed);
    if (spec.eos_token_id >= 0) tok.eos_id = spec.eos_token_id;
    put_tokenizer_keys(w, tok);
  }
  if (!spec.chat_template.empty()) {
    w.set("tokenizer.chat_template", Value::str(spec.chat_template));
  }
}

}  // namespace

QuantMix QuantMix::uniform(DType type) {
  QuantMix m;
  for (DType* kind : {&m.embedding, &m.output, &m.attention, &m.deltanet, &m.ffn, &m.experts,
                      &m.shared_expert, &m.hyper, &m.hc_inject, &m.indexer, &m.ple, &m.ple_table}) {
    *kind = type;
  }
  return m;
}

QuantMix QuantMix::q4_k_m() {
  QuantMix m;
  m.embedding = DType::Q4_K;
  m.output = DType::Q6_K;
  m.attention = DType::Q8_0;
  m.deltanet = DType::Q8_0;
  m.ffn = DType::Q4_K;
  m.experts = DType::Q4_K;
  m.shared_expert = DType::Q8_0;
  m.hyper = DType::Q8_0;
  m.hc_inject = DType::F32;
  m.indexer = DType::BF16;
  m.ple = DType::Q8_0;
  m.ple_table = m.embedding;
  return m;
}

DType fallback_type(DType type, int64_t ncols) {
  auto fits = [ncols](DType t) { return ncols % traits(t).block_elems == 0; };
  if (fits(type)) return type;
  DType out = type;
  switch (type) {
    case DType::IQ1_S:
    case DType::IQ1_M:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
    case DType::IQ4_XS:
      out = DType::IQ4_NL;
      break;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::TQ1_0:
    case DType::TQ2_0:
      out = DType::Q4_0;
      break;
    case DType::Q4_K:
      out = DType::Q5_0;
      break;
    case DType::Q5_K:
      out = DType::Q5_1;
      break;
    case DType::Q6_K:
      out = DType::Q8_0;
      break;
    default:
      break;
  }
  return fits(out) ? out : DType::F16;
}

void set_tokenizer_keys(gguf::Writer& w, const SynthTokenizer& tok) {
  put_tokenizer_keys(w, tok);
}

SynthSpec synth_spec_like(const std::string& checkpoint, const std::string& quant, int layers,
                          bool mtp, int64_t ple_rows_scale) {
  const auto shape = checkpoint_shape(checkpoint);
  if (!shape) {
    std::string names;
    for (const auto& s : checkpoint_shapes()) names += (names.empty() ? "" : ", ") + s.name;
    fail("unknown checkpoint '{}' (expected one of {})", checkpoint, names);
  }
  SynthSpec spec;
  spec.config = shape->config;
  spec.name = shape->name;
  spec.size_label = shape->size_label;
  spec.description = shape->description;
  spec.eos_token_id = shape->eos_token_id;
  spec.ple_image_token_id = shape->ple_image_token_id;
  spec.converter_keys = true;
  spec.direct_blocks = true;
  spec.vocab = SynthVocab::kSynthetic;
  if (quant == "Q4_K_M") {
    spec.mix = QuantMix::q4_k_m();
    spec.file_type = 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  } else if (quant == "Q8_0") {
    spec.mix = QuantMix::q8_0();
    spec.file_type = 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
  } else {
    fail("quantization '{}': expected Q4_K_M or Q8_0", quant);
  }
  if (layers != 0) {
    if (layers < 1 || layers > spec.config.n_layer) {
      fail("{} has {} layers; {} asked for", checkpoint, spec.config.n_layer, layers);
    }
    spec.config.n_layer = layers;  // same interval: layer i is attention iff (i + 1) % 4 == 0
  }
  Qwen4ExpConfig& q = spec.config.q4;
  if (spec.config.is_qwen4exp()) {
    if (mtp) {
      fail("{}: no MTP block (llama.cpp's converter drops it from qwen4exp files)", checkpoint);
    }
    q.compress_ratios.resize(static_cast<size_t>(spec.config.n_layer));
    if (q.ple_layer >= spec.config.n_layer) {
      fail("{} has its PLE on layer {}: --layers must be at least {}", checkpoint, q.ple_layer,
           q.ple_layer + 1);
    }
  }
  if (ple_rows_scale != 1) {
    if (!shape->ple) fail("--ple-rows-scale: {} has no PLE table", checkpoint);
    if (ple_rows_scale < 1)
      fail("--ple-rows-scale {}: expected a whole number >= 1", ple_rows_scale);
    PleHashParams h = *shape->ple;
    h.ngram_vocab_size_base /= ple_rows_scale;
    if (h.ngram_vocab_size_base < 2) {
      fail("--ple-rows-scale {} leaves an n-gram vocabulary base of {}", ple_rows_scale,
           h.ngram_vocab_size_base);
    }
    derive_ple_tables(spec.config, h);
  }
  spec.config.n_layer_nextn = mtp ? 1 : 0;
  return spec;
}

Config tiny_config(Arch arch) {
  Config c;
  c.arch = arch;
  c.arch_name = arch == Arch::kQwen35      ? "qwen35"
                : arch == Arch::kQwen35Moe ? "qwen35moe"
                                           : "qwen4exp";
  c.n_layer = 4;
  c.n_ctx_train = 4096;
  c.n_embd = 64;
  c.n_vocab = 96;
  c.rms_eps = 1e-6f;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_rot = 4;
  c.rope_theta = 1e7f;
  c.rope_sections = {1, 1, 0, 0};
  c.full_attention_interval = 4;
  c.conv_kernel = 4;
  c.ssm_head_dim = 16;
  c.ssm_k_heads = 2;
  c.ssm_v_heads = 4;
  c.ssm_inner = 64;
  if (arch == Arch::kQwen35) {
    c.n_ff = 96;
  } else {
    c.n_expert = 6;
    c.n_expert_used = 3;
    c.n_ff_exp = 32;
    c.n_ff_shexp = 48;
  }
  if (arch == Arch::kQwen4Exp) {
    Qwen4ExpConfig& q = c.q4;
    q.hc_count = 4;
    q.hc_lowrank = 16;
    q.indexer_heads = 2;
    q.indexer_head_dim = 8;
    q.indexer_budget = 8;
    q.compress_ratios = {0, 0, 0, 4};
    q.ple_layer = 1;
    q.ple_ngram = 3;
    q.ple_heads_per_ngram = 2;
    q.ple_conv_kernel = 4;
    q.ple_head_dim = 16;  // 4 heads of 16: ple_dim = n_embd, transformers' default
    q.ple_eos = c.n_vocab - 1;
    derive_ple_tables(c, PleHashParams{.ngram_vocab_size_base = 101, .vocab_divisible_by = 8});
  }
  return c;
}

std::vector<SynthTensor> synth_tensor_table(const SynthSpec& spec) {
  std::vector<SynthTensor> table;
  for (auto& t : plan(spec)) table.push_back(std::move(t.table));
  return table;
}

namespace {

// The GGUF v3 encoding gguf::Writer produces (src/gguf/writer.cpp), written as it goes: header,
// keys, tensor infos, then each tensor's data at its 32-byte aligned offset.
constexpr uint32_t kAlignment = 32;
constexpr uint64_t kPieceBytes = 128ull << 20;  // generated (and written) at a time

class StreamOut {
 public:
  explicit StreamOut(const std::string& path)
      : path_(path), file_(std::fopen(path.c_str(), "wb"), &std::fclose) {
    if (!file_) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  }
  void put(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, file_.get()) != n) {
      fail("{}: write failed after {} bytes: {}", path_, count_, std::strerror(errno));
    }
    count_ += n;
  }
  template <class T>
  void scalar(T v) {
    put(&v, sizeof(v));
  }
  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    put(s.data(), s.size());
  }
  void value(const Value& v) {
    using gguf::ValueType;
    switch (v.type) {
      case ValueType::UINT8:
        return scalar(static_cast<uint8_t>(std::get<uint64_t>(v.data)));
      case ValueType::INT8:
        return scalar(static_cast<int8_t>(std::get<int64_t>(v.data)));
      case ValueType::UINT16:
        return scalar(static_cast<uint16_t>(std::get<uint64_t>(v.data)));
      case ValueType::INT16:
        return scalar(static_cast<int16_t>(std::get<int64_t>(v.data)));
      case ValueType::UINT32:
        return scalar(static_cast<uint32_t>(std::get<uint64_t>(v.data)));
      case ValueType::INT32:
        return scalar(static_cast<int32_t>(std::get<int64_t>(v.data)));
      case ValueType::FLOAT32:
        return scalar(static_cast<float>(std::get<double>(v.data)));
      case ValueType::BOOL:
        return scalar(static_cast<uint8_t>(std::get<bool>(v.data)));
      case ValueType::STRING:
        return string(std::get<std::string>(v.data));
      case ValueType::UINT64:
        return scalar(std::get<uint64_t>(v.data));
      case ValueType::INT64:
        return scalar(std::get<int64_t>(v.data));
      case ValueType::FLOAT64:
        return scalar(std::get<double>(v.data));
      case ValueType::ARRAY: {
        const auto& a = v.as_array();
        scalar(static_cast<uint32_t>(a.elem_type));
        scalar<uint64_t>(a.items.size());
        for (const auto& item : a.items) {
          if (item.type != a.elem_type) fail("synth: an array item of another type than its array");
          value(item);
        }
        return;
      }
    }
  }
  void zeros(uint64_t n) {
    static const uint8_t z[256] = {};
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, sizeof(z));
      put(z, k);
      n -= k;
    }
  }
  uint64_t written() const { return count_; }
  void close() {
    if (std::fflush(file_.get()) != 0) fail("{}: write failed: {}", path_, std::strerror(errno));
  }

 private:
  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
  uint64_t count_ = 0;
};

uint64_t align_up(uint64_t v) {
  return (v + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace

void write_synthetic(const SynthSpec& spec, const std::string& path) {
  KeyList keys;
  set_model_keys(keys, spec);
  set_vocab_keys(keys, spec);
  if (spec.converter_keys) {
    keys.set("general.quantization_version", Value::u32(2));
    keys.set("general.file_type", Value::u32(spec.file_type));
  }
  const std::vector<PlannedTensor> tensors = plan(spec);

  StreamOut out(path);
  out.scalar<uint32_t>(0x46554747);  // "GGUF"
  out.scalar<uint32_t>(3);
  out.scalar<uint64_t>(tensors.size());
  out.scalar<uint64_t>(keys.kv.size());
  for (const auto& kv : keys.kv) {
    out.string(kv.key);
    out.scalar(static_cast<uint32_t>(kv.value.type));
    out.value(kv.value);
  }
  std::vector<uint64_t> offsets;
  uint64_t data_size = 0;
  for (const PlannedTensor& t : tensors) {
    const SynthTensor& tt = t.table;
    offsets.push_back(align_up(data_size));
    data_size = offsets.back() + tt.n_bytes;
    out.string(tt.name);
    out.scalar<uint32_t>(static_cast<uint32_t>(tt.ne.size()));
    for (int64_t d : tt.ne) out.scalar<uint64_t>(static_cast<uint64_t>(d));
    out.scalar(static_cast<uint32_t>(tt.type));
    out.scalar<uint64_t>(offsets.back());
  }
  out.zeros(align_up(out.written()) - out.written());
  const uint64_t data_start = out.written();

  // Pieces are generated into one buffer while the other is written.
  ThreadPool pool(spec.direct_blocks ? spec.n_threads : 1);
  std::mt19937_64 seeds(spec.seed);
  std::vector<uint8_t> buffers[2];
  int next = 0;
  std::future<void> writing;
  auto drain = [&] {
    if (writing.valid()) writing.get();
  };
  auto emit = [&](size_t n) {
    drain();
    const int b = next;
    writing =
        std::async(std::launch::async, [&out, &buffers, b, n] { out.put(buffers[b].data(), n); });
    next ^= 1;
  };
  auto buffer = [&](size_t n) -> std::span<uint8_t> {
    std::vector<uint8_t>& v = buffers[next];
    if (v.size() < n) v.resize(n);
    return {v.data(), n};
  };
  try {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const PlannedTensor& t = tensors[i];
      const SynthTensor& tt = t.table;
      drain();
      out.zeros(data_start + offsets[i] - out.written());
      const uint64_t rows = static_cast<uint64_t>(row_count(tt));
      const uint64_t row_bytes = tt.n_bytes / rows;
      if (spec.direct_blocks && has_direct_blocks(tt.type)) {
        // Seeded by name: a --layers N file holds the same first N layers as the full one.
        const uint64_t seed = mix_seed(spec.seed, name_hash(tt.name));
        const uint64_t block_bytes = traits(tt.type).block_bytes;
        const uint64_t n_blocks = tt.n_bytes / block_bytes;
        const uint64_t step = std::max<uint64_t>(1, kPieceBytes / block_bytes / kChunk) * kChunk;
        for (uint64_t b0 = 0; b0 < n_blocks; b0 += step) {
          const uint64_t nb = std::min(step, n_blocks - b0);
          fill_direct(pool, tt.type, t.scale, seed, buffer(nb * block_bytes),
                      static_cast<int64_t>(b0));
          emit(nb * block_bytes);
        }
      } else if (spec.direct_blocks) {
        const uint64_t seed = mix_seed(spec.seed, name_hash(tt.name));
        const uint64_t step =
            std::max<uint64_t>(1, kPieceBytes / row_bytes / kRowsPerChunk) * kRowsPerChunk;
        for (uint64_t r0 = 0; r0 < rows; r0 += step) {
          const uint64_t nr = std::min(step, rows - r0);
          fill_rows(pool, t, seed, buffer(nr * row_bytes), static_cast<int64_t>(r0));
          emit(nr * row_bytes);
        }
      } else {
        // One seeded stream per tensor, drawn in file order: the tiny test models stay
        // byte-identical across changes elsewhere in this file.
        std::mt19937_64 rng(seeds());
        const int64_t row = tt.ne[0];
        std::vector<float> values(static_cast<size_t>(row));
        const uint64_t step = std::max<uint64_t>(1, kPieceBytes / row_bytes);
        for (uint64_t r0 = 0; r0 < rows; r0 += step) {
          const uint64_t nr = std::min(step, rows - r0);
          std::span<uint8_t> dst = buffer(nr * row_bytes);
          for (uint64_t r = 0; r < nr; ++r) {
            for (auto& v : values) v = draw(t.init, t.scale, rng);
            quant::quantize(tt.type, values.data(), dst.data() + r * row_bytes, row, tt.name);
          }
          emit(nr * row_bytes);
        }
      }
    }
    drain();
  } catch (...) {
    if (writing.valid()) writing.wait();
    throw;
  }
  out.close();
}

}  // namespace qwenrt::model
