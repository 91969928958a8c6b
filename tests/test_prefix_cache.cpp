// The prefix cache (gen/prefix_cache.h) and the scheduler resuming from it: the longest cached
// prefix is found and restored, a restored slot continues exactly like one that prefilled the
// whole prompt, eviction and spilling under budgets, and multi-turn chats (tool calls and
// reasoning in the history, thinking on and off, both architectures) give the same greedy tokens
// with the cache on and off while prefilling only each turn's new tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "chat/render.h"
#include "engine/engine.h"
#include "gen/prefix_cache.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "ops/cpu/isa.h"
#include "support/prefix_chat.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::gen {
namespace {

const std::string kDense = std::string(QWENRT_SOURCE_DIR) + "/models/qwen35-chat-tiny.Q8_0.gguf";
const std::string kMoe = std::string(QWENRT_SOURCE_DIR) + "/models/qwen35moe-chat-tiny.Q4_K_M.gguf";

// Bit-equal results whatever the chunking of a prompt: the delta rule in its recurrent form, and
// the cpu matmul below AVX-512 (a GEMV for every row count: see test_scheduler.cpp).
class ChunkingInvariant {
 public:
  ChunkingInvariant() {
    if (ops::cpu::active_isa() > ops::cpu::Isa::kAvx2)
      ops::cpu::set_isa_for_testing(ops::cpu::Isa::kAvx2);
  }
  ~ChunkingInvariant() { ops::cpu::set_isa_for_testing(ops::cpu::detected_isa()); }
};

std::unique_ptr<engine::Engine> load(const std::string& path, int n_slots, int64_t n_ctx,
                                     int64_t cache_kv_bytes = 0) {
  engine::EngineOptions eo;
  eo.backend = "cpu";
  eo.n_threads = 1;
  eo.n_slots = n_slots;
  eo.n_ctx = n_ctx;
  eo.deltanet_mode = ops::DeltaNetMode::kRecurrent;
  eo.cache_kv_bytes = cache_kv_bytes;
  return engine::Engine::load(path, eo);
}

std::vector<int32_t> tokens_of(const tokenizer::Tokenizer& tok, const std::string& text) {
  return tok.encode(text, true);
}

// Logits of the last row after feeding tokens[from, end) into `slot` (which holds tokens[0, from)).
std::vector<float> feed(engine::Engine& e, int slot, const std::vector<int32_t>& tokens,
                        size_t from) {
  engine::Batch b;
  for (size_t i = from; i < tokens.size(); ++i)
    b.add(slot, tokens[i], static_cast<int32_t>(i), i + 1 == tokens.size());
  return e.step(b);
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = load(kDense, 2, 512);
    tok_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(engine_->file()));
    long_ = tokens_of(*tok_,
                      "<|im_start|>user\nThe quick brown fox jumps over the lazy dog, then it runs "
                      "far into the old forest where the trees are tall and the rivers are "
                      "cold.<|im_end|>\n<|im_start|>assistant\nIt ran.<|im_end|>\n");
    ASSERT_GT(long_.size(), 40u);
  }
  std::vector<int32_t> prefix(size_t n) const { return {long_.begin(), long_.begin() + n}; }

  ChunkingInvariant invariant_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::vector<int32_t> long_;
};

TEST_F(PrefixCacheTest, ARestoredPrefixContinuesLikeTheWholePrompt) {
  auto& states = engine_->states();
  PrefixCache cache(states, {});
  const std::vector<int32_t> head = prefix(20);
  feed(*engine_, 0, head, 0);
  cache.insert(0, head);
  states.reset(0);

  // Slot 1 resumes from the 20 cached tokens and prefills the rest.
  EXPECT_EQ(cache.restore_longest(1, long_), 20);
  EXPECT_EQ(states.n_tokens(1), 20);
  const auto resumed = feed(*engine_, 1, long_, 20);
  // Slot 0 prefills everything.
  const auto whole = feed(*engine_, 0, long_, 0);
  ASSERT_EQ(resumed.size(), whole.size());
  EXPECT_EQ(resumed, whole) << "resumed logits differ from a whole prefill";
  const auto st = cache.stats();
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.hit_tokens, 20u);
  EXPECT_EQ(st.entries, 1);
  EXPECT_GT(st.state_bytes, 0);
}

TEST_F(PrefixCacheTest, TheLongestUsablePrefixWinsAndTokensAreCompared) {
  auto& states = engine_->states();
  PrefixCache cache(states, {});
  for (size_t n : {8u, 16u, 24u}) {
    states.reset(0);
    feed(*engine_, 0, prefix(n), 0);
    cache.insert(0, prefix(n));
  }
  EXPECT_EQ(cache.longest(long_), 24);
  EXPECT_EQ(cache.longest(prefix(20)), 16) << "the entry of 24 is longer than the prompt";
  EXPECT_EQ(cache.longest(prefix(24)), 16) << "a prompt equal to an entry needs one token left";
  EXPECT_EQ(cache.longest(prefix(25)), 24);
  std::vector<int32_t> other = long_;
  other[10] = other[10] == 7 ? 8 : 7;  // differs inside the entries of 16 and 24
  EXPECT_EQ(cache.longest(other), 8);
  other[3] = other[3] == 7 ? 8 : 7;
  EXPECT_EQ(cache.longest(other), 0);
  EXPECT_EQ(cache.restore_longest(1, other), 0);
  EXPECT_EQ(states.n_tokens(1), 0) << "a miss leaves the slot as it was";
  EXPECT_EQ(cache.stats().lookups, 1u);
  EXPECT_EQ(cache.stats().hits, 0u);
  // Inserting the same tokens again keeps one entry.
  states.reset(0);
  feed(*engine_, 0, prefix(8), 0);
  cache.insert(0, prefix(8));
  EXPECT_EQ(cache.stats().entries, 3);
  // An entry must name exactly what the slot holds.
  EXPECT_THROW(cache.insert(0, prefix(9)), Error);
}

TEST_F(PrefixCacheTest, MakeRoomEvictsLeastRecentlyUsedFirst) {
  auto& states = engine_->states();
  PrefixCache cache(states, {});
  const std::vector<int32_t> a = prefix(30);
  std::vector<int32_t> b = prefix(30);
  b[0] = b[0] == 5 ? 6 : 5;  // another conversation: no pages in common with a
  for (const std::vector<int32_t>* t : {&a, static_cast<const std::vector<int32_t>*>(&b)}) {
    states.reset(0);
    feed(*engine_, 0, *t, 0);
    cache.insert(0, *t);
  }
  states.reset(0);
  cache.restore_longest(1, long_);  // uses a: b is now the least recently used
  states.reset(1);
  const int64_t free_before = states.free_pages(state::Track::kTrunk);
  EXPECT_TRUE(cache.make_room(free_before + 1));
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_GT(states.free_pages(state::Track::kTrunk), free_before) << "b's page came back";
  EXPECT_EQ(cache.longest(long_), 30) << "a is still there";
  std::vector<int32_t> b_long = b;
  b_long.push_back(1);
  EXPECT_EQ(cache.longest(b_long), 0) << "b is gone";
  // Asking for more than the pool holds empties the cache and says so.
  EXPECT_FALSE(cache.make_room(1 << 20));
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_EQ(states.pages_in_use(state::Track::kTrunk), 0);
}

TEST_F(PrefixCacheTest, OverTheStateBudgetEntriesSpillToHostThenGo) {
  auto& states = engine_->states();
  const int64_t one = states.recurrent_bytes();
  ASSERT_GT(one, 0);
  // Room for one snapshot in backend memory and one on the host.
  PrefixCache cache(states, {.state_bytes = one, .host_bytes = one});
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = prefix(12 + 4 * i);
    p[0] = 100 + i;
    prompts.push_back(p);
    states.reset(0);
    feed(*engine_, 0, p, 0);
    cache.insert(0, p);
  }
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 2) << "the oldest was evicted when the host was full too";
  EXPECT_EQ(st.spills, 2u);
  EXPECT_EQ(st.state_bytes, one);
  EXPECT_EQ(st.host_bytes, one);
  EXPECT_EQ(st.evictions, 1u);

  // The spilled entry (prompts[1]) restores from host memory exactly like a fresh prefill.
  std::vector<int32_t> longer = prompts[1];
  longer.insert(longer.end(), long_.begin() + longer.size(), long_.end());
  states.reset(0);
  ASSERT_EQ(cache.restore_longest(1, longer), static_cast<int64_t>(prompts[1].size()));
  const auto resumed = feed(*engine_, 1, longer, prompts[1].size());
  const auto whole = feed(*engine_, 0, longer, 0);
  EXPECT_EQ(resumed, whole);
  EXPECT_EQ(cache.longest(prompts[0]), 0);
}

// ---- the scheduler ----------------------------------------------------------------------------

struct ChatCase {
  const char* name;
  const char* model;
  bool thinking;
};

class PrefixCacheChat : public ::testing::TestWithParam<ChatCase> {};

// The recorded agent-style conversation of support/prefix_chat.h, played with the cache off and on:
// the same greedy tokens every turn; with the cache, each turn after the first prefills at most its
// new tokens plus one page.
TEST_P(PrefixCacheChat, SameTokensWithTheCacheOnAndOffAndOnlyNewTokensPrefilled) {
  const ChatCase& c = GetParam();
  ChunkingInvariant invariant;
  const std::string path = std::string(QWENRT_SOURCE_DIR) + "/" + c.model;
  auto engine_off = load(path, 1, 2048);
  auto engine_on = load(path, 1, 2048, int64_t{8} << 20);
  const auto tok = tokenizer::Tokenizer::from_gguf(engine_on->file());
  SchedulerOptions so;
  so.prefix_cache = false;
  Scheduler off(*engine_off, tok, so);
  so.prefix_cache = true;
  so.cache.snapshot_every_pages = 2;
  Scheduler on(*engine_on, tok, so);
  const auto runs = testing_support::run_agent_chat(
      off, on, tok, chat::dialect_for(engine_on->identity().checkpoint), c.thinking);
  EXPECT_GT(on.stats().cache.hits, 0u);
  EXPECT_GT(on.stats().cache.inserts, 0u);
  EXPECT_EQ(off.stats().cache.lookups, 0u);
  for (size_t t = 0; t < runs.off.size(); ++t)
    EXPECT_EQ(runs.on[t].tokens, runs.off[t].tokens) << "turn " << t << ": greedy tokens differ";
  testing_support::expect_only_new_tokens_prefilled(runs, c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PrefixCacheChat,
    ::testing::Values(ChatCase{"dense_thinking", "models/qwen35-chat-tiny.Q8_0.gguf", true},
                      ChatCase{"dense_no_thinking", "models/qwen35-chat-tiny.Q8_0.gguf", false},
                      ChatCase{"moe_thinking", "models/qwen35moe-chat-tiny.Q4_K_M.gguf", true},
                      ChatCase{"moe_no_thinking", "models/qwen35moe-chat-tiny.Q4_K_M.gguf", false}),
    [](const auto& info) { return std::string(info.param.name); });

// Evictions (no KV room beyond the slots' own), spills (state budget of one snapshot) and several
// sequences at once: the tokens stay those of the uncached run.
TEST(PrefixCacheScheduler, UnderTightBudgetsTheTokensStayTheSame) {
  ChunkingInvariant invariant;
  std::vector<std::vector<std::vector<int32_t>>> runs;
  for (bool cached : {false, true}) {
    auto engine = load(kMoe, 2, 256);
    const auto tok = tokenizer::Tokenizer::from_gguf(engine->file());
    SchedulerOptions so;
    so.prefix_cache = cached;
    so.cache.state_bytes = engine->states().recurrent_bytes();
    so.cache.host_bytes = engine->states().recurrent_bytes();
    so.cache.snapshot_every_pages = 1;
    Scheduler s(*engine, tok, so);
    std::vector<std::vector<int32_t>> out(8);
    std::string shared = "<|im_start|>system\n";
    for (int k = 0; k < 4; ++k)
      shared +=
          "You answer questions about the sea, the sky and the hills in short plain "
          "sentences, one idea at a time. ";
    shared += "<|im_end|>\n";  // longer than a page: its first page's snapshot is shared
    for (int i = 0; i < 8; ++i) {
      SequenceParams p;
      p.prompt = tok.encode(shared + "<|im_start|>user\nTell me about " +
                                std::string(i % 2 ? "the sea" : "hills") + " number " +
                                std::to_string(i % 3) + "<|im_end|>\n<|im_start|>assistant\n",
                            true);
      p.max_tokens = 40;
      p.sampling.temperature = 0;
      s.submit(p, [&out, i](SequenceUpdate&& u) {
        out[i].insert(out[i].end(), u.tokens.begin(), u.tokens.end());
      });
    }
    while (s.step()) {
    }
    const auto st = s.stats();
    if (cached) {
      EXPECT_GT(st.cache.hits, 0u);
      EXPECT_GT(st.cache.spills, 0u);
      EXPECT_GT(st.cache.evictions, 0u);
    }
    EXPECT_EQ(st.running, 0);
    runs.push_back(std::move(out));
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(runs[1][i], runs[0][i]) << "sequence " << i;
}

// Two sequences of one prompt submitted together (n > 1): the second waits for the first's
// snapshots (the system prompt's end, then the last message's start, waited for while that gains
// a page or more) and prefills at most a page of the prompt.
TEST(PrefixCacheScheduler, SiblingsOfOnePromptShareItsPrefill) {
  auto engine = load(kDense, 2, 512);
  const auto tok = tokenizer::Tokenizer::from_gguf(engine->file());
  SchedulerOptions so;
  so.prefix_cache = true;
  Scheduler s(*engine, tok, so);
  std::string system;
  for (int i = 0; i < 8; ++i)
    system += "A long shared system prompt that both siblings carry before the question. ";
  const auto prompt = tok.encode("<|im_start|>system\n" + system +
                                     "<|im_end|>\n<|im_start|>user\nWhy is the sky blue?<|im_end|>"
                                     "\n<|im_start|>assistant\n",
                                 true);
  std::vector<int64_t> cached(2, -1);
  for (int i = 0; i < 2; ++i) {
    SequenceParams p;
    p.prompt = prompt;
    p.max_tokens = 4;
    p.sampling.temperature = 0;
    s.submit(p, [&cached, i](SequenceUpdate&& u) {
      if (u.done) cached[i] = u.n_cached;
    });
  }
  while (s.step()) {
  }
  EXPECT_EQ(cached[0], 0);
  const auto size = static_cast<int64_t>(prompt.size());
  EXPECT_GE(cached[1], size - 64) << "prompt " << size;
  EXPECT_LT(cached[1], size);
  EXPECT_GE(cached[1], 64) << "a page at least: worth waiting for";
}

}  // namespace
}  // namespace qwenrt::gen
