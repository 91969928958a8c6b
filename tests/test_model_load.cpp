// Loading models: Config validation, checkpoint identity, weight binding errors. Every malformed
// but parseable model must fail with a message naming the key or tensor and both values.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "gen/defaults.h"
#include "model/identity.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

using testing_support::rewrite;
using testing_support::TensorData;

void set_key(std::vector<gguf::KeyValue>& kv, const std::string& key, gguf::Value value) {
  for (auto& e : kv) {
    if (e.key == key) {
      e.value = std::move(value);
      return;
    }
  }
  kv.push_back({key, std::move(value)});
}

void drop_key(std::vector<gguf::KeyValue>& kv, const std::string& key) {
  std::erase_if(kv, [&](const gguf::KeyValue& e) { return e.key == key; });
}

// Expects loading `path` to fail with every one of `needles` in the message.
void expect_load_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    engine::Engine::load(path);
    ADD_FAILURE() << "loading " << path << " should fail";
  } catch (const Error& e) {
    for (const auto& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << needle;
    }
  }
}

class ModelLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dense_ = testing_support::write_tiny(model::Arch::kQwen35, "load_dense.gguf");
    moe_ = testing_support::write_tiny(model::Arch::kQwen35Moe, "load_moe.gguf");
  }
  // Writes a variant of `src` with one metadata key changed and returns its path.
  std::string with_key(const std::string& src, const std::string& key, gguf::Value value) {
    const std::string dst = testing_support::temp_path("variant.gguf");
    rewrite(src, dst, [&](auto& kv, auto&, auto&) { set_key(kv, key, value); });
    return dst;
  }
  std::string dense_, moe_;
};

TEST_F(ModelLoad, ConfigReadsEveryField) {
  auto e = engine::Engine::load(moe_);
  const auto& c = e->config();
  const auto want = model::tiny_config(model::Arch::kQwen35Moe);
  EXPECT_EQ(c.arch, model::Arch::kQwen35Moe);
  EXPECT_EQ(c.n_layer, want.n_layer);
  EXPECT_EQ(c.n_embd, want.n_embd);
  EXPECT_EQ(c.n_vocab, want.n_vocab);
  EXPECT_EQ(c.n_head, want.n_head);
  EXPECT_EQ(c.n_head_kv, want.n_head_kv);
  EXPECT_EQ(c.head_dim, want.head_dim);
  EXPECT_EQ(c.n_rot, want.n_rot);
  EXPECT_EQ(c.ssm_k_heads, want.ssm_k_heads);
  EXPECT_EQ(c.ssm_v_heads, want.ssm_v_heads);
  EXPECT_EQ(c.n_expert, want.n_expert);
  EXPECT_EQ(c.n_expert_used, want.n_expert_used);
  EXPECT_EQ(c.n_ff_shexp, want.n_ff_shexp);
  EXPECT_TRUE(c.is_attention_layer(3));
  EXPECT_FALSE(c.is_attention_layer(2));
}

TEST_F(ModelLoad, InconsistentMetadataIsRefusedNamingKeyAndValues) {
  using gguf::Value;
  expect_load_error(with_key(dense_, "qwen35.ssm.inner_size", Value::u32(60)),
                    {"qwen35.ssm.inner_size", "expected 64", "got 60"});
  expect_load_error(with_key(dense_, "qwen35.ssm.time_step_rank", Value::u32(3)),
                    {"qwen35.ssm.time_step_rank", "= 3", "not a multiple", "= 2"});
  expect_load_error(with_key(dense_, "qwen35.rope.dimension_count", Value::u32(32)),
                    {"qwen35.rope.dimension_count", "32", "head dim 16"});
  expect_load_error(with_key(dense_, "qwen35.rope.dimension_sections",
                             Value::array(gguf::ValueType::INT32, {Value::i32(2), Value::i32(1),
                                                                   Value::i32(0), Value::i32(0)})),
                    {"qwen35.rope.dimension_sections", "expected 2", "got 3"});
  expect_load_error(with_key(dense_, "qwen35.full_attention_interval", Value::u32(0)),
                    {"qwen35.full_attention_interval", "got 0"});
  expect_load_error(with_key(moe_, "qwen35moe.expert_used_count", Value::u32(7)),
                    {"qwen35moe.expert_used_count", "= 7", "qwen35moe.expert_count", "= 6"});
  expect_load_error(with_key(dense_, "qwen35.attention.head_count_kv", Value::u32(3)),
                    {"qwen35.attention.head_count", "not a multiple"});
  expect_load_error(with_key(dense_, "general.architecture", Value::str("llama")),
                    {"general.architecture", "got 'llama'"});
  expect_load_error(with_key(dense_, "qwen35.embedding_length", Value::str("wide")),
                    {"qwen35.embedding_length", "expected an integer, got string"});
  const std::string missing = testing_support::temp_path("missing_key.gguf");
  rewrite(dense_, missing, [](auto& kv, auto&, auto&) { drop_key(kv, "qwen35.ssm.state_size"); });
  expect_load_error(missing, {"missing metadata key 'qwen35.ssm.state_size'"});
}

TEST_F(ModelLoad, BadTensorsAreRefusedNamingTensorExpectedAndActual) {
  const std::string path = testing_support::temp_path("bad_tensor.gguf");
  rewrite(dense_, path, [](auto&, std::map<std::string, TensorData>& t, auto&) {
    t.erase("blk.1.ssm_out.weight");
  });
  expect_load_error(path, {"missing tensor 'blk.1.ssm_out.weight'"});

  rewrite(dense_, path, [](auto&, std::map<std::string, TensorData>& t, auto&) {
    auto& q = t["blk.3.attn_q.weight"];
    q.ne[1] /= 2;
    q.bytes.resize(q.bytes.size() / 2);
  });
  expect_load_error(path,
                    {"tensor 'blk.3.attn_q.weight'", "expected shape [64, 128]", "got [64, 64]"});

  rewrite(dense_, path, [](auto&, std::map<std::string, TensorData>& t, auto&) {
    auto& n = t["blk.0.ssm_norm.weight"];
    n.dtype = DType::F16;
    n.bytes.resize(n.bytes.size() / 2);
  });
  expect_load_error(path, {"tensor 'blk.0.ssm_norm.weight'", "expected type F32, got F16"});

  rewrite(dense_, path, [](auto&, std::map<std::string, TensorData>& t, auto&) {
    // Q8_1 is a type GGUF defines that qwenrt cannot compute with (blocks of 32, 36 bytes).
    t["blk.0.ffn_up.weight"] = {DType::Q8_1, {64, 96}, std::vector<uint8_t>(64 / 32 * 36 * 96)};
  });
  expect_load_error(path, {"tensor 'blk.0.ffn_up.weight'", "type Q8_1 is not supported"});
}

TEST_F(ModelLoad, TiedOutputFallsBackToTokenEmbedding) {
  const std::string tied = testing_support::write_tiny(
      model::Arch::kQwen35, "tied.gguf", [](model::SynthSpec& s) { s.tied_output = true; });
  auto e = engine::Engine::load(tied);
  engine::Batch b;
  b.add(0, 5, 0, true);
  auto logits = e->step(b);
  ASSERT_EQ(logits.size(), size_t(e->config().n_vocab));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(ModelLoad, LoadReportsProgressOverEveryWeightByte) {
  engine::EngineOptions o;
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  o.on_load_progress = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
  auto e = engine::Engine::load(moe_, o);
  uint64_t bytes = 0;
  for (const auto& t : e->file().tensors()) bytes += t.n_bytes;
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), std::make_pair(bytes, bytes));
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_LE(calls[i - 1].first, calls[i].first);
}

TEST(Identity, MatchesWholeNamesOnly) {
  using model::Checkpoint;
  EXPECT_EQ(model::identify_name("Qwen3.6-27B", "").checkpoint, Checkpoint::kQwen36_27B);
  EXPECT_EQ(model::identify_name("Qwen3.6 35B A3B Instruct", "").checkpoint,
            Checkpoint::kQwen36_35B_A3B);
  EXPECT_EQ(model::identify_name("Qwen3.8-27B", "").checkpoint, Checkpoint::kQwen38_27B);
  EXPECT_EQ(model::identify_name("", "Qwen3.8-27B-Q4_K_M.gguf").checkpoint,
            Checkpoint::kQwen38_27B);
  EXPECT_EQ(model::identify_name("My Qwen3.6-27B finetune", "x.gguf").checkpoint,
            Checkpoint::kQwen36_27B);
  EXPECT_EQ(model::identify_name("3.6", "qwen.gguf").checkpoint, Checkpoint::kOther);
  EXPECT_EQ(model::identify_name("Qwen3.6-270B", "").checkpoint, Checkpoint::kOther);
  EXPECT_EQ(model::identify_name("XQwen3.6-27B", "").checkpoint, Checkpoint::kOther);
  // Qwen3.8-Flash-Next: the registry name and published files' "Qwen3.8 Flash Next".
  EXPECT_EQ(model::identify_name("Qwen3.8 Flash Next", "").checkpoint,
            Checkpoint::kQwen38_FlashNext);
  EXPECT_EQ(model::identify_name("", "Qwen3.8-Flash-Next-UD-Q4_K_XL.gguf").checkpoint,
            Checkpoint::kQwen38_FlashNext);
  EXPECT_EQ(model::identify_name("Qwen3.8-Flash-Nextgen", "").checkpoint, Checkpoint::kOther);
  EXPECT_EQ(model::identify_name("Qwen3.8 Flash", "").checkpoint, Checkpoint::kOther);
  const auto other = model::identify_name("tiny-chat", "t.gguf");
  EXPECT_EQ(other.checkpoint, Checkpoint::kOther);
  EXPECT_EQ(other.name, "tiny-chat");
}

TEST(Identity, CheckpointDefaults) {
  using model::Checkpoint;
  const auto of = [](const char* name, int mtp_blocks) {
    return gen::checkpoint_defaults(model::identify_name(name, ""), nullptr, mtp_blocks);
  };
  const auto q27 = of("Qwen3.6-27B", 0);
  EXPECT_EQ(q27.dialect, chat::Dialect::kQwen36);
  EXPECT_EQ(q27.drafter.kind, gen::DrafterKind::kMtp);  // from a sidecar: the release ships one
  EXPECT_EQ(q27.drafter.depth, 7);
  EXPECT_FLOAT_EQ(q27.thinking.temperature, 1.0f);
  EXPECT_FLOAT_EQ(q27.non_thinking.top_p, 0.8f);
  // Flash-Next: the Qwen3.8 dialect; no drafter, since qwen4exp files carry no MTP block.
  const auto flash = of("Qwen3.8 Flash Next", 0);
  EXPECT_EQ(flash.identity.checkpoint, Checkpoint::kQwen38_FlashNext);
  EXPECT_EQ(flash.dialect, chat::Dialect::kQwen38);
  EXPECT_EQ(flash.drafter.kind, gen::DrafterKind::kNone);
  EXPECT_EQ(gen::to_json(flash).at("checkpoint"), "Qwen3.8-Flash-Next");
  // An unregistered file drafts only with its own MTP block.
  EXPECT_EQ(of("tiny-chat", 0).drafter.kind, gen::DrafterKind::kNone);
  const auto tiny = of("tiny-chat", 1);
  EXPECT_EQ(tiny.drafter.kind, gen::DrafterKind::kMtp);
  EXPECT_TRUE(tiny.drafter.in_file);
  EXPECT_EQ(tiny.drafter.depth, gen::kMtpDraftDepth);
  EXPECT_EQ(tiny.dialect, chat::Dialect::kQwen35);
}

}  // namespace
}  // namespace qwenrt
