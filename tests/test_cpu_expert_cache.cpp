// Routed experts streamed from the file (ops/cpu/expert_cache.h): the logits with the cache equal
// those with every expert mapped, bit for bit, at budgets from one token's experts (rounds of a
// few experts per MoE call) to all of them; the counters add up; a budget below one token's
// experts is refused naming the sizes.
#include <gtest/gtest.h>

#include <set>

#include "engine/engine.h"
#include "support/engine_steps.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

// Prefill of 24 tokens, then 8 decode steps; every step's logits.
std::vector<float> run(const std::string& path, int64_t cache_bytes, ops::ExpertStats* stats) {
  engine::EngineOptions o;
  o.backend = "cpu";
  o.n_threads = 2;
  o.expert_cache_bytes = cache_bytes;
  auto e = engine::Engine::load(path, o);
  const auto all = testing_support::prefill_then_decode(
      *e, testing_support::random_tokens(32, e->config().n_vocab, 5), 24);
  if (stats) *stats = e->backend().expert_stats();
  return all;
}

// Bytes of one expert slot of the tiny file (gate, up, down of one expert, each 64-byte aligned;
// raw: as read from the file).
int64_t slot_bytes(const std::string& path, bool aligned = true) {
  gguf::File f = gguf::File::open(path).value();
  int64_t slot = 0;
  for (const char* t :
       {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"}) {
    const gguf::TensorInfo* info = f.find_tensor(t);
    if (!info) continue;
    const int64_t bytes = static_cast<int64_t>(info->n_bytes / info->ne[2]);
    slot += aligned ? (bytes + 63) / 64 * 64 : bytes;
  }
  return slot;
}

TEST(ExpertCache, StreamedEqualsMappedBitForBit) {
  const std::string path = testing_support::write_tiny(model::Arch::kQwen35Moe, "stream_moe.gguf");
  const auto cfg = engine::Engine::load(path, {.backend = "ref"})->config();
  const int64_t slot = slot_bytes(path);
  ASSERT_GT(slot, 0);
  const auto mapped = run(path, 0, nullptr);
  for (int slots : {cfg.n_expert_used, cfg.n_expert_used + 1, cfg.n_expert * cfg.n_layer}) {
    ops::ExpertStats st;
    const auto streamed = run(path, slots * slot, &st);
    ASSERT_EQ(streamed.size(), mapped.size());
    EXPECT_TRUE(streamed == mapped) << slots << " slots: logits differ";
    EXPECT_EQ(st.capacity, slots);
    EXPECT_GT(st.lookups, 0);
    EXPECT_LE(st.hits, st.lookups);
    EXPECT_GE(st.loads, st.lookups - st.hits);
    EXPECT_EQ(st.bytes_read, st.loads * slot_bytes(path, false));
    if (slots == cfg.n_expert * cfg.n_layer) {
      // Room for every expert: each is read once at most.
      EXPECT_LE(st.loads, cfg.n_expert * cfg.n_layer);
      EXPECT_GT(st.hits, 0);
    }
  }
}

TEST(ExpertCache, BudgetBelowOneTokenIsRefused) {
  const std::string path =
      testing_support::write_tiny(model::Arch::kQwen35Moe, "stream_small.gguf");
  const auto cfg = engine::Engine::load(path, {.backend = "ref"})->config();
  try {
    run(path, (cfg.n_expert_used - 1) * slot_bytes(path), nullptr);
    ADD_FAILURE() << "a budget below one token's experts should be refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("expert cache"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("one token needs {}", cfg.n_expert_used)), std::string::npos)
        << what;
  }
  try {
    engine::EngineOptions o;
    o.backend = "ref";
    o.expert_cache_bytes = 1 << 30;
    engine::Engine::load(path, o);
    ADD_FAILURE() << "the ref backend does not stream";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot stream experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qwenrt
