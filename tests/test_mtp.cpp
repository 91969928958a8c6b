// The MTP (nextn) block on a tiny synthetic model that carries one: binding, batch == step by
// step (its own KV rows), dependence on both inputs, snapshot/restore, absent block.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

using testing_support::rel_l2;
using testing_support::TensorData;

void set_u32(std::vector<gguf::KeyValue>& kv, const std::string& key, uint32_t v) {
  for (auto& e : kv) {
    if (e.key == key) {
      e.value = gguf::Value::u32(v);
      return;
    }
  }
  kv.push_back({key, gguf::Value::u32(v)});
}

TensorData random_f32(std::vector<int64_t> ne, float scale, float offset, uint64_t seed) {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = offset + dist(rng);
  TensorData t{DType::F32, ne, std::vector<uint8_t>(n * 4)};
  std::memcpy(t.bytes.data(), v.data(), n * 4);
  return t;
}

// A tiny dense model plus an MTP block at blk.4 (attention and FFN weights copied from layer 3,
// nextn tensors random). `with_block` false declares the block but leaves its tensors out.
std::string mtp_model(bool with_block) {
  const std::string base = testing_support::write_tiny(model::Arch::kQwen35, "mtp_base.gguf");
  const std::string out = testing_support::temp_path(with_block ? "mtp.gguf" : "mtp_absent.gguf");
  testing_support::rewrite(
      base, out, [&](auto& kv, std::map<std::string, TensorData>& t, auto& order) {
        set_u32(kv, "qwen35.block_count", 5);
        set_u32(kv, "qwen35.nextn_predict_layers", 1);
        if (!with_block) return;
        const int64_t e = 64;
        for (const char* name :
             {"attn_norm.weight", "post_attention_norm.weight", "attn_q.weight", "attn_k.weight",
              "attn_v.weight", "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
              "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) {
          t[std::string("blk.4.") + name] = t[std::string("blk.3.") + name];
          order.push_back(std::string("blk.4.") + name);
        }
        t["blk.4.nextn.eh_proj.weight"] = random_f32({2 * e, e}, 1.0f / std::sqrt(128.0f), 0, 1);
        t["blk.4.nextn.enorm.weight"] = random_f32({e}, 0.1f, 1.0f, 2);
        t["blk.4.nextn.hnorm.weight"] = random_f32({e}, 0.1f, 1.0f, 3);
        for (const char* name :
             {"nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight"}) {
          order.push_back(std::string("blk.4.") + name);
        }
      });
  return out;
}

struct Prefilled {
  std::unique_ptr<engine::Engine> engine;
  std::vector<int32_t> ids;
  std::vector<float> hidden;
};

Prefilled prefill(const std::string& path, int n) {
  Prefilled p{engine::Engine::load(path), {}, {}};
  std::mt19937_64 rng(5);
  engine::Batch b;
  for (int i = 0; i < n; ++i) {
    p.ids.push_back(static_cast<int32_t>(rng() % p.engine->config().n_vocab));
    b.add(0, p.ids.back(), i, true);
  }
  p.hidden = p.engine->step_with_hidden(b).hidden;
  return p;
}

engine::MtpBatch rows(const Prefilled& p, int from, int to) {
  engine::MtpBatch m;
  const int e = p.engine->config().n_embd;
  for (int i = from; i < to; ++i) {
    m.slots.push_back(0);
    m.tokens.push_back(p.ids[i + 1]);
    m.positions.push_back(i);
    m.hidden.insert(m.hidden.end(), p.hidden.begin() + i * e, p.hidden.begin() + (i + 1) * e);
  }
  return m;
}

TEST(Mtp, BatchEqualsStepByStepAndDependsOnBothInputs) {
  const std::string path = mtp_model(true);
  auto a = prefill(path, 12);
  ASSERT_TRUE(a.engine->has_mtp());
  const auto all = a.engine->mtp_step(rows(a, 0, 11));
  auto b = prefill(path, 12);
  std::vector<float> stepwise;
  for (int i = 0; i < 11; ++i) {
    const auto one = b.engine->mtp_step(rows(b, i, i + 1));
    stepwise.insert(stepwise.end(), one.begin(), one.end());
  }
  EXPECT_LT(rel_l2(stepwise, all), 1e-5);
  for (float v : all) ASSERT_TRUE(std::isfinite(v));

  // Another next token, or another hidden state, must change the draft.
  auto c = prefill(path, 12);
  auto m = rows(c, 0, 1);
  const auto base = c.engine->mtp_step(m);
  c.engine->states().reset(0);
  m.tokens[0] = (m.tokens[0] + 1) % c.engine->config().n_vocab;
  EXPECT_GT(rel_l2(c.engine->mtp_step(m), base), 1e-3);
  c.engine->states().reset(0);
  m = rows(c, 0, 1);
  for (auto& h : m.hidden) h = -h;
  EXPECT_GT(rel_l2(c.engine->mtp_step(m), base), 1e-3);
}

TEST(Mtp, SnapshotCoversTheMtpRows) {
  auto p = prefill(mtp_model(true), 8);
  p.engine->mtp_step(rows(p, 0, 4));
  const auto snap = p.engine->states().snapshot(0);
  const auto first = p.engine->mtp_step(rows(p, 4, 7));
  p.engine->states().restore(0, snap);
  EXPECT_EQ(p.engine->mtp_step(rows(p, 4, 7)), first);
  // Positions must continue the MTP block's own sequence.
  EXPECT_THROW(p.engine->mtp_step(rows(p, 2, 3)), Error);
}

TEST(Mtp, DeclaredButAbsentBlockMeansNoDrafts) {
  auto p = prefill(mtp_model(false), 4);
  EXPECT_FALSE(p.engine->has_mtp());
  EXPECT_THROW(p.engine->mtp_step(rows(p, 0, 1)), Error);
}

}  // namespace
}  // namespace qwenrt
