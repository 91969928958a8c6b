#include "model/synth.h"

#include <cmath>
#include <cstring>
#include <random>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/checkpoints.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace qwenrt::model {
namespace {

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
  add("token_embd.weight", {e, c.n_vocab}, mix.embedding, Init::kMatrix, 1.0f);
  f32("output_norm.weight", {e}, Init::kNorm);
  if (!spec.tied_output) matrix("output.weight", {e, c.n_vocab}, mix.output);
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
  for (int il = 0; il < c.n_layer; ++il) {
    f32(blk(il, "attn_norm.weight"), {e}, Init::kNorm);
    f32(blk(il, "post_attention_norm.weight"), {e}, Init::kNorm);
    if (c.is_attention_layer(il)) {
      attention(il);
    } else {
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

// ---- direct quantized blocks -----------------------------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0x9e3779b97f4a7c15ull);
  return splitmix64(s);
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// xoshiro256**: fast enough that drawing 20 GB of quants is bounded by the disk.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) {
    for (auto& s : s_) s = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Mean of v^2 for v uniform over the integers lo..hi.
constexpr double mean_square(int lo, int hi) {
  double sum = 0;
  for (int v = lo; v <= hi; ++v) sum += double(v) * v;
  return sum / (hi - lo + 1);
}

// Q8_0: quants uniform over -127..127 (-128 is folded onto 0, so the mean is exactly 0):
// E[q^2] = 2 * sum(k^2, k = 1..127) / 256.
constexpr double kQ8QuantStd = 73.4677;  // sqrt(5397.5)
// Q4_K: quants uniform over 0..15 (std sqrt(255/12)), each sub-block's min equal to its scale
// and dmin = 7.5 d, so x = d * sc * (q - 7.5): zero mean. Sub-block scales uniform over 8..39.
constexpr int kQ4ScaleLo = 8, kQ4ScaleHi = 39;
const double kQ4QuantStd = std::sqrt(255.0 / 12.0);
// Q6_K: quants uniform over 0..63, x = d * sc * (q - 32): E[(q - 32)^2] = 4095/12 + 1/4. The
// -1/2 bias cancels over sub-blocks because the scales get random signs; |sc| uniform over 4..11.
constexpr int kQ6ScaleLo = 4, kQ6ScaleHi = 11;
const double kQ6QuantStd = std::sqrt(4095.0 / 12.0 + 0.25);

void fill_q8_0(FastRng& rng, uint16_t d, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ8_0 b;
  b.d = d;
  for (int64_t i = 0; i < n_blocks; ++i) {
    for (int w = 0; w < 4; ++w) {
      const uint64_t r = rng.next();
      for (int k = 0; k < 8; ++k) {
        const auto q = static_cast<int8_t>(static_cast<uint8_t>(r >> (8 * k)));
        b.qs[w * 8 + k] = q == -128 ? 0 : q;
      }
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void fill_q4_k(FastRng& rng, uint16_t d, uint16_t dmin, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ4_K b;
  b.d = d;
  b.dmin = dmin;
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t sc[8];
    const uint64_t r = rng.next();
    for (int j = 0; j < 8; ++j) sc[j] = static_cast<uint8_t>(kQ4ScaleLo + ((r >> (5 * j)) & 31));
    // The min of each sub-block equals its scale. Packing inverts ggml's get_scale_min_k4: six
    // bits each; sub-blocks 4..7 keep their low nibbles in bytes 8..11 and their top two bits in
    // the top bits of bytes 0..7.
    for (int j = 0; j < 4; ++j) {
      b.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      b.scales[j + 4] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((sc[j + 4] & 15) << 4));
    }
    for (int w = 0; w < 16; ++w) {
      const uint64_t q = rng.next();
      std::memcpy(b.qs + 8 * w, &q, 8);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void fill_q6_k(FastRng& rng, uint16_t d, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ6_K b;
  b.d = d;
  for (int64_t i = 0; i < n_blocks; ++i) {
    for (int w = 0; w < 16; ++w) {
      const uint64_t q = rng.next();
      std::memcpy(b.ql + 8 * w, &q, 8);
    }
    for (int w = 0; w < 8; ++w) {
      const uint64_t q = rng.next();
      std::memcpy(b.qh + 8 * w, &q, 8);
    }
    const uint64_t r = rng.next();
    for (int j = 0; j < 16; ++j) {
      const int magnitude = kQ6ScaleLo + static_cast<int>((r >> (4 * j)) & 7);
      const bool negative = (r >> (64 - 16 + j)) & 1;
      b.scales[j] = static_cast<int8_t>(negative ? -magnitude : magnitude);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

int64_t row_count(const SynthTensor& t) {
  int64_t rows = 1;
  for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
  return rows;
}

bool has_direct_blocks(DType type) {
  return type == DType::Q8_0 || type == DType::Q4_K || type == DType::Q6_K;
}

// Fills a matrix of N(0, sigma^2)-like values in chunks of blocks, each chunk from its own seed
// (so the bytes do not depend on the thread count).
void fill_direct(ThreadPool& pool, DType type, float sigma, uint64_t seed, std::span<uint8_t> dst) {
  const auto& tr = traits(type);
  const int64_t n_blocks = static_cast<int64_t>(dst.size() / tr.block_bytes);
  constexpr int64_t kChunk = 1024;
  const int64_t n_chunks = (n_blocks + kChunk - 1) / kChunk;
  uint16_t d = 0, dmin = 0;
  if (type == DType::Q8_0) {
    d = quant::fp32_to_fp16(static_cast<float>(sigma / kQ8QuantStd));
  } else if (type == DType::Q4_K) {
    const double rms = std::sqrt(mean_square(kQ4ScaleLo, kQ4ScaleHi));
    d = quant::fp32_to_fp16(static_cast<float>(sigma / (kQ4QuantStd * rms)));
    dmin = quant::fp32_to_fp16(7.5f * quant::fp16_to_fp32(d));
  } else {
    const double rms = std::sqrt(mean_square(kQ6ScaleLo, kQ6ScaleHi));
    d = quant::fp32_to_fp16(static_cast<float>(sigma / (kQ6QuantStd * rms)));
  }
  if (!std::isfinite(quant::fp16_to_fp32(d)) || quant::fp16_to_fp32(d) == 0.0f) {
    fail("synth: scale {} gives no finite f16 block scale for {}", sigma, tr.name);
  }
  pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      FastRng rng(mix_seed(seed, static_cast<uint64_t>(c)));
      const int64_t b0 = c * kChunk, nb = std::min(kChunk, n_blocks - b0);
      uint8_t* out = dst.data() + b0 * tr.block_bytes;
      if (type == DType::Q8_0) {
        fill_q8_0(rng, d, out, nb);
      } else if (type == DType::Q4_K) {
        fill_q4_k(rng, d, dmin, out, nb);
      } else {
        fill_q6_k(rng, d, out, nb);
      }
    }
  });
}

// Floats through the reference quantizer, rows in parallel chunks (types without a direct path).
void fill_rows(ThreadPool& pool, const PlannedTensor& t, uint64_t seed, std::span<uint8_t> dst) {
  const int64_t row = t.table.ne[0];
  const int64_t rows = row_count(t.table);
  const size_t row_bytes = dst.size() / static_cast<size_t>(rows);
  constexpr int64_t kRowsPerChunk = 64;
  const int64_t n_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
    std::vector<float> values(static_cast<size_t>(row));
    for (int64_t c = c0; c < c1; ++c) {
      std::mt19937_64 rng(mix_seed(seed, static_cast<uint64_t>(c)));
      for (int64_t r = c * kRowsPerChunk; r < std::min(rows, (c + 1) * kRowsPerChunk); ++r) {
        for (auto& v : values) v = draw(t.init, t.scale, rng);
        quant::quantize(t.table.type, values.data(), dst.data() + r * row_bytes, row, t.table.name);
      }
    }
  });
}

// ---- metadata ----------------------------------------------------------------------------------

void set_model_keys(gguf::Writer& w, const SynthSpec& spec) {
  const Config& c = spec.config;
  const std::string a = c.arch_name;
  auto u32 = [&](const char* key, int64_t v) {
    w.set(a + "." + key, Value::u32(static_cast<uint32_t>(v)));
  };
  // The converter's key order (tests/fixtures/models/*.gguf).
  w.set("general.architecture", Value::str(a));
  if (spec.converter_keys) w.set("general.type", Value::str("model"));
  w.set("general.name", Value::str(spec.name));
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
}

void set_vocab_keys(gguf::Writer& w, const SynthSpec& spec) {
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
    set_tokenizer_keys(w, synthetic_tokenizer(n_vocab, spec.seed));
  }
  if (!spec.chat_template.empty()) {
    w.set("tokenizer.chat_template", Value::str(spec.chat_template));
  }
}

// Qwen3.5's added tokens, in id order from 248044 (tools/tokenizer/qwen_vocab.py has the same
// list, from the released tokenizer). Indexes 14..25 are not special in HF's tokenizer.json;
// llama.cpp's converter still marks the <|...|> ones control, the others user-defined.
constexpr const char* kAddedTokens[] = {
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
};
constexpr int kNumAdded = static_cast<int>(std::size(kAddedTokens));
constexpr int kRealVocabRows = 248320;
constexpr int kRealNormalTokens = 248044;

}  // namespace

QuantMix QuantMix::uniform(DType type) {
  return {type, type, type, type, type, type, type};
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
  return m;
}

SynthTokenizer synthetic_tokenizer(int n_vocab, uint64_t seed) {
  if (n_vocab < 256 + kNumAdded) {
    fail("synth: a tokenizer needs at least {} vocabulary rows, got {}", 256 + kNumAdded, n_vocab);
  }
  const int n_normal = n_vocab == kRealVocabRows ? kRealNormalTokens : n_vocab - kNumAdded;
  SynthTokenizer tok;
  tok.tokens.reserve(n_vocab);
  tok.types.reserve(n_vocab);
  tok.merges.reserve(n_normal - 256);
  auto spell = [](uint8_t byte) {
    std::string s;
    tokenizer::append_utf8(tokenizer::byte_level::kByteToCodepoint[byte], s);
    return s;
  };
  // Byte tokens in GPT-2's order: the printable bytes, then the rest, each in byte order.
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      if (tokenizer::byte_level::is_printable(b) == (pass == 0)) {
        tok.tokens.push_back(spell(static_cast<uint8_t>(b)));
      }
    }
  }
  // Merges over a word-like alphabet (letters, digits, a few marks, with or without a leading
  // space), biased towards early tokens as real merge lists are; no space inside a token, so
  // every merge can fire under the qwen35 pre-tokenizer. Text outside the alphabet stays bytes.
  std::unordered_set<std::string> seen(tok.tokens.begin(), tok.tokens.end());
  std::vector<int32_t> word_start, word_rest;  // ids that may start / continue a token
  const std::string space = spell(' ');
  for (int id = 0; id < 256; ++id) {
    const std::string& t = tok.tokens[id];
    const bool alnum = t.size() == 1 && std::isalnum(static_cast<unsigned char>(t[0]));
    if (alnum || t == "'" || t == "-" || t == ".") word_rest.push_back(id);
    if (alnum || t == space) word_start.push_back(id);
  }
  std::mt19937_64 rng(seed ^ 0x746f6b656e697a65ull);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto pick = [&](const std::vector<int32_t>& from) {
    const double u = unit(rng);
    return from[static_cast<size_t>(u * u * u * static_cast<double>(from.size()))];
  };
  while (static_cast<int>(tok.tokens.size()) < n_normal) {
    const int32_t left = pick(word_start), right = pick(word_rest);
    std::string merged = tok.tokens[left] + tok.tokens[right];
    if (merged.size() > 24 || !seen.insert(merged).second) continue;
    tok.merges.push_back(tok.tokens[left] + " " + tok.tokens[right]);
    const auto id = static_cast<int32_t>(tok.tokens.size());
    tok.tokens.push_back(std::move(merged));
    word_start.push_back(id);
    if (tok.tokens[id].rfind(space, 0) != 0) word_rest.push_back(id);
  }
  tok.types.assign(tok.tokens.size(), 1);
  for (int i = 0; i < kNumAdded; ++i) {
    const std::string text = kAddedTokens[i];
    const bool user_defined = i >= 14 && i <= 25 && text.rfind("<|", 0) != 0;
    tok.tokens.push_back(text);
    tok.types.push_back(user_defined ? 4 : 3);
  }
  tok.padding_id = n_normal;  // <|endoftext|>
  tok.eos_id = n_normal + 2;  // <|im_end|>, the only end-of-generation token the files name
  while (static_cast<int>(tok.tokens.size()) < n_vocab) {
    tok.tokens.push_back(fmt::format("[PAD{}]", tok.tokens.size()));
    tok.types.push_back(5);
  }
  return tok;
}

void set_tokenizer_keys(gguf::Writer& w, const SynthTokenizer& tok) {
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

SynthSpec synth_spec_like(const std::string& checkpoint, const std::string& quant, int layers,
                          bool mtp) {
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
  spec.config.n_layer_nextn = mtp ? 1 : 0;
  return spec;
}

Config tiny_config(Arch arch) {
  Config c;
  c.arch = arch;
  c.arch_name = arch == Arch::kQwen35 ? "qwen35" : "qwen35moe";
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
  return c;
}

std::vector<SynthTensor> synth_tensor_table(const SynthSpec& spec) {
  std::vector<SynthTensor> table;
  for (auto& t : plan(spec)) table.push_back(std::move(t.table));
  return table;
}

void write_synthetic(const SynthSpec& spec, const std::string& path) {
  gguf::Writer w;
  set_model_keys(w, spec);
  set_vocab_keys(w, spec);
  if (spec.converter_keys) {
    w.set("general.quantization_version", Value::u32(2));
    w.set("general.file_type", Value::u32(spec.file_type));
  }

  const std::vector<PlannedTensor> tensors = plan(spec);
  ThreadPool pool(spec.direct_blocks ? spec.n_threads : 1);
  std::mt19937_64 seeds(spec.seed);
  for (const PlannedTensor& t : tensors) {
    const SynthTensor& tt = t.table;
    gguf::Writer::Fill fill;
    if (spec.direct_blocks) {
      // Seeded by name: a --layers N file holds the same first N layers as the full one.
      const uint64_t seed = mix_seed(spec.seed, name_hash(tt.name));
      if (has_direct_blocks(tt.type)) {
        fill = [&pool, &t, seed](std::span<uint8_t> dst) {
          fill_direct(pool, t.table.type, t.scale, seed, dst);
        };
      } else {
        fill = [&pool, &t, seed](std::span<uint8_t> dst) { fill_rows(pool, t, seed, dst); };
      }
    } else {
      // One seeded stream per tensor, drawn in file order: the tiny test models stay
      // byte-identical across changes elsewhere in this file.
      const uint64_t seed = seeds();
      fill = [&t, seed](std::span<uint8_t> dst) {
        std::mt19937_64 rng(seed);
        const int64_t row = t.table.ne[0], rows = row_count(t.table);
        std::vector<float> values(static_cast<size_t>(row));
        const size_t row_bytes = dst.size() / static_cast<size_t>(rows);
        for (int64_t r = 0; r < rows; ++r) {
          for (auto& v : values) v = draw(t.init, t.scale, rng);
          quant::quantize(t.table.type, values.data(), dst.data() + r * row_bytes, row,
                          t.table.name);
        }
      };
    }
    w.add_tensor(tt.name, tt.type, tt.ne, std::move(fill));
  }
  w.write(path);
}

}  // namespace qwenrt::model
