// State continuity and batching of the reference forward pass on tiny synthetic models:
// prefill + decode == prefill, chunked == recurrent DeltaNet, a mixed batch == each sequence
// alone, snapshot/restore, fused tensor layouts == split ones.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "engine/engine.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

using engine::Batch;
using engine::Engine;
using engine::EngineOptions;
using testing_support::random_tokens;
using testing_support::rel_l2;

// Logits of every position of `ids` fed to `slot` in chunks of `chunk` tokens.
std::vector<float> run_chunks(Engine& e, const std::vector<int32_t>& ids, int chunk, int slot = 0) {
  std::vector<float> all;
  for (size_t i = 0; i < ids.size(); i += chunk) {
    Batch b;
    const int64_t start = e.states().n_tokens(slot);
    for (size_t j = i; j < std::min(ids.size(), i + chunk); ++j) {
      b.add(slot, ids[j], static_cast<int32_t>(start + j - i), true);
    }
    auto l = e.step(b);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

class ForwardTest : public ::testing::TestWithParam<model::Arch> {
 protected:
  std::string path() {
    const bool dense = GetParam() == model::Arch::kQwen35;
    return testing_support::write_tiny(GetParam(), dense ? "fwd_dense.gguf" : "fwd_moe.gguf");
  }
  std::unique_ptr<Engine> load(arch::DeltaNetMode mode = arch::DeltaNetMode::kAuto, int slots = 1) {
    EngineOptions o;
    o.deltanet_mode = mode;
    o.n_slots = slots;
    return Engine::load(path(), o);
  }
};

TEST_P(ForwardTest, LogitsAreFiniteAndVaried) {
  auto e = load();
  const auto ids = random_tokens(9, e->config().n_vocab, 1);
  auto logits = run_chunks(*e, ids, 9);
  ASSERT_EQ(logits.size(), ids.size() * e->config().n_vocab);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  // Different positions must give different distributions (a dead model would not).
  const int V = e->config().n_vocab;
  double diff = 0;
  for (int i = 0; i < V; ++i) diff += std::abs(logits[i] - logits[V + i]);
  EXPECT_GT(diff / V, 1e-3);
}

TEST_P(ForwardTest, PrefillThenDecodeEqualsOnePrefill) {
  auto whole = load();
  auto split = load();
  const auto ids = random_tokens(75, whole->config().n_vocab, 2);  // crosses the chunk of 64
  auto a = run_chunks(*whole, ids, 75);
  std::vector<int32_t> head(ids.begin(), ids.begin() + 70);
  std::vector<int32_t> tail(ids.begin() + 70, ids.end());
  auto b = run_chunks(*split, head, 70);
  auto b_tail = run_chunks(*split, tail, 1);
  b.insert(b.end(), b_tail.begin(), b_tail.end());
  EXPECT_LT(rel_l2(b, a), 1e-5);
}

TEST_P(ForwardTest, ChunkedDeltaNetEqualsRecurrent) {
  auto chunked = load(arch::DeltaNetMode::kChunked);
  auto recurrent = load(arch::DeltaNetMode::kRecurrent);
  const auto ids = random_tokens(150, chunked->config().n_vocab, 3);
  EXPECT_LT(rel_l2(run_chunks(*chunked, ids, 150), run_chunks(*recurrent, ids, 150)), 1e-5);
  // The state left behind must agree too: the next decode step gives the same logits.
  const auto next = random_tokens(3, chunked->config().n_vocab, 4);
  EXPECT_LT(rel_l2(run_chunks(*chunked, next, 1), run_chunks(*recurrent, next, 1)), 1e-5);
}

TEST_P(ForwardTest, MixedBatchEqualsEachSequenceAlone) {
  auto batched = load(arch::DeltaNetMode::kAuto, 3);
  const int n_vocab = batched->config().n_vocab;
  const auto s0 = random_tokens(20, n_vocab, 5), s1 = random_tokens(7, n_vocab, 6),
             s2 = random_tokens(1, n_vocab, 7);
  // Alone.
  std::vector<std::vector<float>> alone;
  for (const auto* s : {&s0, &s1, &s2}) alone.push_back(run_chunks(*load(), *s, 100));
  // Slot 0 first gets a 12-token prefill, then one step carries its last 8 tokens, slot 1's whole
  // prompt and slot 2's single token.
  std::vector<int32_t> s0_head(s0.begin(), s0.begin() + 12);
  auto first = run_chunks(*batched, s0_head, 12, 0);
  Batch b;
  for (int i = 12; i < 20; ++i) b.add(0, s0[i], i, true);
  for (int i = 0; i < 7; ++i) b.add(1, s1[i], i, true);
  b.add(2, s2[0], 0, true);
  auto mixed = batched->step(b);
  std::vector<float> got0 = first;
  got0.insert(got0.end(), mixed.begin(), mixed.begin() + 8 * n_vocab);
  std::vector<float> got1(mixed.begin() + 8 * n_vocab, mixed.begin() + 15 * n_vocab);
  std::vector<float> got2(mixed.begin() + 15 * n_vocab, mixed.end());
  EXPECT_LT(rel_l2(got0, alone[0]), 1e-5);
  EXPECT_LT(rel_l2(got1, alone[1]), 1e-5);
  EXPECT_LT(rel_l2(got2, alone[2]), 1e-5);
}

TEST_P(ForwardTest, SnapshotRestoreRerunsIdentically) {
  auto e = load();
  const auto ids = random_tokens(30, e->config().n_vocab, 8);
  std::vector<int32_t> prefix(ids.begin(), ids.begin() + 20), rest(ids.begin() + 20, ids.end());
  run_chunks(*e, prefix, 20);
  const state::Snapshot snap = e->states().snapshot(0);
  auto first = run_chunks(*e, rest, 3);
  e->states().restore(0, snap);
  auto second = run_chunks(*e, rest, 3);
  EXPECT_EQ(first, second);
  // And a different continuation really changes the state (the check above can fail).
  e->states().restore(0, snap);
  auto other = run_chunks(*e, random_tokens(10, e->config().n_vocab, 9), 3);
  EXPECT_GT(rel_l2(other, first), 1e-3);
}

TEST_P(ForwardTest, BatchErrorsNameTheProblem) {
  auto e = load(arch::DeltaNetMode::kAuto, 2);
  Batch gap;
  gap.add(0, 1, 1, true);  // slot 0 is empty: position must be 0
  EXPECT_THROW(e->step(gap), Error);
  Batch bad_token;
  bad_token.add(0, e->config().n_vocab, 0, true);
  EXPECT_THROW(e->step(bad_token), Error);
  Batch split;
  split.add(0, 1, 0, true);
  split.add(1, 1, 0, true);
  split.add(0, 1, 1, true);
  EXPECT_THROW(e->step(split), Error);
  Batch bad_slot;
  bad_slot.add(5, 1, 0, true);
  EXPECT_THROW(e->step(bad_slot), Error);
}

INSTANTIATE_TEST_SUITE_P(Archs, ForwardTest,
                         ::testing::Values(model::Arch::kQwen35, model::Arch::kQwen35Moe),
                         [](const auto& info) {
                           return info.param == model::Arch::kQwen35 ? "dense" : "moe";
                         });

// Fused layouts (attn_qkv for attention layers, ffn_gate_up_exps) built from the split tensors of
// the same file must give the same logits.
TEST(ForwardFused, FusedLayoutsEqualSplit) {
  using testing_support::TensorData;
  const std::string split = testing_support::write_tiny(model::Arch::kQwen35Moe, "fused_src.gguf");
  const std::string fused = testing_support::temp_path("fused_dst.gguf");
  testing_support::rewrite(
      split, fused, [](auto&, std::map<std::string, TensorData>& t, auto& order) {
        for (int il = 0; il < 4; ++il) {
          const std::string p = "blk." + std::to_string(il) + ".";
          if (t.count(p + "attn_q.weight")) {
            // Rows of [in, out] tensors are contiguous output units: concatenating q|k|v rows fuses
            // them.
            TensorData qkv = t[p + "attn_q.weight"];
            for (const char* part : {"attn_k.weight", "attn_v.weight"}) {
              const auto& src = t[p + part];
              qkv.bytes.insert(qkv.bytes.end(), src.bytes.begin(), src.bytes.end());
              qkv.ne[1] += src.ne[1];
              t.erase(p + part);
            }
            t.erase(p + "attn_q.weight");
            t[p + "attn_qkv.weight"] = qkv;
            order.push_back(p + "attn_qkv.weight");
          }
          // Per expert: gate rows then up rows.
          const auto& gate = t[p + "ffn_gate_exps.weight"];
          const auto& up = t[p + "ffn_up_exps.weight"];
          TensorData gu{gate.dtype, {gate.ne[0], 2 * gate.ne[1], gate.ne[2]}, {}};
          const size_t per = gate.bytes.size() / gate.ne[2];
          for (int64_t e = 0; e < gate.ne[2]; ++e) {
            gu.bytes.insert(gu.bytes.end(), gate.bytes.begin() + e * per,
                            gate.bytes.begin() + (e + 1) * per);
            gu.bytes.insert(gu.bytes.end(), up.bytes.begin() + e * per,
                            up.bytes.begin() + (e + 1) * per);
          }
          t.erase(p + "ffn_gate_exps.weight");
          t.erase(p + "ffn_up_exps.weight");
          t[p + "ffn_gate_up_exps.weight"] = gu;
          order.push_back(p + "ffn_gate_up_exps.weight");
        }
      });
  auto a = Engine::load(split);
  auto b = Engine::load(fused);
  const auto ids = random_tokens(10, a->config().n_vocab, 10);
  EXPECT_LT(rel_l2(run_chunks(*b, ids, 10), run_chunks(*a, ids, 10)), 1e-6);
}

}  // namespace
}  // namespace qwenrt
