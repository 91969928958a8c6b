// The sequence scheduler (continuous batching) on real tiny models: a sequence gives the same
// tokens alone or in any batch, one engine step per iteration carries every running sequence,
// log-probabilities against the engine's logits, forced text after thinking, the thinking budget
// and prepare_turn. Cancel, queue, shutdown, validation and threads: test_scheduler_lifecycle.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "chat/parse.h"
#include "chat/prompt.h"
#include "chat/render.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "ops/cpu/isa.h"
#include "support/isa_cap.h"
#include "support/scheduler_fixture.h"
#include "tokenizer/utf8.h"

namespace qwenrt::gen {
namespace {

// tests/support/scheduler_fixture.h
using testing_support::collect;
using testing_support::Outcome;
using testing_support::run_until_idle;
using testing_support::SchedulerTest;
using testing_support::WatchedOps;

const std::string kChatModel =
    std::string(QWENRT_SOURCE_DIR) + "/models/qwen35-chat-tiny.Q8_0.gguf";

// How close (in nats) the alone run's two best tokens may be where a batch on the cpu matmul's
// GEMM (n >= 4 rows at AVX-512) picks the other one; the logits move by up to ~0.15 once an int8
// activation rounds the other way (measured on the dense fixture).
constexpr float kNearTie = 0.5f;

// --- batch invariance --------------------------------------------------------------------------

using testing_support::MatmulIsaCap;  // tests/support/isa_cap.h says why it is there

struct BatchCase {
  const char* name;
  const char* backend;
  bool cap_matmul;  // the cpu matmul below AVX-512 (GEMV for every n)
  // The dense fixture by default; cuda runs the tiny chat model (its attention kernels take
  // head_dim 64, the fixture's is 16).
  const char* model = nullptr;
};

class SchedulerBatchTest : public SchedulerTest, public ::testing::WithParamInterface<BatchCase> {};

TEST_P(SchedulerBatchTest, GreedyTokensDoNotDependOnTheBatch) {
  const BatchCase c = GetParam();
  const bool cuda = std::string(c.backend) == "cuda";
  if (cuda && !ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (c.model) use_model(std::string(QWENRT_SOURCE_DIR) + "/" + c.model);
  const bool ref = std::string(c.backend) == "ref";
  std::optional<MatmulIsaCap> cap;
  if (c.cap_matmul) cap.emplace(ops::cpu::Isa::kAvx2);
  // Bit-equal batches unless the cpu matmul switches kernels with the batch size (see above).
  // cuda's kernels also change with the number of rows: held to the near-tie rule below.
  const bool exact = ref || (!cuda && ops::cpu::active_isa() < ops::cpu::Isa::kAvx512);
  const int n_seq = ref ? 12 : 32, n_tokens = ref ? 6 : 10;
  auto small = load({.backend = c.backend}, 8);
  auto wide = load({.backend = c.backend}, n_seq);
  // Alone: one at a time through the 8-slot scheduler (with the best alternatives, to see how
  // close a divergence was).
  std::vector<Outcome> alone(n_seq);
  {
    Scheduler s(*small, *tokenizer_);
    for (int i = 0; i < n_seq; ++i) {
      auto p = greedy(prompt(i), n_tokens);
      p.top_logprobs = 4;
      s.submit(p, collect(alone[i]));
      run_until_idle(s);
      ASSERT_EQ(alone[i].dones, 1);
      ASSERT_EQ(alone[i].tokens.size(), size_t(n_tokens));
      EXPECT_EQ(alone[i].text, tokenizer::utf8_lossy(tokenizer_->decode(alone[i].tokens)));
    }
  }
  // Independently of the scheduler: the first sequences' greedy tokens are the argmax of the
  // engine's logits over the whole sequence in one prefill.
  for (int i = 0; i < (cuda ? 0 : 3); ++i) {
    const auto p = prompt(i);
    std::vector<int32_t> seq = p;
    seq.insert(seq.end(), alone[i].tokens.begin(), alone[i].tokens.end());
    small->states().reset(0);
    engine::Batch b;
    for (size_t j = 0; j < seq.size(); ++j)
      b.add(0, seq[j], static_cast<int32_t>(j), j + 1 >= p.size());
    const auto logits = small->step(b);
    const int V = small->config().n_vocab;
    for (int t = 0; t < n_tokens; ++t) {
      std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
      row[im_end_] -= 100.0f;
      row[eot_] -= 100.0f;
      EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), alone[i].tokens[t])
          << "sequence " << i << " token " << t;
    }
  }
  small->states().reset(0);
  int diverged = 0;
  for (engine::Engine* e : {small.get(), wide.get()}) {
    const int n_slots = e->states().n_slots();
    Scheduler s(*e, *tokenizer_);
    std::vector<Outcome> together(n_seq);
    for (int i = 0; i < n_seq; ++i) s.submit(greedy(prompt(i), n_tokens), collect(together[i]));
    EXPECT_EQ(s.stats().queued, n_seq);
    ASSERT_TRUE(s.step());
    EXPECT_EQ(s.stats().running, std::min(n_slots, n_seq));
    EXPECT_EQ(s.stats().queued, std::max(0, n_seq - n_slots));
    run_until_idle(s);
    for (int i = 0; i < n_seq; ++i) {
      EXPECT_EQ(together[i].dones, 1);
      EXPECT_EQ(together[i].last.finish, FinishReason::kLength);
      ASSERT_EQ(together[i].tokens.size(), size_t(n_tokens));
      if (exact) {
        EXPECT_EQ(together[i].tokens, alone[i].tokens) << n_slots << " slots, sequence " << i;
        EXPECT_EQ(together[i].text, alone[i].text) << n_slots << " slots, sequence " << i;
        continue;
      }
      // The GEMM / GEMV split: equal up to a first difference, and that only where the alone
      // run's two best tokens (stop tokens aside) were within a rounding-and-requantisation
      // distance, with the batch taking the runner-up.
      const auto d = std::mismatch(together[i].tokens.begin(), together[i].tokens.end(),
                                   alone[i].tokens.begin())
                         .first -
                     together[i].tokens.begin();
      if (d == n_tokens) {
        EXPECT_EQ(together[i].text, alone[i].text);
        continue;
      }
      ++diverged;
      std::vector<std::pair<int32_t, float>> best;
      for (const auto& alt : alone[i].logprobs[d].top)
        if (alt.first != im_end_ && alt.first != eot_) best.push_back(alt);
      ASSERT_GE(best.size(), 2u);
      EXPECT_EQ(best[0].first, alone[i].tokens[d]);
      EXPECT_EQ(best[1].first, together[i].tokens[d]) << n_slots << " slots, sequence " << i;
      EXPECT_LT(best[0].second - best[1].second, kNearTie)
          << n_slots << " slots, sequence " << i << " token " << d;
      std::printf(
          "[ note ] %d slots, sequence %d: first difference at token %ld, alone margin "
          "%.4f nats\n",
          n_slots, i, long(d), best[0].second - best[1].second);
    }
    const auto st = s.stats();
    EXPECT_EQ(st.finished, uint64_t(n_seq));
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.kv_pages_in_use, 0);
    EXPECT_EQ(st.generated_tokens, uint64_t(n_seq * n_tokens));
  }
  // Most sequences must still agree exactly, or this is not a near-tie effect.
  EXPECT_LE(diverged, 2 * n_seq / 8);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, SchedulerBatchTest,
    ::testing::Values(BatchCase{"ref", "ref", false}, BatchCase{"cpu_gemv", "cpu", true},
                      BatchCase{"cpu_native", "cpu", false},
                      BatchCase{"cpu_native_chat", "cpu", false,
                                "models/qwen35-chat-tiny.Q8_0.gguf"},
                      BatchCase{"cuda", "cuda", false, "models/qwen35-chat-tiny.Q8_0.gguf"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(SchedulerTest, SeededSequencesAreTheSameAloneAndInABatch) {
  const MatmulIsaCap cap(ops::cpu::Isa::kAvx2);  // bit-equal batches (see MatmulIsaCap)
  auto e = load({}, 8);
  auto seeded = [&](int i, uint64_t seed) {
    SequenceParams sp;
    sp.prompt = prompt(i);
    sp.max_tokens = 16;
    sp.sampling.temperature = 1.2f;
    sp.sampling.top_k = 50;
    sp.sampling.seed = seed;
    sp.sampling.logit_bias = {{im_end_, -100.0f}, {eot_, -100.0f}};
    return sp;
  };
  Scheduler s(*e, *tokenizer_);
  Outcome a, b;
  s.submit(seeded(0, 7), collect(a));
  run_until_idle(s);
  s.submit(seeded(0, 8), collect(b));
  run_until_idle(s);
  ASSERT_EQ(a.tokens.size(), 16u);
  ASSERT_EQ(b.tokens.size(), 16u);
  EXPECT_NE(a.tokens, b.tokens) << "different seeds gave the same 16 tokens";
  // Together with greedy and other seeded sequences (some on the same prompt), in any order.
  std::vector<Outcome> mix(6);
  Outcome a2, b2;
  s.submit(seeded(3, 1), collect(mix[0]));
  s.submit(greedy(prompt(0), 16), collect(mix[1]));
  s.submit(seeded(0, 8), collect(b2));
  s.submit(seeded(0, 9), collect(mix[2]));
  s.submit(seeded(5, 7), collect(mix[3]));
  s.submit(seeded(0, 7), collect(a2));
  s.submit(seeded(1, 2), collect(mix[4]));
  run_until_idle(s);
  EXPECT_EQ(a2.tokens, a.tokens);
  EXPECT_EQ(a2.text, a.text);
  EXPECT_EQ(b2.tokens, b.tokens);
  EXPECT_NE(mix[2].tokens, a.tokens);
  // Hot sampling wanders into byte tokens: every update still carries whole characters.
  for (const Outcome* x : {&a, &b, &a2, &b2, &mix[0], &mix[2], &mix[3], &mix[4]}) {
    EXPECT_FALSE(x->split_character);
    EXPECT_EQ(x->text, tokenizer::utf8_lossy(tokenizer_->decode(x->tokens)));
  }
}

// --- one step per iteration --------------------------------------------------------------------

TEST_F(SchedulerTest, OneEngineStepCarriesEveryRunningSequence) {
  const MatmulIsaCap cap(ops::cpu::Isa::kAvx2);  // bit-equal batches (see MatmulIsaCap)
  WatchedOps::Log log;
  auto e = load(
      {.make_backend = [&] { return std::make_unique<WatchedOps>(ops::make_cpu_ops(0), &log); }},
      8);
  const int kBudget = 16;
  Scheduler s(*e, *tokenizer_, {.step_tokens = kBudget});
  std::vector<Outcome> out(5);
  for (int i = 0; i < 4; ++i) s.submit(greedy(prompt(i), 40), collect(out[i]));
  // Prefill the four short prompts (each shorter than the budget, so at most two steps).
  while (
      std::any_of(out.begin(), out.begin() + 4, [](const Outcome& o) { return o.tokens.empty(); }))
    ASSERT_TRUE(s.step());
  std::vector<int32_t> long_prompt = prompt(7);
  while (long_prompt.size() < 70) {
    const auto more = prompt(int(long_prompt.size()) % 8);
    long_prompt.insert(long_prompt.end(), more.begin(), more.end());
  }
  s.submit(greedy(long_prompt, 4), collect(out[4]));
  const size_t first = log.steps.size();
  int iterations = 0;
  while (out[4].tokens.empty()) {
    const size_t steps = log.steps.size();
    const int samples = log.samples;
    ASSERT_TRUE(s.step());
    ++iterations;
    EXPECT_EQ(log.steps.size(), steps + 1) << "one engine step per iteration";
    EXPECT_EQ(log.samples, samples + 1) << "one sampling call per iteration";
  }
  // Every one of those steps: the four decode rows first (one token each, each wanting a sample),
  // then a chunk of the long prompt filling the budget (the last chunk may be shorter).
  size_t fed = 0;
  for (size_t k = first; k < log.steps.size(); ++k) {
    const auto& st = log.steps[k];
    ASSERT_EQ(st.spans.size(), 5u) << "step " << k;
    for (int j = 0; j < 4; ++j) EXPECT_EQ(st.spans[j].count, 1) << "step " << k;
    EXPECT_EQ(st.spans[4].slot, 4);
    EXPECT_EQ(st.spans[4].n_past, int32_t(fed));
    fed += st.spans[4].count;
    EXPECT_LE(st.n, kBudget);
    if (fed < long_prompt.size()) {
      EXPECT_EQ(st.n, kBudget) << "a prompt chunk fills what the decode rows leave";
      EXPECT_EQ(st.n_output_rows, 4);
    } else {
      EXPECT_EQ(st.n_output_rows, 5);
    }
  }
  EXPECT_EQ(fed, long_prompt.size());
  EXPECT_EQ(iterations, int((long_prompt.size() + kBudget - 5) / (kBudget - 4)));
  // The decoding sequences advanced once per iteration while the long prompt was read.
  for (int i = 0; i < 4; ++i) EXPECT_GE(out[i].tokens.size(), size_t(1 + iterations));
  run_until_idle(s);
  // The chunked prompt's tokens are those it gives alone (one chunk, nothing else running).
  Outcome alone;
  s.submit(greedy(long_prompt, 4), collect(alone));
  run_until_idle(s);
  EXPECT_EQ(out[4].tokens, alone.tokens);
}

// --- log-probabilities -------------------------------------------------------------------------

TEST_F(SchedulerTest, LogprobsAreTheLogSoftmaxOfTheEngineLogits) {
  const MatmulIsaCap cap(ops::cpu::Isa::kAvx2);  // bit-equal batches (see MatmulIsaCap)
  auto e = load({}, 4);
  Scheduler s(*e, *tokenizer_);
  auto p = greedy(prompt(2), 8);
  p.top_logprobs = 5;
  Outcome a;
  s.submit(p, collect(a));
  run_until_idle(s);
  ASSERT_EQ(a.tokens.size(), 8u);
  ASSERT_EQ(a.logprobs.size(), 8u);
  // The same steps by hand: the prompt in one chunk, then each token, logits out.
  const int V = e->config().n_vocab;
  e->states().reset(0);
  engine::Batch b;
  for (size_t j = 0; j < p.prompt.size(); ++j)
    b.add(0, p.prompt[j], static_cast<int32_t>(j), j + 1 == p.prompt.size());
  std::vector<float> logits = e->step(b);
  for (size_t t = 0; t < a.tokens.size(); ++t) {
    const auto lsm = log_softmax(logits.data(), V);
    const TokenLogprob& lp = a.logprobs[t];
    EXPECT_EQ(lp.id, a.tokens[t]);
    EXPECT_NEAR(lp.logprob, lsm[lp.id], 1e-4) << "token " << t;
    ASSERT_EQ(lp.top.size(), 5u);
    std::vector<int> order(V);
    for (int i = 0; i < V; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int x, int y) { return lsm[x] > lsm[y]; });
    for (int k = 0; k < 5; ++k) {
      EXPECT_NEAR(lp.top[k].second, lsm[lp.top[k].first], 1e-4) << "token " << t << " top " << k;
      EXPECT_NEAR(lp.top[k].second, lsm[order[k]], 1e-4) << "token " << t << " top " << k;
      if (k > 0) {
        EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
      }
    }
    // Greedy with the stop tokens biased away: the token is the best of the rest.
    for (const auto& [id, lpv] : lp.top) {
      if (id == im_end_ || id == eot_) continue;
      EXPECT_EQ(id, lp.id);
      break;
    }
    b.clear();
    b.add(0, a.tokens[t], static_cast<int32_t>(p.prompt.size() + t), true);
    logits = e->step(b);
  }
  // In a batch with other settings: each gets its own number of alternatives, or none.
  e->states().reset(0);
  Outcome a2, two, none;
  auto p2 = greedy(prompt(3), 8);
  p2.top_logprobs = 2;
  s.submit(p2, collect(two));
  s.submit(p, collect(a2));
  s.submit(greedy(prompt(4), 8), collect(none));
  auto p0 = greedy(prompt(5), 8);
  p0.top_logprobs = 0;
  Outcome zero;
  s.submit(p0, collect(zero));
  run_until_idle(s);
  ASSERT_EQ(a2.logprobs.size(), 8u);
  for (size_t t = 0; t < 8; ++t) {
    EXPECT_EQ(a2.logprobs[t].id, a.logprobs[t].id);
    EXPECT_NEAR(a2.logprobs[t].logprob, a.logprobs[t].logprob, 1e-4);
    ASSERT_EQ(a2.logprobs[t].top.size(), 5u);
  }
  ASSERT_EQ(two.logprobs.size(), 8u);
  for (const auto& lp : two.logprobs) EXPECT_EQ(lp.top.size(), 2u);
  EXPECT_TRUE(none.logprobs.empty());
  ASSERT_EQ(zero.logprobs.size(), 8u);
  for (const auto& lp : zero.logprobs) {
    EXPECT_TRUE(lp.top.empty());
    EXPECT_LT(lp.logprob, 0.0f);
  }
}

// --- thinking ----------------------------------------------------------------------------------

TEST_F(SchedulerTest, ForcedTextStartsAReplyOutsideThinking) {
  Scheduler s(*engine_, *tokenizer_);
  const std::string forced = "<tool_call>\n<function=get>\n";
  const auto forced_ids = tokenizer_->encode(forced, true);
  auto p = greedy(prompt(1), int(forced_ids.size()) + 4);
  p.forced_after_thinking = forced;
  p.top_logprobs = 3;
  Outcome o;
  s.submit(p, collect(o));
  run_until_idle(s);
  ASSERT_EQ(o.tokens.size(), forced_ids.size() + 4);
  EXPECT_TRUE(std::equal(forced_ids.begin(), forced_ids.end(), o.tokens.begin()));
  EXPECT_EQ(o.text.substr(0, forced.size()), forced);
  // Forced tokens were not sampled: logprob 0 and no alternatives; the sampled ones have both.
  ASSERT_EQ(o.logprobs.size(), o.tokens.size());
  for (size_t t = 0; t < o.tokens.size(); ++t) {
    EXPECT_EQ(o.logprobs[t].id, o.tokens[t]);
    if (t < forced_ids.size()) {
      EXPECT_EQ(o.logprobs[t].logprob, 0.0f);
      EXPECT_TRUE(o.logprobs[t].top.empty());
    } else {
      EXPECT_EQ(o.logprobs[t].top.size(), 3u);
      EXPECT_LT(o.logprobs[t].logprob, 0.0f);
    }
  }
}

TEST_F(SchedulerTest, ForcedTokensDrawNothingFromTheSampler) {
  WatchedOps::Log log;
  auto e = load(
      {.make_backend = [&] { return std::make_unique<WatchedOps>(ops::make_cpu_ops(0), &log); }});
  Scheduler s(*e, *tokenizer_);
  const std::string forced = "<tool_call>\n<function=get>\n";
  const auto forced_ids = tokenizer_->encode(forced, true);
  SequenceParams p;
  p.prompt = prompt(4);
  p.max_tokens = int(forced_ids.size()) + 6;
  p.forced_after_thinking = forced;
  p.sampling.temperature = 1.0f;
  p.sampling.seed = 1234;
  p.sampling.logit_bias = {{im_end_, -100.0f}, {eot_, -100.0f}};
  Outcome o;
  s.submit(p, collect(o));
  run_until_idle(s);
  ASSERT_EQ(o.tokens.size(), size_t(p.max_tokens));
  // Only the six sampled tokens drew, and they drew the seeded sequence from its start.
  sample::Sampler fresh(p.sampling);
  ASSERT_EQ(log.draws.size(), 6u);
  for (size_t k = 0; k < log.draws.size(); ++k) EXPECT_EQ(log.draws[k], fresh.next_row({}).u) << k;
  // The prompt (no sample: the reply starts forced), the forced run in one step whose last row
  // samples, then one step per sampled token (the last needs no step of its own).
  ASSERT_EQ(log.steps.size(), 7u);
  EXPECT_EQ(log.steps[0].n, int64_t(p.prompt.size()));
  EXPECT_EQ(log.steps[0].n_output_rows, 0);
  EXPECT_EQ(log.steps[1].n, int64_t(forced_ids.size()));
  EXPECT_EQ(log.steps[1].spans[0].n_past, int32_t(p.prompt.size()));
  for (size_t k = 1; k < log.steps.size(); ++k) EXPECT_EQ(log.steps[k].n_output_rows, 1) << k;

  // A thinking budget's forced close and the forced text after it: one step too, after the
  // budget's last sampled token.
  log = {};
  const auto close = tokenizer_->encode("\n</think>\n\n", true);
  p.starts_in_thinking = true;
  p.thinking_budget = 2;
  p.sampling.logit_bias[think_end_] = -100.0f;
  p.max_tokens = 2 + int(close.size() + forced_ids.size()) + 3;
  Outcome t;
  s.submit(p, collect(t));
  run_until_idle(s);
  ASSERT_EQ(t.tokens.size(), size_t(p.max_tokens));
  EXPECT_TRUE(std::equal(close.begin(), close.end(), t.tokens.begin() + 2));
  EXPECT_TRUE(
      std::equal(forced_ids.begin(), forced_ids.end(), t.tokens.begin() + 2 + close.size()));
  ASSERT_EQ(log.steps.size(), 1u + 1 + 1 + 2);  // prompt, 2nd sampled, forced run, 2 more
  EXPECT_EQ(log.steps[2].n, int64_t(1 + close.size() + forced_ids.size()));
  EXPECT_EQ(log.draws.size(), 2u + 3);
}

TEST_F(SchedulerTest, ForcedTextFollowsAGeneratedThinkEnd) {
  Scheduler s(*engine_, *tokenizer_);
  const std::string forced = "<tool_call>\n<function=get>\n";
  const auto forced_ids = tokenizer_->encode(forced, true);
  auto p = greedy(prompt(1), int(forced_ids.size()) + 3);
  p.starts_in_thinking = true;
  p.forced_after_thinking = forced;
  p.sampling.logit_bias[think_end_] = 100.0f;  // the first sampled token closes the thought
  Outcome o;
  s.submit(p, collect(o));
  run_until_idle(s);
  ASSERT_EQ(o.tokens.size(), forced_ids.size() + 3);
  EXPECT_EQ(o.tokens[0], think_end_);
  EXPECT_TRUE(std::equal(forced_ids.begin(), forced_ids.end(), o.tokens.begin() + 1));
  // Outside the think block a generated </think> forces nothing more.
  for (size_t t = 1 + forced_ids.size(); t < o.tokens.size(); ++t)
    EXPECT_EQ(o.tokens[t], think_end_);
}

TEST_F(SchedulerTest, ThinkingBudgetClosesTheThoughtThenForcesTheText) {
  Scheduler s(*engine_, *tokenizer_);
  const auto close = tokenizer_->encode("\n</think>\n\n", true);
  const std::string forced = "<tool_call>\n<function=get>\n";
  const auto forced_ids = tokenizer_->encode(forced, true);
  for (int budget : {0, 4}) {
    auto p = greedy(prompt(2), budget + int(close.size() + forced_ids.size()) + 2);
    p.starts_in_thinking = true;
    p.thinking_budget = budget;
    p.forced_after_thinking = forced;
    p.sampling.logit_bias[think_end_] = -100.0f;
    p.parse = chat::ReplyParserOptions{.starts_in_reasoning = true};
    Outcome o;
    s.submit(p, collect(o));
    run_until_idle(s);
    ASSERT_EQ(o.tokens.size(), size_t(p.max_tokens)) << "budget " << budget;
    for (int t = 0; t < budget; ++t) EXPECT_NE(o.tokens[t], think_end_);
    EXPECT_TRUE(std::equal(close.begin(), close.end(), o.tokens.begin() + budget))
        << "budget " << budget;
    EXPECT_TRUE(
        std::equal(forced_ids.begin(), forced_ids.end(), o.tokens.begin() + budget + close.size()))
        << "budget " << budget;
    // The reply read back: the thought, then a call to `get` that the token limit cut off.
    const chat::ParsedReply expect = chat::parse_reply(o.text, *p.parse);
    EXPECT_EQ(o.last.reply, expect);
    ASSERT_EQ(o.last.reply.tool_calls.size(), 1u) << o.text;
    EXPECT_EQ(o.last.reply.tool_calls[0].name, "get");
    std::string reasoning;
    for (const auto& ev : o.events)
      if (ev.kind == chat::ReplyEvent::Kind::kReasoning) reasoning += ev.text;
    EXPECT_EQ(reasoning, expect.reasoning);
    if (budget == 0) {
      EXPECT_EQ(expect.reasoning, "");
    }
  }
}

TEST_F(SchedulerTest, ParsedToolCallEndsOnTheStopToken) {
  Scheduler s(*engine_, *tokenizer_);
  const std::string call =
      "<tool_call>\n<function=get>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>";
  auto p = greedy(prompt(0), 100);
  p.forced_after_thinking = call;
  p.sampling.logit_bias = {{im_end_, 100.0f}};  // the model stops right after the forced call
  p.parse = chat::ReplyParserOptions{.starts_in_reasoning = false};
  Outcome o;
  s.submit(p, collect(o));
  run_until_idle(s);
  EXPECT_EQ(o.last.finish, FinishReason::kStopToken);
  EXPECT_EQ(o.text, call);
  ASSERT_EQ(o.last.reply.tool_calls.size(), 1u);
  EXPECT_EQ(o.last.reply.tool_calls[0].name, "get");
  EXPECT_EQ(o.last.reply.tool_calls[0].arguments, chat::Json({{"x", "1"}}));
  EXPECT_TRUE(o.last.reply.tool_calls[0].complete);
  bool begin = false, end = false;
  for (const auto& ev : o.events) {
    begin |= ev.kind == chat::ReplyEvent::Kind::kToolCallBegin;
    end |= ev.kind == chat::ReplyEvent::Kind::kToolCall;
  }
  EXPECT_TRUE(begin && end);
}

// --- prepare_turn ------------------------------------------------------------------------------

TEST(PrepareTurn, RendersAndTokenizesLikeTheChatModule) {
  auto e = engine::Engine::load(kChatModel, {.backend = "cpu", .n_ctx = 256});
  const auto tok = tokenizer::Tokenizer::from_gguf(e->file());
  const auto dialect = chat::dialect_for(e->identity().checkpoint);
  const chat::Json tools = chat::Json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get"},
          {"parameters", {{"type", "object"}, {"properties", {{"x", {{"type", "integer"}}}}}}}}}}});
  for (bool thinking : {true, false}) {
    ChatTurn turn{.messages = chat::Json::array({{{"role", "system"}, {"content", "Be brief."}},
                                                 {{"role", "user"}, {"content", "Hi there"}}}),
                  .tools = tools};
    turn.render.enable_thinking = thinking;
    const PreparedTurn p = prepare_turn(tok, dialect, turn);
    const std::string rendered = chat::render_chat(dialect, turn.messages, tools, turn.render);
    EXPECT_EQ(p.rendered, rendered);
    EXPECT_EQ(p.prompt, tok.encode(rendered, true)) << "no literal holds control-token text";
    EXPECT_EQ(p.thinking, thinking);
    EXPECT_EQ(p.thinking, rendered.ends_with("<think>\n"));
    EXPECT_EQ(p.parse.starts_in_reasoning, thinking);
    EXPECT_EQ(p.parse.tools, tools);
  }
  // User text that spells a control token stays text.
  ChatTurn turn{.messages =
                    chat::Json::array({{{"role", "user"}, {"content", "say <|im_end|> please"}}})};
  const PreparedTurn p = prepare_turn(tok, dialect, turn);
  EXPECT_EQ(p.prompt, chat::encode_prompt(tok, p.rendered, chat::literal_texts(turn.messages)));
  EXPECT_NE(p.prompt, tok.encode(p.rendered, true));
  // Invalid UTF-8 names the message.
  turn.messages.push_back({{"role", "assistant"}, {"content", "fine"}});
  turn.messages.push_back({{"role", "user"}, {"content", std::string("bad \xff byte")}});
  try {
    prepare_turn(tok, dialect, turn);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("message 2"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("UTF-8"), std::string::npos) << err.what();
  }
  // A prepared turn runs: the parser options come through to the done update's reply.
  Scheduler s(*e, tok);
  Outcome o;
  ChatTurn hi{.messages = chat::Json::array({{{"role", "user"}, {"content", "Hi"}}})};
  hi.render.enable_thinking = false;
  PreparedTurn ph = prepare_turn(tok, dialect, hi);
  SequenceParams sp{.prompt = ph.prompt, .max_tokens = 24, .parse = ph.parse};
  sp.sampling.temperature = 0;
  s.submit(sp, collect(o));
  while (s.step()) {
  }
  EXPECT_EQ(o.last.reply, chat::parse_reply(o.text, ph.parse));
}

}  // namespace
}  // namespace qwenrt::gen