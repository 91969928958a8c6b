// Synthetic Qwen3.8-Flash-Next (qwen4exp) files: the PLE hash constants against values computed
// with transformers' own functions (modeling_qwen4_exp.py: _splitmix64, _build_layer_multipliers,
// _find_nth_prime_after, Qwen4ExpTextNGramEmbedding.__init__, run in Python 3), the tensor table
// and metadata of `qwenrt synth --like Qwen3.8-Flash-Next`, the streamed writer against
// gguf::Writer, and tiny / small / full-width files through the engine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "engine/engine.h"
#include "gguf/reader.h"
#include "model/checkpoints.h"
#include "model/config.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

using model::Arch;

// ---- PLE hash constants ---------------------------------------------------------------------

TEST(SynthQwen4ExpPle, Splitmix64AndPrimesMatchTransformers) {
  EXPECT_EQ(model::ple_splitmix64(0), 16294208416658607535ull);
  EXPECT_EQ(model::ple_splitmix64(1234), 13478418381427711195ull);
  EXPECT_EQ(model::ple_splitmix64(~0ull), 16490336266968443936ull);
  EXPECT_EQ(model::ple_find_nth_prime_after(19'999'999, 1), 20'000'003);
  EXPECT_EQ(model::ple_find_nth_prime_after(19'999'999, 16), 20'000'171);
  EXPECT_EQ(model::ple_find_nth_prime_after(1, 1), 2);
  EXPECT_EQ(model::ple_find_nth_prime_after(2, 3), 7);
  EXPECT_EQ(model::ple_find_nth_prime_after(100, 1), 101);
}

TEST(SynthQwen4ExpPle, MultipliersMatchTransformers) {
  // _build_layer_multipliers(vocab, ngram_size, ple_layer_index, seed)
  EXPECT_EQ(model::ple_layer_multipliers(248320, 3, 0, 1234),
            (std::vector<uint64_t>{23703573157769ull, 20109073645365ull, 8052911324071ull}));
  EXPECT_EQ(model::ple_layer_multipliers(248320, 3, 1, 1234),
            (std::vector<uint64_t>{3352040966061ull, 19752442147475ull, 10742103100073ull}));
  EXPECT_EQ(
      model::ple_layer_multipliers(96, 3, 0, 1234),
      (std::vector<uint64_t>{64343153921368269ull, 59473814669861233ull, 55314113489879299ull}));
  EXPECT_EQ(
      model::ple_layer_multipliers(512, 3, 0, 1234),
      (std::vector<uint64_t>{4295158889763781ull, 17440218147737327ull, 1270917961434445ull}));
}

TEST(SynthQwen4ExpPle, HeadLayoutMatchesTransformers) {
  const model::PleHeadLayout real = model::ple_head_layout({}, 16);
  EXPECT_EQ(real.vocab_sizes,
            (std::vector<int64_t>{20000003, 20000023, 20000033, 20000047, 20000059, 20000063,
                                  20000069, 20000077, 20000081, 20000093, 20000107, 20000147,
                                  20000153, 20000159, 20000161, 20000171}));
  EXPECT_EQ(real.offsets,
            (std::vector<int64_t>{0, 20000003, 40000026, 60000059, 80000106, 100000165, 120000228,
                                  140000297, 160000374, 180000455, 200000548, 220000655, 240000802,
                                  260000955, 280001114, 300001275}));
  EXPECT_EQ(real.total_rows, 320001446);
  EXPECT_EQ(real.padded_rows, 320001536);  // per_layer_token_embd [160, 320001536] as published

  // A second PLE layer would take the next 16 primes.
  const model::PleHeadLayout second = model::ple_head_layout({.ple_layer_index = 1}, 16);
  EXPECT_EQ(second.vocab_sizes.front(), 20000213);
  EXPECT_EQ(second.vocab_sizes.back(), 20000429);
  EXPECT_EQ(second.padded_rows, 320005120);

  // --ple-rows-scale 10000: base 2000.
  const model::PleHeadLayout scaled = model::ple_head_layout({.ngram_vocab_size_base = 2000}, 16);
  EXPECT_EQ(scaled.vocab_sizes,
            (std::vector<int64_t>{2003, 2011, 2017, 2027, 2029, 2039, 2053, 2063, 2069, 2081, 2083,
                                  2087, 2089, 2099, 2111, 2113}));
  EXPECT_EQ(scaled.offsets.back(), 30861);
  EXPECT_EQ(scaled.total_rows, 32974);
  EXPECT_EQ(scaled.padded_rows, 33024);

  const model::PleHeadLayout tiny =
      model::ple_head_layout({.ngram_vocab_size_base = 101, .vocab_divisible_by = 8}, 4);
  EXPECT_EQ(tiny.vocab_sizes, (std::vector<int64_t>{101, 103, 107, 109}));
  EXPECT_EQ(tiny.offsets, (std::vector<int64_t>{0, 101, 204, 311}));
  EXPECT_EQ(tiny.padded_rows, 424);
}

// ---- the released checkpoint's shape ----------------------------------------------------------

TEST(SynthQwen4ExpShape, FlashNextConfigIsTheRelease) {
  const auto shape = model::checkpoint_shape("Qwen3.8-Flash-Next");
  ASSERT_TRUE(shape.has_value());
  EXPECT_EQ(shape->checkpoint, model::Checkpoint::kQwen38_FlashNext);
  const model::Config& c = shape->config;
  EXPECT_EQ(c.arch, Arch::kQwen4Exp);
  EXPECT_EQ(c.arch_name, "qwen4exp");
  EXPECT_EQ(c.n_layer, 48);
  EXPECT_EQ(c.n_embd, 2560);
  EXPECT_EQ(c.n_head, 24);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.n_rot, 64);
  EXPECT_EQ(c.ssm_k_heads, 16);
  EXPECT_EQ(c.ssm_v_heads, 48);
  EXPECT_EQ(c.ssm_head_dim, 128);
  EXPECT_EQ(c.n_expert, 512);
  EXPECT_EQ(c.n_expert_used, 10);
  EXPECT_EQ(c.n_ff_exp, 640);
  EXPECT_EQ(c.n_ff_shexp, 640);
  EXPECT_EQ(c.n_vocab, 248320);
  EXPECT_EQ(c.n_ctx_train, 262144);
  const model::Qwen4ExpConfig& q = c.q4;
  EXPECT_EQ(q.hc_count, 4);
  EXPECT_EQ(q.hc_lowrank, 320);
  EXPECT_EQ(q.indexer_heads, 4);
  EXPECT_EQ(q.indexer_head_dim, 128);
  EXPECT_EQ(q.indexer_budget, 2048);
  ASSERT_EQ(q.compress_ratios.size(), 48u);
  for (int il = 0; il < 48; ++il) EXPECT_EQ(q.compress_ratios[il], il % 4 == 3 ? 4 : 0) << il;
  EXPECT_EQ(q.ple_layer, 1);
  EXPECT_EQ(q.ple_ngram, 3);
  EXPECT_EQ(q.ple_heads_per_ngram, 8);
  EXPECT_EQ(q.ple_conv_kernel, 4);
  EXPECT_EQ(q.ple_head_dim, 160);
  EXPECT_EQ(q.ple_eos, 248044);
  EXPECT_EQ(q.ple_multipliers, model::ple_layer_multipliers(248320, 3, 0, 1234));
  EXPECT_EQ(q.ple_head_vocab, model::ple_head_layout({}, 16).vocab_sizes);
  EXPECT_EQ(q.ple_head_offsets, model::ple_head_layout({}, 16).offsets);
  EXPECT_EQ(q.ple_rows, 320001536);
  EXPECT_EQ(shape->size_label, "512x56B");
}

struct Want {
  std::vector<int64_t> ne;
  DType type;
};

std::map<std::string, model::SynthTensor> by_name(const std::vector<model::SynthTensor>& table) {
  std::map<std::string, model::SynthTensor> out;
  for (const auto& t : table) EXPECT_TRUE(out.emplace(t.name, t).second) << "twice: " << t.name;
  return out;
}

void expect_tensors(const std::map<std::string, model::SynthTensor>& table,
                    const std::map<std::string, Want>& want) {
  for (const auto& [name, w] : want) {
    auto it = table.find(name);
    ASSERT_NE(it, table.end()) << name;
    EXPECT_EQ(it->second.ne, w.ne) << name;
    EXPECT_EQ(dtype_name(it->second.type), dtype_name(w.type)) << name;
  }
}

TEST(SynthQwen4ExpTable, FourLayersQ4KM) {
  const auto spec = model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 4);
  const auto list = model::synth_tensor_table(spec);
  // 6 globals, 16 per layer (two hyper-connections of 4 and the MoE's 8), 9 per DeltaNet layer,
  // 10 per QSA layer (attention 6, indexer 4), 6 for the PLE.
  EXPECT_EQ(list.size(), 6u + 4 * 16 + 3 * 9 + 10 + 6);
  const auto table = by_name(list);
  const DType F32 = DType::F32, Q8 = DType::Q8_0, Q4K = DType::Q4_K, Q5 = DType::Q5_0;
  expect_tensors(table,
                 {{"token_embd.weight", {{2560, 248320}, Q4K}},
                  {"output.weight", {{2560, 248320}, DType::Q6_K}},
                  {"output_hc_norm.weight", {{10240}, F32}},
                  {"output_hc_down.weight", {{10240, 320}, Q8}},
                  {"output_hc_up.weight", {{320, 10240}, Q8}},
                  {"per_layer_token_embd.weight", {{160, 320001536}, Q5}},  // Q4_K falls back
                  {"blk.0.hc_attn_norm.weight", {{10240}, F32}},
                  {"blk.0.hc_attn_down.weight", {{10240, 320}, Q8}},
                  {"blk.0.hc_attn_up.weight", {{320, 10240}, Q8}},
                  {"blk.0.hc_attn_inject.weight", {{10240, 4}, F32}},
                  {"blk.0.hc_ffn_inject.weight", {{10240, 4}, F32}},
                  {"blk.0.attn_qkv.weight", {{2560, 10240}, Q8}},
                  {"blk.0.attn_gate.weight", {{2560, 6144}, Q8}},
                  {"blk.0.ssm_conv1d.weight", {{4, 10240}, F32}},
                  {"blk.0.ssm_a", {{48}, F32}},
                  {"blk.0.ssm_out.weight", {{6144, 2560}, Q8}},
                  {"blk.0.ffn_gate_inp.weight", {{2560, 512}, F32}},
                  {"blk.0.ffn_gate_exps.weight", {{2560, 640, 512}, Q4K}},
                  {"blk.0.ffn_up_exps.weight", {{2560, 640, 512}, Q4K}},
                  {"blk.0.ffn_down_exps.weight", {{640, 2560, 512}, Q5}},  // Q4_K falls back
                  {"blk.0.ffn_gate_shexp.weight", {{2560, 640}, Q8}},
                  {"blk.0.ffn_down_shexp.weight", {{640, 2560}, Q8}},
                  {"blk.1.ple_key.weight", {{2560, 10240}, Q8}},
                  {"blk.1.ple_value.weight", {{2560, 2560}, Q8}},
                  {"blk.1.ple_norm_key.weight", {{10240}, F32}},
                  {"blk.1.ple_norm_query.weight", {{10240}, F32}},
                  {"blk.1.ple_norm_conv.weight", {{10240}, F32}},
                  {"blk.1.ple_conv1d.weight", {{4, 10240}, DType::F16}},
                  {"blk.3.attn_q.weight", {{2560, 12288}, Q8}},
                  {"blk.3.attn_k.weight", {{2560, 512}, Q8}},
                  {"blk.3.attn_v.weight", {{2560, 512}, Q8}},
                  {"blk.3.attn_output.weight", {{6144, 2560}, Q8}},
                  {"blk.3.attn_q_norm.weight", {{256}, F32}},
                  {"blk.3.indexer.q_proj.weight", {{2560, 512}, DType::BF16}},
                  {"blk.3.indexer.k_proj.weight", {{2560, 128}, DType::BF16}},
                  {"blk.3.indexer.q_norm.weight", {{128}, F32}},
                  {"blk.3.indexer.k_norm.weight", {{128}, F32}}});
  for (const char* absent :
       {"output_norm.weight", "blk.0.attn_norm.weight", "blk.0.post_attention_norm.weight",
        "blk.0.ple_key.weight", "blk.0.indexer.q_proj.weight", "blk.4.hc_attn_norm.weight"}) {
    EXPECT_EQ(table.count(absent), 0u) << absent;
  }
  uint64_t bytes = 0;
  for (const auto& t : list) bytes += t.n_bytes;
  EXPECT_EQ(table.at("per_layer_token_embd.weight").n_bytes, 320001536ull * 5 * 22);
  EXPECT_NEAR(bytes / 1e9, 42.54, 0.01);
}

TEST(SynthQwen4ExpTable, FourLayersQ8) {
  const auto table =
      by_name(model::synth_tensor_table(model::synth_spec_like("Qwen3.8-Flash-Next", "Q8_0", 4)));
  const DType Q8 = DType::Q8_0;
  expect_tensors(table, {{"token_embd.weight", {{2560, 248320}, Q8}},
                         {"output.weight", {{2560, 248320}, Q8}},
                         {"per_layer_token_embd.weight", {{160, 320001536}, Q8}},
                         {"blk.0.hc_attn_inject.weight", {{10240, 4}, Q8}},
                         {"blk.0.hc_attn_up.weight", {{320, 10240}, Q8}},
                         {"blk.0.ffn_down_exps.weight", {{640, 2560, 512}, Q8}},
                         {"blk.1.ple_conv1d.weight", {{4, 10240}, DType::F16}},
                         {"blk.3.indexer.q_proj.weight", {{2560, 512}, Q8}}});
  EXPECT_EQ(table.at("per_layer_token_embd.weight").n_bytes, 320001536ull * 5 * 34);
}

TEST(SynthQwen4ExpTable, FullModelIsTheReleasedInventory) {
  // The published files: 1224 tensors, 176.944 B parameters of which the n-gram table holds
  // 51.200 B and the routed experts 120.796 B.
  const auto list =
      model::synth_tensor_table(model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M"));
  EXPECT_EQ(list.size(), 1224u);
  uint64_t params = 0, experts = 0, table = 0;
  for (const auto& t : list) {
    uint64_t n = 1;
    for (int64_t d : t.ne) n *= static_cast<uint64_t>(d);
    params += n;
    if (t.name.find("_exps.") != std::string::npos) experts += n;
    if (t.name == "per_layer_token_embd.weight") table = n;
  }
  EXPECT_NEAR(params / 1e9, 176.944, 0.0005);
  EXPECT_NEAR(experts / 1e9, 120.796, 0.0005);
  EXPECT_NEAR(table / 1e9, 51.200, 0.0005);
  // size_label "512x56B": 512 experts x (shared + one expert's) parameters.
  EXPECT_EQ(static_cast<int>((params - experts + experts / 512) / 1e9), 56);
}

TEST(SynthQwen4ExpTable, OptionsAndErrors) {
  const auto scaled = model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 4, false, 10000);
  EXPECT_EQ(scaled.config.q4.ple_rows, 33024);
  EXPECT_EQ(scaled.config.q4.ple_head_vocab,
            model::ple_head_layout({.ngram_vocab_size_base = 2000}, 16).vocab_sizes);
  EXPECT_EQ(scaled.config.q4.ple_multipliers, model::ple_layer_multipliers(248320, 3, 0, 1234));
  EXPECT_EQ(scaled.config.q4.compress_ratios, (std::vector<int>{0, 0, 0, 4}));
  EXPECT_THROW(model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 0, /*mtp=*/true), Error);
  EXPECT_THROW(model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 1), Error);  // PLE on 1
  EXPECT_THROW(model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 49), Error);
  EXPECT_THROW(model::synth_spec_like("Qwen3.6-27B", "Q4_K_M", 4, false, 10), Error);
  EXPECT_THROW(model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 4, false, 0), Error);
  EXPECT_THROW(model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 4, false, 20'000'000), Error);
}

TEST(SynthQwen4ExpTable, FallbackTypesAreLlamaCpps) {
  EXPECT_EQ(model::fallback_type(DType::Q4_K, 640), DType::Q5_0);
  EXPECT_EQ(model::fallback_type(DType::Q4_K, 2560), DType::Q4_K);
  EXPECT_EQ(model::fallback_type(DType::Q5_K, 160), DType::Q5_1);
  EXPECT_EQ(model::fallback_type(DType::Q6_K, 320), DType::Q8_0);
  EXPECT_EQ(model::fallback_type(DType::IQ4_XS, 160), DType::IQ4_NL);
  EXPECT_EQ(model::fallback_type(DType::Q8_0, 4), DType::F16);
  EXPECT_EQ(model::fallback_type(DType::Q4_K, 4), DType::F16);
  EXPECT_EQ(model::fallback_type(DType::F32, 4), DType::F32);
}

// ---- files ------------------------------------------------------------------------------------

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::vector<uint8_t> out(std::filesystem::file_size(path));
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_EQ(std::fread(out.data(), 1, out.size(), f), out.size());
  std::fclose(f);
  return out;
}

std::vector<float> run(const std::string& path, const std::string& backend,
                       const std::vector<int32_t>& ids) {
  engine::EngineOptions o;
  o.backend = backend;
  o.n_ctx = 64;
  auto e = engine::Engine::load(path, o);
  engine::Batch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(0, ids[i], static_cast<int32_t>(i), true);
  return e->step(b);
}

void expect_finite_and_spread(const std::vector<float>& logits, size_t n) {
  ASSERT_EQ(logits.size(), n);
  double spread = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    spread += std::abs(v - logits[0]);
  }
  EXPECT_GT(spread / logits.size(), 0.05);
}

TEST(SynthQwen4ExpFile, TinyFileLoadsAndRunsFinite) {
  const std::string path = testing_support::write_tiny(Arch::kQwen4Exp, "synth_q4_tiny.gguf");
  const auto file = gguf::File::open(path).value();
  const model::Config c = model::Config::from_gguf(file);
  const model::Config want = model::tiny_config(Arch::kQwen4Exp);
  EXPECT_EQ(c.arch, Arch::kQwen4Exp);
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.q4.hc_count, want.q4.hc_count);
  EXPECT_EQ(c.q4.compress_ratios, want.q4.compress_ratios);
  EXPECT_EQ(c.q4.ple_layer, 1);
  EXPECT_EQ(c.q4.ple_multipliers, want.q4.ple_multipliers);
  EXPECT_EQ(c.q4.ple_head_offsets, (std::vector<int64_t>{0, 101, 204, 311}));
  EXPECT_EQ(c.q4.ple_head_vocab, (std::vector<int64_t>{101, 103, 107, 109}));
  EXPECT_EQ(c.q4.ple_rows, 424);
  EXPECT_TRUE(c.is_qsa_layer(3));
  // 20 tokens: past the QSA budget of 8 (blocks are dropped), with the PLE's eos inside.
  std::vector<int32_t> ids = testing_support::random_tokens(20, c.n_vocab, 3);
  ids[9] = c.q4.ple_eos;
  const auto ref = run(path, "ref", ids);
  expect_finite_and_spread(ref, ids.size() * c.n_vocab);
  const auto cpu = run(path, "cpu", ids);
  EXPECT_LT(testing_support::rel_l2(cpu, ref), 1e-3);
}

TEST(SynthQwen4ExpFile, StreamedBytesAreGgufWritersBytes) {
  // write_synthetic streams its own GGUF encoding: every arch's file must be the bytes
  // gguf::Writer gives for the same keys and tensors (testing_support::rewrite uses it).
  for (const Arch arch : {Arch::kQwen35, Arch::kQwen35Moe, Arch::kQwen4Exp}) {
    SCOPED_TRACE(static_cast<int>(arch));
    const std::string a = testing_support::write_tiny(arch, "synth_q4_stream_a.gguf", [](auto& s) {
      s.converter_keys = true;
      s.size_label = "tiny";
    });
    const std::string b = testing_support::temp_path("synth_q4_stream_b.gguf");
    testing_support::rewrite(a, b, [](auto&, auto&, auto&) {});
    EXPECT_EQ(file_bytes(a), file_bytes(b));
  }
}

// A small config whose rows fall back as Flash-Next's do (160-wide experts: Q5_0 down; 64-wide
// PLE rows: Q5_0 table; 4-tap PLE conv: F16) under the Q4_K_M mix, drawn as direct blocks.
model::SynthSpec small_direct_spec() {
  model::SynthSpec spec;
  model::Config& c = spec.config;
  c = model::tiny_config(Arch::kQwen4Exp);
  c.n_embd = 256;
  c.n_vocab = 512;
  c.head_dim = 64;
  c.n_rot = 16;
  c.rope_sections = {3, 3, 2, 0};
  c.ssm_head_dim = 64;
  c.ssm_inner = c.ssm_v_heads * 64;
  c.n_ff_exp = 160;
  c.n_ff_shexp = 256;
  c.q4.indexer_head_dim = 64;
  c.q4.ple_head_dim = 64;
  c.q4.ple_eos = 511;
  model::derive_ple_tables(c, {.ngram_vocab_size_base = 1000});
  spec.mix = model::QuantMix::q4_k_m();
  spec.direct_blocks = true;
  spec.vocab = model::SynthVocab::kSynthetic;
  spec.seed = 7;
  return spec;
}

TEST(SynthQwen4ExpFile, SmallDirectFileFallsBackLoadsAndRuns) {
  const model::SynthSpec spec = small_direct_spec();
  EXPECT_EQ(spec.config.q4.ple_rows, 4096);
  const auto table = by_name(model::synth_tensor_table(spec));
  expect_tensors(table, {{"blk.0.ffn_down_exps.weight", {{160, 256, 6}, DType::Q5_0}},
                         {"blk.0.ffn_gate_exps.weight", {{256, 160, 6}, DType::Q4_K}},
                         {"per_layer_token_embd.weight", {{64, 4096}, DType::Q5_0}},
                         {"blk.1.ple_conv1d.weight", {{4, 1024}, DType::F16}},
                         {"blk.3.indexer.q_proj.weight", {{256, 128}, DType::BF16}}});
  const std::string path = testing_support::temp_path("synth_q4_small.gguf");
  model::write_synthetic(spec, path);
  const std::string b = testing_support::temp_path("synth_q4_small_b.gguf");
  testing_support::rewrite(path, b, [](auto&, auto&, auto&) {});
  EXPECT_EQ(file_bytes(path), file_bytes(b));
  // Direct Q5_0 blocks: zero-mean, fan-in scaled.
  {
    const auto file = gguf::File::open(path).value();
    const gguf::TensorInfo* t = file.find_tensor("blk.0.ffn_down_exps.weight");
    ASSERT_NE(t, nullptr);
    std::vector<float> v(t->n_elements());
    quant::dequantize(t->dtype, t->data, v.data(), static_cast<int64_t>(v.size()), t->name);
    double sum = 0, sum2 = 0;
    for (float x : v) {
      sum += x;
      sum2 += double(x) * x;
    }
    const double mean = sum / v.size(), sd = std::sqrt(sum2 / v.size() - mean * mean);
    const double want = 1.0 / std::sqrt(160.0);
    EXPECT_NEAR(sd / want, 1.0, 0.05);
    EXPECT_LT(std::abs(mean), 0.05 * want);
  }
  std::vector<int32_t> ids = testing_support::random_tokens(24, 479, 5);
  ids[11] = 511;
  expect_finite_and_spread(run(path, "ref", ids), ids.size() * 512u);
}

// ---- a full-width file -------------------------------------------------------------------------

// In the suite SynthFile: the sanitizer job leaves full-width files to the plain run.
TEST(SynthFile, FullWidthFlashNextFourLayersMetadataLoadsAndRuns) {
  // --ple-rows-scale 10000: the table shrinks to 33024 rows (5 MB); everything else full width.
  const auto spec = model::synth_spec_like("Qwen3.8-Flash-Next", "Q4_K_M", 4, false, 10000);
  const std::string path = testing_support::temp_path("synth_flash_next_4.gguf");
  model::write_synthetic(spec, path);
  {
    const auto file = gguf::File::open(path).value();
    EXPECT_EQ(file.get_string("general.architecture"), "qwen4exp");
    EXPECT_EQ(file.get_string("general.name"), "Qwen3.8-Flash-Next");
    EXPECT_EQ(file.get_string("general.size_label"), "512x56B");
    EXPECT_EQ(file.get_string("general.description"), "A Preview of the Qwen4 Architecture");
    EXPECT_EQ(file.get_int("general.file_type"), 15);
    EXPECT_EQ(file.get_int("qwen4exp.block_count"), 4);
    EXPECT_EQ(file.get_int("qwen4exp.hyper_connection.count"), 4);
    EXPECT_EQ(file.get_int("qwen4exp.hyper_connection.low_rank"), 320);
    EXPECT_EQ(file.get_int("qwen4exp.attention.indexer.head_count"), 4);
    EXPECT_EQ(file.get_int("qwen4exp.attention.indexer.key_length"), 128);
    EXPECT_EQ(file.get_int("qwen4exp.attention.indexer.top_k"), 2048);
    EXPECT_EQ(file.get_int("qwen4exp.ple.ngram_size"), 3);
    EXPECT_EQ(file.get_int("qwen4exp.ple.heads_per_ngram"), 8);
    EXPECT_EQ(file.get_int("qwen4exp.ple.conv_kernel"), 4);
    EXPECT_EQ(file.get_int("qwen4exp.ple.eos_token_id"), 248044);
    EXPECT_EQ(file.get_int("qwen4exp.ple.image_token_id"), 248056);
    EXPECT_EQ(file.get_int("qwen4exp.embedding_length_per_layer_input"), 160);
    EXPECT_EQ(file.get_int("tokenizer.ggml.eos_token_id"), 248044);
    const gguf::Array* ratios = file.get_array("qwen4exp.attention.compress_ratios");
    ASSERT_NE(ratios, nullptr);
    EXPECT_EQ(ratios->elem_type, gguf::ValueType::INT32);
    const gguf::Array* layers = file.get_array("qwen4exp.ple.layers");
    ASSERT_NE(layers, nullptr);
    ASSERT_EQ(layers->items.size(), 1u);
    for (const char* key : {"qwen4exp.ple.layer_multipliers", "qwen4exp.ple.head_offsets",
                            "qwen4exp.ple.head_vocab_sizes"}) {
      const gguf::Array* a = file.get_array(key);
      ASSERT_NE(a, nullptr) << key;
      EXPECT_EQ(a->elem_type, gguf::ValueType::UINT64) << key;
    }
    const model::Config c = model::Config::from_gguf(file);
    EXPECT_EQ(c.q4.compress_ratios, (std::vector<int>{0, 0, 0, 4}));
    EXPECT_EQ(c.q4.ple_layer, 1);
    EXPECT_EQ(c.q4.ple_multipliers,
              (std::vector<uint64_t>{23703573157769ull, 20109073645365ull, 8052911324071ull}));
    EXPECT_EQ(c.q4.ple_head_vocab, spec.config.q4.ple_head_vocab);
    EXPECT_EQ(c.q4.ple_head_offsets, spec.config.q4.ple_head_offsets);
    EXPECT_EQ(c.q4.ple_rows, 33024);
    EXPECT_EQ(c.n_embd, 2560);
    EXPECT_EQ(c.n_expert, 512);
    EXPECT_EQ(file.tensors().size(), 113u);
  }
  std::vector<int32_t> ids = {1000, 8919, 248044, 16838, 5};
  expect_finite_and_spread(run(path, "cpu", ids), ids.size() * 248320u);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace qwenrt
