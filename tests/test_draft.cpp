// Speculative decoding (gen/draft.h): the n-gram drafter, the depth controller, and exactness:
// greedy and seeded sampled outputs with drafting are token for token those without it, on the
// tiny trained models (dense and MoE), at depths 1..6, beside sequences that do not draft, across
// checks that end in a stop token, max tokens or a thinking budget.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gen/draft.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"
#include "support/draft_runs.h"
#include "support/isa_cap.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::gen {
namespace {

const std::string kRoot = std::string(QWENRT_SOURCE_DIR) + "/";

TEST(DraftNgram, ProposesWhatFollowedTheMostRecentLongestMatch) {
  std::vector<int32_t> out;
  // text: 1 2 3 4 5 | 9 2 3 7 8 | 2 3  -> the last 2 tokens (2 3) occurred at 1 and 6; the most
  // recent is at 6: drafts 7 8 2 (then the text ends).
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 9, 2, 3, 7, 8};
  draft_ngram(prompt, std::vector<int32_t>{2, 3}, 2, 4, 5, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8, 2, 3}));
  // A longer match wins over a more recent shorter one: 1 2 3 occurs once, at 0.
  draft_ngram(prompt, std::vector<int32_t>{1, 2, 3}, 2, 4, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 5, 9}));
  // At most `max` tokens.
  draft_ngram(prompt, std::vector<int32_t>{2, 3}, 2, 4, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7}));
  // No match of at least min_n tokens: nothing.
  draft_ngram(prompt, std::vector<int32_t>{6, 3}, 2, 4, 4, out);
  EXPECT_TRUE(out.empty());
  // With min_n 1 the single last token matches.
  draft_ngram(prompt, std::vector<int32_t>{6, 3}, 1, 4, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8}));
  draft_ngram({}, {}, 1, 4, 4, out);
  EXPECT_TRUE(out.empty());
  draft_ngram(prompt, {}, 2, 4, 0, out);
  EXPECT_TRUE(out.empty());
}

TEST(DraftController, GrowsShrinksAndPauses) {
  DraftController c(4);
  EXPECT_EQ(c.depth(), 4);
  c.record(4, 1);
  EXPECT_EQ(c.depth(), 2);
  c.record(2, 2);
  EXPECT_EQ(c.depth(), 3);
  for (int i = 0; i < DraftController::kMissesToPause; ++i) c.record(3, 0);
  for (int i = 0; i < DraftController::kPauseSteps; ++i) EXPECT_EQ(c.depth(), 0) << i;
  EXPECT_EQ(c.depth(), 1);
  c.record(0, 0);  // nothing drafted: no change
  EXPECT_EQ(c.depth(), 1);
  EXPECT_EQ(DraftController(0).depth(), 0);
}

TEST(DraftController, AcceptanceFollowsTheTestedDrafts) {
  DraftController c(4);
  EXPECT_DOUBLE_EQ(c.acceptance(), DraftController::kPriorAcceptance);
  c.record(4, 4);  // 4 tested, 4 held
  const double w = DraftController::kPriorWeight, p = DraftController::kPriorAcceptance;
  EXPECT_DOUBLE_EQ(c.acceptance(), (4 + p * w) / (4 + w));
  c.record(4, 1);  // the second draft missed: 2 tested, 1 held
  const double d = DraftController::kDecay;
  EXPECT_DOUBLE_EQ(c.acceptance(), (d * 4 + 1 + p * w) / (d * 4 + 2 + w));
  // Every first draft misses: towards p w / (1 / (1 - d) + w) = 1.2 / 12 (one draft tested a
  // check, the prior never forgotten).
  for (int i = 0; i < 60; ++i) c.record(3, 0);
  EXPECT_NEAR(c.acceptance(), p * w / (1 / (1 - d) + w), 1e-3);
  for (int i = 0; i < 60; ++i) c.record(3, 3);
  EXPECT_GT(c.acceptance(), 0.9);
}

// Records `seconds` for a step of `rows` rows as a measured cost: the warm-up steps first, with a
// cost the model must not count.
void measure(DraftCostModel& m, int64_t rows, double seconds) {
  for (int i = 0; i < DraftCostModel::kWarmupSteps; ++i) m.record_step(rows, 100 * seconds);
  m.record_step(rows, seconds);
}

TEST(DraftCostModel, MeasuresThePlainStepThenOneDraft) {
  DraftCostModel m;
  EXPECT_EQ(m.depth(4, 0.9, 0), 0) << "nothing measured: a plain step";
  for (int i = 0; i < DraftCostModel::kWarmupSteps; ++i) m.record_step(1, 1e-3);
  EXPECT_EQ(m.depth(4, 0.9, 0), 0) << "only warm-up steps of one row";
  m.record_step(1, 1e-3);
  EXPECT_DOUBLE_EQ(m.cost(1), 1e-3);
  EXPECT_LT(m.cost(2), 0) << "two rows: no estimate from one row count";
  EXPECT_EQ(m.depth(4, 0.9, 0), 1) << "one draft, to measure a two-row step";
  EXPECT_EQ(m.depth(4, 0.9, 0, false), 0) << "not when the caller does not let it explore";
  EXPECT_EQ(m.depth(0, 0.9, 0), 0) << "the sequence drafts nothing";
}

TEST(DraftCostModel, EstimatesUnmeasuredRowsAlongALine) {
  DraftCostModel m;
  measure(m, 1, 1.0);
  measure(m, 3, 1.4);
  EXPECT_DOUBLE_EQ(m.cost(2), 1.2);  // between 1 and 3
  EXPECT_DOUBLE_EQ(m.cost(5), 1.8);  // beyond 3, on the line through 1 and 3
  EXPECT_LT(m.cost(DraftCostModel::kMaxRows + 1), 0);
  m.record_step(3, 2.4);  // the average moves: 0.8 * 1.4 + 0.2 * 2.4
  EXPECT_DOUBLE_EQ(m.cost(3), 1.6);
}

TEST(DraftCostModel, ComputeBoundStepsNeverDraft) {
  DraftCostModel m;
  for (int r = 1; r <= 8; ++r) measure(m, r, 1e-3 * r);  // a row costs a plain step
  for (double a : {0.3, 0.7, 0.95, 1.0}) EXPECT_EQ(m.depth(7, a, 0), 0) << a;
}

TEST(DraftCostModel, BandwidthBoundStepsDraftAsDeepAsPays) {
  DraftCostModel m;
  for (int r = 1; r <= 8; ++r) measure(m, r, 1.0 + 0.1 * (r - 1));  // a row costs a tenth
  // Tokens a second for j drafts at acceptance 0.8: E(j) / (1 + 0.1 j), E(j) = 1 + 0.8 + ...:
  // 1.64, 2.03, 2.27, 2.40, 2.46, 2.470 (j = 6), 2.448: six.
  EXPECT_EQ(m.depth(7, 0.8, 0), 6);
  EXPECT_EQ(m.depth(3, 0.8, 0), 3) << "capped by the sequence's depth";
  EXPECT_EQ(m.depth(7, 0.05, 0), 0) << "E(1) = 1.05 does not pay for 1.1";
  // The drafter's cost a token moves the best depth: 0.05 a token makes j = 5 best (2.108
  // against 2.101 at 4 and 2.080 at 6).
  m.record_drafting(4, 0.2);
  EXPECT_EQ(m.depth(7, 0.8, 0), 5);
}

TEST(DraftCostModel, CountsTheOtherRowsOfTheStep) {
  DraftCostModel m;
  // Three other rows: plain is 4 rows, 4 tokens in 4.0; one draft at acceptance 1 gives 5 tokens
  // in 4.6 (5 rows): 1.087 tokens a unit against 1.0 x 1.03.
  for (int r = 1; r <= 8; ++r) measure(m, r, r <= 4 ? 1.0 * r : 4.0 + 0.6 * (r - 4));
  EXPECT_EQ(m.depth(1, 1.0, 3), 1);
  // At acceptance 0.5: 4.5 tokens in 4.6, below the plain step's rate.
  EXPECT_EQ(m.depth(1, 0.5, 3), 0);
  // Alone, the same costs are compute-bound (a row a unit up to four rows): no drafts.
  EXPECT_EQ(m.depth(3, 1.0, 0), 0);
}

// The measurements persist between processes: saved and restored under a key, they decide as they
// did; text of another key or that does not parse changes nothing.
TEST(DraftCostModel, SavedCostsRestoreUnderTheirKeyOnly) {
  DraftCostModel m;
  for (int r = 1; r <= 8; ++r) measure(m, r, 1.0 + 0.1 * (r - 1));
  m.record_drafting(4, 0.2);
  const std::string text = m.save("model=a backend=cpu");
  DraftCostModel restored;
  std::string why;
  ASSERT_TRUE(restored.restore(text, "model=a backend=cpu", &why)) << why;
  for (int r = 1; r <= 8; ++r) EXPECT_NEAR(restored.cost(r), m.cost(r), 1e-12) << r;
  EXPECT_EQ(restored.depth(7, 0.8, 0), 5) << "the drafter's cost came back too";
  EXPECT_EQ(restored.depth(7, 0.8, 0, false), 5) << "decided without exploring";

  // This process's first steps of a row count are warm-up steps even when it was restored.
  for (int i = 0; i < DraftCostModel::kWarmupSteps; ++i) restored.record_step(1, 100.0);
  EXPECT_NEAR(restored.cost(1), 1.0, 1e-12);
  restored.record_step(1, 2.0);  // then it averages in: 0.8 * 1.0 + 0.2 * 2.0
  EXPECT_NEAR(restored.cost(1), 1.2, 1e-12);

  DraftCostModel other;
  EXPECT_FALSE(other.restore(text, "model=b backend=cpu", &why));
  EXPECT_NE(why.find("another setup"), std::string::npos) << why;
  EXPECT_FALSE(other.any_measured());
  const std::string bad[] = {
      "",
      "not a step-costs file\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\nrows 1 0.5 3\n",  // no drafter line
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 0 0.5 3\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 65 0.5 3\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 2 nan 3\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 2 -1 3\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 2 0.5 0\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 2 0.5 3\nrows 2 0.5 3\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nrows 2 0.5 3 9\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft -1 0\n",
      "qwenrt step costs 1\nkey model=a backend=cpu\ndraft 0 0\nsteps 2 0.5 3\n",
  };
  for (const std::string& t : bad) {
    DraftCostModel c = m;
    EXPECT_FALSE(c.restore(t, "model=a backend=cpu")) << t;
    EXPECT_NEAR(c.cost(3), m.cost(3), 1e-12) << "a failed restore changed the model: " << t;
  }
  const std::string good = "qwenrt step costs 1\nkey k\ndraft 0 0\nrows 2 0.5 3\n";
  DraftCostModel g;
  ASSERT_TRUE(g.restore(good, "k", &why)) << why;
  EXPECT_DOUBLE_EQ(g.cost(2), 0.5);
  EXPECT_LT(g.cost(1), 0);
}

using Outcome = testing_support::DraftOutcome;
using testing_support::expect_same;
inline Sink collect(Outcome& o) {
  return testing_support::collect_outcome(o);
}

// Below AVX-512 a row's result does not depend on how many rows its step has: drafted and plain
// runs are then bit-comparable.
using testing_support::MatmulIsaCap;

struct ModelCase {
  const char* file;
  const char* backend;
};

class DraftExactTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  bool exact() const { return std::string(GetParam().backend) != "cuda"; }
  void SetUp() override {
    if (std::string(GetParam().backend) == "cuda" && !ops::cuda_available())
      GTEST_SKIP() << "no CUDA device";
    engine::EngineOptions o;
    o.backend = GetParam().backend;
    o.n_threads = 2;
    o.n_slots = 3;
    o.n_ctx = 2048;
    o.verify_rows = 7;
    engine_ = engine::Engine::load(kRoot + GetParam().file, o);
    tokenizer_ =
        std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(engine_->file()));
  }
  PreparedTurn chat_prompt(const std::string& user, bool thinking) const {
    ChatTurn turn{.messages = chat::Json::array({{{"role", "user"}, {"content", user}}})};
    turn.render.enable_thinking = thinking;
    return prepare_turn(*tokenizer_, chat::dialect_for(engine_->identity().checkpoint), turn);
  }
  // Runs the sequences to their ends, all submitted at once.
  // Runs the sequences to their ends, all submitted at once, `rounds` times through one scheduler
  // (with the prefix cache, the later rounds resume from the earlier ones' snapshots); the last
  // round's outcomes.
  std::vector<Outcome> run(const std::vector<SequenceParams>& seqs, DraftOptions draft,
                           bool prefix_cache = false, int rounds = 1) {
    Scheduler s(*engine_, *tokenizer_,
                SchedulerOptions{.prefix_cache = prefix_cache, .draft = draft});
    std::vector<Outcome> out;
    for (int r = 0; r < rounds; ++r) {
      out.assign(seqs.size(), Outcome{});
      for (size_t i = 0; i < seqs.size(); ++i) s.submit(seqs[i], collect(out[i]));
      while (s.step()) {
      }
      for (const auto& o : out) EXPECT_EQ(o.dones, 1);
    }
    last_stats_ = s.stats();
    return out;
  }
  static SequenceParams params(std::vector<int32_t> prompt, int max_tokens, float temperature,
                               uint64_t seed) {
    SequenceParams p;
    p.prompt = std::move(prompt);
    p.max_tokens = max_tokens;
    p.sampling.temperature = temperature;
    p.sampling.top_k = temperature > 0 ? 20 : 0;
    p.sampling.top_p = temperature > 0 ? 0.95f : 1.0f;
    p.sampling.repetition_penalty = temperature > 0 ? 1.05f : 1.0f;  // penalties see the drafts
    p.sampling.seed = seed;
    return p;
  }
  std::vector<SequenceParams> prompts(int max_tokens, float temperature) const {
    std::vector<SequenceParams> out;
    const char* users[] = {
        "Repeat this sentence three times: the cat sat on the mat and looked at the door.",
        "Write a python function that adds two numbers, then write it again with type hints.",
        "What is 12 plus 30?"};
    uint64_t seed = 11;
    for (const char* u : users) {
      out.push_back(params(chat_prompt(u, false).prompt, max_tokens, temperature, seed++));
    }
    const PreparedTurn thinking = chat_prompt(users[0], true);
    out.push_back(params(thinking.prompt, max_tokens, temperature, seed++));
    out.back().starts_in_thinking = thinking.thinking;
    return out;
  }

  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  SchedulerStats last_stats_;
};

TEST_P(DraftExactTest, GreedyOutputIsTheSameAtEveryDepth) {
  MatmulIsaCap cap;
  const bool ref = std::string(GetParam().backend) == "ref";
  const int n_tokens = ref ? 60 : 300;
  const auto seqs = prompts(n_tokens, 0.0f);
  const auto plain = run(seqs, {});
  int64_t accepted = 0;
  for (int depth = 1; depth <= 6; ++depth) {
    if (ref && depth % 2 == 0) continue;  // the oracle is slow: depths 1, 3, 5
    const auto drafted =
        run(seqs, {.kind = DraftKind::kNgram, .max_tokens = depth, .pause_when_slower = false});
    expect_same(exact(), plain, drafted, "depth " + std::to_string(depth));
    for (const auto& o : drafted) {
      EXPECT_LE(o.last.n_accepted, o.last.n_drafted);
      accepted += o.last.n_accepted;
    }
  }
  // The repeating prompts make the drafter hit: the checks did take drafts.
  EXPECT_GT(accepted, 0);
}

// The cost model on (the default): it chooses the depths (and plain steps, and probes) from the
// measured step times, which change between runs; the output stays the plain one. Alone and
// exploring from the first token, the longest reply (a drafter that finds matches in it)
// measures a two-row step with a check once its one-row step is measured (no other rows); in a
// batch, whether a check comes depends on the measured times.
TEST_P(DraftExactTest, GreedyOutputIsTheSameWithTheCostModel) {
  MatmulIsaCap cap;
  const bool ref = std::string(GetParam().backend) == "ref";
  const auto seqs = prompts(ref ? 40 : 200, 0.0f);
  const DraftOptions model{.kind = DraftKind::kNgram, .max_tokens = 4};
  const auto plain_all = run(seqs, {});
  expect_same(exact(), plain_all, run(seqs, model), "cost model");
  if (ref) return;  // (the oracle is slow)
  size_t longest = 0;
  for (size_t i = 1; i < plain_all.size(); ++i) {
    if (plain_all[i].tokens.size() > plain_all[longest].tokens.size()) longest = i;
  }
  const std::vector alone(seqs.begin() + longest, seqs.begin() + longest + 1);
  const auto plain = run(alone, {});
  DraftOptions explore = model;
  explore.explore_after = 0;
  const auto drafted = run(alone, explore);
  expect_same(exact(), plain, drafted, "cost model, alone");
  EXPECT_GT(drafted[0].last.n_checks, 0) << "no check measured a two-row step";
}

TEST_P(DraftExactTest, SeededSamplingIsTheSame) {
  MatmulIsaCap cap;
  const bool ref = std::string(GetParam().backend) == "ref";
  const auto seqs = prompts(ref ? 40 : 200, 0.8f);
  const auto plain = run(seqs, {});
  for (int depth : {2, 5}) {
    const auto drafted =
        run(seqs, {.kind = DraftKind::kNgram, .max_tokens = depth, .pause_when_slower = false});
    expect_same(exact(), plain, drafted, "depth " + std::to_string(depth));
  }
}

TEST_P(DraftExactTest, MixedWithSequencesThatDoNotDraftAndWithLimits) {
  MatmulIsaCap cap;
  const bool ref = std::string(GetParam().backend) == "ref";
  auto seqs = prompts(ref ? 40 : 120, 0.0f);
  seqs[1].draft = false;        // this one runs plain in the drafting batches
  seqs[2].max_tokens = 7;       // ends by length inside a check
  seqs[3].thinking_budget = 9;  // a forced close right after drafted tokens
  seqs[0].stop = {"mat and"};   // a stop string inside accepted drafts
  const auto plain = run(seqs, {});
  const auto drafted =
      run(seqs, {.kind = DraftKind::kNgram, .max_tokens = 4, .pause_when_slower = false});
  expect_same(exact(), plain, drafted, "mixed");
  EXPECT_EQ(drafted[1].last.n_checks, 0);
}

// The prefix cache snapshots the end of each reply: a check that ends a sequence must leave the
// slot at what was taken, or the next round would resume from a wrong state. (Compared with the
// cache on in both runs: resuming cuts the prefill differently, which rounds differently.)
TEST_P(DraftExactTest, WithThePrefixCache) {
  MatmulIsaCap cap;
  const bool ref = std::string(GetParam().backend) == "ref";
  const auto seqs = prompts(ref ? 30 : 100, 0.0f);
  const auto plain = run(seqs, {}, true, 2);
  const uint64_t plain_inserts = last_stats_.cache.inserts;
  const auto drafted =
      run(seqs, {.kind = DraftKind::kNgram, .max_tokens = 4, .pause_when_slower = false}, true, 2);
  expect_same(exact(), plain, drafted, "prefix cache, second round");
  for (const auto& o : drafted) EXPECT_GT(o.last.n_cached, 0);
  // Every reply's end went in (an entry whose slot held more rows than its tokens is refused).
  EXPECT_GT(plain_inserts, 0u);
  EXPECT_EQ(last_stats_.cache.inserts, plain_inserts);
  EXPECT_GT(last_stats_.accepted_tokens, 0u);
}

TEST_P(DraftExactTest, ConfigurationErrors) {
  // The engine keeps states for 7 rows: 6 drafts at most.
  EXPECT_THROW(Scheduler(*engine_, *tokenizer_,
                         SchedulerOptions{.draft = {.kind = DraftKind::kNgram, .max_tokens = 7}}),
               Error);
  EXPECT_THROW(Scheduler(*engine_, *tokenizer_,
                         SchedulerOptions{.draft = {.kind = DraftKind::kNgram,
                                                    .max_tokens = 2,
                                                    .ngram_min = 3,
                                                    .ngram_max = 2}}),
               Error);
}

INSTANTIATE_TEST_SUITE_P(
    Models, DraftExactTest,
    ::testing::Values(ModelCase{"models/qwen35-chat-tiny.Q8_0.gguf", "cpu"},
                      ModelCase{"models/qwen35moe-chat-tiny.Q4_K_M.gguf", "cpu"},
                      ModelCase{"models/qwen35-chat-tiny.Q8_0.gguf", "ref"},
                      // On a GPU (skipped without one): a check's rows take
                      // the multi-row kernels, plain steps the one-row ones.
                      ModelCase{"models/qwen35-chat-tiny.Q8_0.gguf", "cuda"},
                      ModelCase{"models/qwen35moe-chat-tiny.Q4_K_M.gguf", "cuda"}),
    [](const auto& info) {
      return std::string(info.index == 1 || info.index == 4 ? "moe_" : "dense_") +
             info.param.backend;
    });

}  // namespace
}  // namespace qwenrt::gen
