// Synthetic checkpoints (`qwenrt synth`): the tensor table against the official layout written
// out below (independently of src/model/synth.cpp), the metadata through our reader and Config,
// the vocabulary through our tokenizer, the statistics of directly drawn quant blocks, and the
// engine on a full-width 4-layer file.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "engine/engine.h"
#include "gguf/reader.h"
#include "model/checkpoints.h"
#include "model/config.h"
#include "model/identity.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "support/model_files.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt {
namespace {

using model::Arch;

// ---- the official layout, spelled out ---------------------------------------------------------

struct Expected {
  std::vector<int64_t> ne;
  DType type;
};
using Table = std::map<std::string, Expected>;

enum Kind { kF32, kEmbd, kOutput, kAttn, kDelta, kFfn, kExps, kShexp };

DType type_of(Kind kind, const std::string& quant) {
  if (kind == kF32) return DType::F32;
  if (quant == "Q8_0") return DType::Q8_0;
  switch (kind) {
    case kEmbd:
    case kFfn:
    case kExps:
      return DType::Q4_K;
    case kOutput:
      return DType::Q6_K;
    default:
      return DType::Q8_0;  // attention, DeltaNet, shared expert
  }
}

// SPEC.md: 27B = 64 layers, hidden 5120, 24 Q / 4 KV heads of 256, DeltaNet 16 K / 48 V heads of
// 128, FFN 17408; 35B-A3B = 40 layers, hidden 2048, 16 / 2 heads, DeltaNet 16 / 32 heads, 256
// experts of 512 and a shared expert of 512. Vocabulary 248320 rows.
Table official_table(bool moe, const std::string& quant, int n_layer, bool mtp = false) {
  Table t;
  auto add = [&](const std::string& name, std::vector<int64_t> ne, Kind kind) {
    t[name] = {std::move(ne), type_of(kind, quant)};
  };
  const int64_t e = moe ? 2048 : 5120;
  const int64_t q_heads = moe ? 16 : 24, kv_heads = moe ? 2 : 4, v_heads = moe ? 32 : 48;
  const int64_t qkv = 2 * 16 * 128 + v_heads * 128;
  add("token_embd.weight", {e, 248320}, kEmbd);
  add("output.weight", {e, 248320}, kOutput);
  add("output_norm.weight", {e}, kF32);
  for (int il = 0; il < n_layer + (mtp ? 1 : 0); ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    add(p + "attn_norm.weight", {e}, kF32);
    add(p + "post_attention_norm.weight", {e}, kF32);
    if (il == n_layer) {  // the MTP block: full attention, the trunk's FFN, the nextn tensors
      add(p + "nextn.eh_proj.weight", {2 * e, e}, kAttn);
      add(p + "nextn.enorm.weight", {e}, kF32);
      add(p + "nextn.hnorm.weight", {e}, kF32);
      add(p + "nextn.shared_head_norm.weight", {e}, kF32);
    }
    if ((il + 1) % 4 == 0 || il == n_layer) {
      add(p + "attn_q.weight", {e, 2 * q_heads * 256}, kAttn);
      add(p + "attn_k.weight", {e, kv_heads * 256}, kAttn);
      add(p + "attn_v.weight", {e, kv_heads * 256}, kAttn);
      add(p + "attn_output.weight", {q_heads * 256, e}, kAttn);
      add(p + "attn_q_norm.weight", {256}, kF32);
      add(p + "attn_k_norm.weight", {256}, kF32);
    } else {
      add(p + "attn_qkv.weight", {e, qkv}, kDelta);
      add(p + "attn_gate.weight", {e, v_heads * 128}, kDelta);
      add(p + "ssm_conv1d.weight", {4, qkv}, kF32);
      add(p + "ssm_dt.bias", {v_heads}, kF32);
      add(p + "ssm_a", {v_heads}, kF32);
      add(p + "ssm_beta.weight", {e, v_heads}, kDelta);
      add(p + "ssm_alpha.weight", {e, v_heads}, kDelta);
      add(p + "ssm_norm.weight", {128}, kF32);
      add(p + "ssm_out.weight", {v_heads * 128, e}, kDelta);
    }
    if (moe) {
      add(p + "ffn_gate_inp.weight", {e, 256}, kF32);
      add(p + "ffn_gate_exps.weight", {e, 512, 256}, kExps);
      add(p + "ffn_up_exps.weight", {e, 512, 256}, kExps);
      add(p + "ffn_down_exps.weight", {512, e, 256}, kExps);
      add(p + "ffn_gate_inp_shexp.weight", {e}, kF32);
      add(p + "ffn_gate_shexp.weight", {e, 512}, kShexp);
      add(p + "ffn_up_shexp.weight", {e, 512}, kShexp);
      add(p + "ffn_down_shexp.weight", {512, e}, kShexp);
    } else {
      add(p + "ffn_gate.weight", {e, 17408}, kFfn);
      add(p + "ffn_up.weight", {e, 17408}, kFfn);
      add(p + "ffn_down.weight", {17408, e}, kFfn);
    }
  }
  return t;
}

std::string shape(const std::vector<int64_t>& ne) {
  std::string s;
  for (int64_t d : ne) s += (s.empty() ? "" : ",") + std::to_string(d);
  return "[" + s + "]";
}

void expect_table(const std::vector<model::SynthTensor>& actual, const Table& want) {
  EXPECT_EQ(actual.size(), want.size());
  for (const auto& t : actual) {
    auto it = want.find(t.name);
    if (it == want.end()) {
      ADD_FAILURE() << "unexpected tensor " << t.name;
      continue;
    }
    EXPECT_EQ(shape(t.ne), shape(it->second.ne)) << t.name;
    EXPECT_EQ(dtype_name(t.type), dtype_name(it->second.type)) << t.name;
  }
}

struct Like {
  const char* name;
  bool moe;
};
constexpr std::array<Like, 3> kLikes = {
    {{"Qwen3.6-27B", false}, {"Qwen3.6-35B-A3B", true}, {"Qwen3.8-27B", false}}};

TEST(SynthTable, FullSizeTablesMatchTheOfficialLayout) {
  for (const Like& like : kLikes) {
    for (const std::string quant : {"Q4_K_M", "Q8_0"}) {
      SCOPED_TRACE(std::string(like.name) + " " + quant);
      const auto spec = model::synth_spec_like(like.name, quant);
      EXPECT_EQ(spec.config.n_layer, like.moe ? 40 : 64);
      expect_table(model::synth_tensor_table(spec),
                   official_table(like.moe, quant, spec.config.n_layer));
    }
  }
}

TEST(SynthTable, MtpAddsOneNextnBlock) {
  for (const Like& like : kLikes) {
    SCOPED_TRACE(like.name);
    const auto spec = model::synth_spec_like(like.name, "Q4_K_M", 0, /*mtp=*/true);
    EXPECT_EQ(spec.config.n_layer_nextn, 1);
    expect_table(model::synth_tensor_table(spec),
                 official_table(like.moe, "Q4_K_M", spec.config.n_layer, /*mtp=*/true));
  }
}

TEST(SynthTable, SizesAreThoseOfTheOfficialFiles) {
  // SPEC.md: 27B Q4_K_M 19.1 GB, 35B-A3B Q4_K_M 20.4 GB (weights; metadata adds ~5 MB).
  for (const auto& [name, gb] : {std::pair{"Qwen3.6-27B", 19.1}, {"Qwen3.6-35B-A3B", 20.4}}) {
    uint64_t bytes = 0;
    for (const auto& t : model::synth_tensor_table(model::synth_spec_like(name, "Q4_K_M")))
      bytes += t.n_bytes;
    EXPECT_NEAR(bytes / 1e9, gb, 0.06) << name;
  }
}

TEST(SynthTable, LayersKeepTheAttentionInterval) {
  const auto spec = model::synth_spec_like("Qwen3.6-35B-A3B", "Q4_K_M", 6);
  expect_table(model::synth_tensor_table(spec), official_table(true, "Q4_K_M", 6));
  EXPECT_THROW(model::synth_spec_like("Qwen3.6-35B-A3B", "Q4_K_M", 41), Error);
  EXPECT_THROW(model::synth_spec_like("Qwen3.6", "Q4_K_M"), Error);
  EXPECT_THROW(model::synth_spec_like("Qwen3.6-27B", "Q5_K_M"), Error);
}

// ---- vocabulary --------------------------------------------------------------------------------

std::string write_vocab_only(const model::SynthTokenizer& tok, const std::string& name) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("qwen35"));
  model::set_tokenizer_keys(w, tok);
  const std::string path = testing_support::temp_path(name);
  w.write(path);
  return path;
}

TEST(SynthVocab, FullVocabularyHasTheRealAddedTokensAndLoads) {
  const auto tok = model::synthetic_tokenizer(248320, 1);
  ASSERT_EQ(tok.tokens.size(), 248320u);
  ASSERT_EQ(tok.types.size(), 248320u);
  EXPECT_EQ(tok.merges.size(), 248044u - 256u);
  const std::map<int, std::pair<std::string, int>> real = {
      {248044, {"<|endoftext|>", 3}},   {248045, {"<|im_start|>", 3}},
      {248046, {"<|im_end|>", 3}},      {248058, {"<tool_call>", 4}},
      {248059, {"</tool_call>", 4}},    {248060, {"<|fim_prefix|>", 3}},
      {248066, {"<tool_response>", 4}}, {248067, {"</tool_response>", 4}},
      {248068, {"<think>", 4}},         {248069, {"</think>", 4}},
      {248076, {"<|audio_pad|>", 3}},   {248077, {"[PAD248077]", 5}},
      {248319, {"[PAD248319]", 5}}};
  for (const auto& [id, want] : real) {
    EXPECT_EQ(tok.tokens[id], want.first) << id;
    EXPECT_EQ(tok.types[id], want.second) << id;
  }
  EXPECT_EQ(tok.eos_id, 248046);
  EXPECT_EQ(tok.padding_id, 248044);
  EXPECT_EQ(tok.types[248043], 1);

  const std::string path = write_vocab_only(tok, "synth_vocab_full.gguf");
  const auto file = gguf::File::open(path).value();
  const auto t = tokenizer::Tokenizer::from_gguf(file);
  EXPECT_EQ(t.n_vocab(), 248320);
  EXPECT_EQ(t.token_id("<|im_end|>"), 248046);
  EXPECT_EQ(t.token_id("<think>"), 248068);
  const std::string text =
      "The quick brown fox jumps over 13 lazy dogs.\nHello, world! \xC3\xA9t\xC3\xA9";
  const auto ids = t.encode(text, false);
  EXPECT_LT(ids.size(), text.size());  // merges fire on word-like text
  EXPECT_EQ(t.decode(ids), text);
  const auto chat = t.encode("<|im_start|>user\nHi<|im_end|>", true);
  ASSERT_GE(chat.size(), 3u);
  EXPECT_EQ(chat.front(), 248045);
  EXPECT_EQ(chat.back(), 248046);
}

TEST(SynthVocab, SmallVocabularyPutsAddedTokensLast) {
  const auto tok = model::synthetic_tokenizer(1000, 3);
  ASSERT_EQ(tok.tokens.size(), 1000u);
  EXPECT_EQ(tok.tokens[1000 - 33], "<|endoftext|>");
  EXPECT_EQ(tok.tokens[999], "<|audio_pad|>");
  EXPECT_EQ(tok.eos_id, 1000 - 33 + 2);
  const auto file = gguf::File::open(write_vocab_only(tok, "synth_vocab_small.gguf")).value();
  EXPECT_EQ(tokenizer::Tokenizer::from_gguf(file).n_vocab(), 1000);
  EXPECT_THROW(model::synthetic_tokenizer(200, 1), Error);
}

model::SynthSpec direct_spec(Arch arch);

TEST(SynthVocab, VocabFromCopiesAnotherFilesTokenizer) {
  const auto tok = model::synthetic_tokenizer(1000, 9);
  const std::string vocab = write_vocab_only(tok, "synth_vocab_from.gguf");
  model::SynthSpec spec = direct_spec(Arch::kQwen35);
  spec.config.n_vocab = 1000;
  spec.vocab_from = vocab;
  spec.chat_template = "{{ messages }}";
  const std::string path = testing_support::temp_path("synth_vocab_from_model.gguf");
  model::write_synthetic(spec, path);
  const auto file = gguf::File::open(path).value();
  const gguf::Array* tokens = file.get_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->items.size(), 1000u);
  EXPECT_EQ(tokens->items[500].as_string(), tok.tokens[500]);
  EXPECT_EQ(file.get_string("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ(tokenizer::Tokenizer::from_gguf(file).token_id("<|im_end|>"), tok.eos_id);

  spec.config.n_vocab = 512;  // the vocabulary must cover the embedding rows exactly
  EXPECT_THROW(model::write_synthetic(spec, path), Error);
}

// ---- direct quant blocks -----------------------------------------------------------------------

// A small config whose widths suit every type (K-quant rows are multiples of 256).
model::Config small_config(Arch arch) {
  model::Config c = model::tiny_config(arch);
  c.n_embd = 256;
  c.n_vocab = 512;
  c.head_dim = 64;
  c.n_rot = 16;
  c.rope_sections = {3, 3, 2, 0};
  c.ssm_head_dim = 64;
  c.ssm_inner = c.ssm_v_heads * 64;
  c.n_ff = 512;
  c.n_ff_exp = 256;
  c.n_ff_shexp = 256;
  return c;
}

model::SynthSpec direct_spec(Arch arch) {
  model::SynthSpec spec;
  spec.config = small_config(arch);
  spec.mix = model::QuantMix::q4_k_m();
  spec.direct_blocks = true;
  spec.vocab = model::SynthVocab::kSynthetic;
  spec.seed = 5;
  return spec;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::vector<uint8_t> out(std::filesystem::file_size(path));
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_EQ(std::fread(out.data(), 1, out.size(), f), out.size());
  std::fclose(f);
  return out;
}

TEST(SynthBlocks, DirectBlocksGiveZeroMeanFanInScaledWeights) {
  for (const DType type : {DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    model::SynthSpec spec = direct_spec(Arch::kQwen35);
    spec.mix = model::QuantMix::uniform(type);
    const std::string path = testing_support::temp_path("synth_stats.gguf");
    model::write_synthetic(spec, path);
    const auto file = gguf::File::open(path).value();
    for (const char* name : {"blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "output.weight"}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + name);
      const gguf::TensorInfo* t = file.find_tensor(name);
      ASSERT_NE(t, nullptr);
      ASSERT_EQ(t->dtype, type);
      std::vector<float> v(t->n_elements());
      quant::dequantize(t->dtype, t->data, v.data(), static_cast<int64_t>(v.size()), name);
      double sum = 0, sum2 = 0;
      for (float x : v) {
        ASSERT_TRUE(std::isfinite(x));
        sum += x;
        sum2 += double(x) * x;
      }
      const double mean = sum / v.size(), sd = std::sqrt(sum2 / v.size() - mean * mean);
      const double want = 1.0 / std::sqrt(double(t->ne[0]));
      EXPECT_NEAR(sd / want, 1.0, 0.05);
      EXPECT_LT(std::abs(mean), 0.05 * want);
    }
  }
}

TEST(SynthBlocks, BytesDependOnSeedAndNamesOnly) {
  model::SynthSpec spec = direct_spec(Arch::kQwen35Moe);
  const std::string a = testing_support::temp_path("synth_det_a.gguf");
  const std::string b = testing_support::temp_path("synth_det_b.gguf");
  spec.n_threads = 1;
  model::write_synthetic(spec, a);
  spec.n_threads = 3;
  model::write_synthetic(spec, b);
  EXPECT_EQ(file_bytes(a), file_bytes(b));

  // Fewer layers: the same bytes for every tensor both files hold.
  model::SynthSpec half = spec;
  half.config.n_layer = 2;
  const std::string c = testing_support::temp_path("synth_det_c.gguf");
  model::write_synthetic(half, c);
  const auto full = gguf::File::open(a).value();
  const auto part = gguf::File::open(c).value();
  EXPECT_LT(part.tensors().size(), full.tensors().size());
  for (const auto& t : part.tensors()) {
    const gguf::TensorInfo* u = full.find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(u->n_bytes, t.n_bytes);
    EXPECT_EQ(std::memcmp(u->data, t.data, t.n_bytes), 0) << t.name;
  }
}

TEST(SynthBlocks, SmallDirectModelsRunFinite) {
  for (const Arch arch : {Arch::kQwen35, Arch::kQwen35Moe}) {
    const std::string path = testing_support::temp_path("synth_small_run.gguf");
    model::write_synthetic(direct_spec(arch), path);
    auto e = engine::Engine::load(path);
    engine::Batch b;
    for (int i = 0; i < 24; ++i) b.add(0, (i * 37) % 479, i, true);
    const auto logits = e->step(b);
    ASSERT_EQ(logits.size(), 24u * 512u);
    double spread = 0;
    for (float v : logits) {
      ASSERT_TRUE(std::isfinite(v));
      spread += std::abs(v - logits[0]);
    }
    EXPECT_GT(spread / logits.size(), 0.1);
  }
}

TEST(SynthBlocks, FullDepthStaysFinite) {
  // The checkpoints' depths at a small width: fan-in scaled blocks keep every layer's output,
  // and so the logits after the final norm, finite and of unit scale.
  for (const Arch arch : {Arch::kQwen35, Arch::kQwen35Moe}) {
    model::SynthSpec spec = direct_spec(arch);
    spec.config.n_layer = arch == Arch::kQwen35 ? 64 : 40;
    const std::string path = testing_support::temp_path("synth_deep.gguf");
    model::write_synthetic(spec, path);
    auto e = engine::Engine::load(path);
    engine::Batch b;
    for (int i = 0; i < 8; ++i) b.add(0, (i * 61) % 479, i, true);
    const auto logits = e->step(b);
    double sum = 0, sum2 = 0;
    for (float v : logits) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum2 += double(v) * v;
    }
    const double mean = sum / logits.size();
    const double sd = std::sqrt(sum2 / logits.size() - mean * mean);
    EXPECT_GT(sd, 0.5);
    EXPECT_LT(sd, 2.0);
  }
}

TEST(SynthBlocks, MtpBlockLoadsAndDrafts) {
  for (const Arch arch : {Arch::kQwen35, Arch::kQwen35Moe}) {
    model::SynthSpec spec = direct_spec(arch);
    spec.config.n_layer_nextn = 1;
    spec.converter_keys = true;
    const std::string path = testing_support::temp_path("synth_mtp.gguf");
    model::write_synthetic(spec, path);
    auto e = engine::Engine::load(path);
    EXPECT_EQ(e->config().n_layer, 4);
    EXPECT_EQ(e->config().n_layer_nextn, 1);
    ASSERT_TRUE(e->has_mtp());
    const std::vector<int32_t> ids = {5, 77, 300, 41};
    engine::Batch b;
    for (int i = 0; i < 4; ++i) b.add(0, ids[i], i, true);
    const auto out = e->step_with_hidden(b);
    engine::MtpBatch m;
    const int E = e->config().n_embd;
    for (int i = 0; i < 3; ++i) {
      m.slots.push_back(0);
      m.tokens.push_back(ids[i + 1]);
      m.positions.push_back(i);
      m.hidden.insert(m.hidden.end(), out.hidden.begin() + i * E, out.hidden.begin() + (i + 1) * E);
    }
    const auto drafts = e->mtp_step(m);
    ASSERT_EQ(drafts.size(), 3u * 512u);
    for (float v : drafts) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(SynthCli, UnknownCheckpointOrQuantIsAnError) {
  for (const std::string& args : {std::string("--like Qwen3.6 --out /dev/null"),
                                  std::string("--like Qwen3.6-27B --quant Q5_K_M --out /dev/null"),
                                  std::string("--like Qwen3.6-27B --layers 65 --out /dev/null")}) {
    const std::string cmd = std::string(QWENRT_BINARY) + " synth " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    std::array<char, 512> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int status = pclose(p);
    EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1) << args << ": " << out;
    EXPECT_NE(out.find("qwenrt: error: "), std::string::npos) << out;
  }
}

// ---- a full-width file through the reader, Config, identity, tokenizer and engine --------------

void check_full_width_file(const char* like, bool moe) {
  const auto spec = model::synth_spec_like(like, "Q4_K_M", 4);
  const std::string path = testing_support::temp_path(std::string("synth_") + like + ".gguf");
  model::write_synthetic(spec, path);
  {
    const auto file = gguf::File::open(path).value();
    const auto config = model::Config::from_gguf(file);
    EXPECT_EQ(config.n_layer, 4);
    EXPECT_EQ(config.n_vocab, 248320);
    EXPECT_EQ(config.n_embd, moe ? 2048 : 5120);
    EXPECT_EQ(config.n_ctx_train, 262144);
    EXPECT_EQ(config.n_rot, 64);
    EXPECT_EQ(config.rope_sections, (std::array<int, 4>{11, 11, 10, 0}));
    EXPECT_EQ(model::identify(file).name, like);
    EXPECT_EQ(file.get_string("general.size_label"), moe ? "35B-A3B" : "27B");
    EXPECT_EQ(file.get_int("general.file_type"), 15);
    std::vector<model::SynthTensor> table;
    for (const auto& t : file.tensors()) {
      table.push_back(
          {t.name, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.dtype, 0});
    }
    expect_table(table, official_table(moe, "Q4_K_M", 4));
    const auto tok = tokenizer::Tokenizer::from_gguf(file);
    EXPECT_EQ(tok.token_id("<|im_start|>"), 248045);
  }
  engine::EngineOptions o;
  o.n_ctx = 16;
  auto e = engine::Engine::load(path, o);
  engine::Batch b;
  for (int i = 0; i < 3; ++i) b.add(0, 1000 + 7919 * i, i, true);
  const auto logits = e->step(b);
  ASSERT_EQ(logits.size(), 3u * 248320u);
  double spread = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    spread += std::abs(v - logits[0]);
  }
  EXPECT_GT(spread / logits.size(), 0.1);
  std::filesystem::remove(path);
}

TEST(SynthFile, FullWidth35BA3BFourLayersLoadsAndRuns) {
  check_full_width_file("Qwen3.6-35B-A3B", true);
}
TEST(SynthFile, FullWidth27BFourLayersLoadsAndRuns) {
  check_full_width_file("Qwen3.6-27B", false);
}

}  // namespace
}  // namespace qwenrt
