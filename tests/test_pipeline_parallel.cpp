// Pipeline (layer) parallelism (issue 17; model/pipeline.h): the layer split against a brute-force
// search, what each stage holds (weights and state), and end to end on the tiny models (cpu and
// ref): the logits at 2 and 3 stages equal one stage's bit for bit over prompts, decode steps,
// batches, snapshots and a speculative check's rollback; with tensor parallelism inside each
// stage equal to tensor parallelism alone; greedy generation with MTP drafts and the prefix cache;
// the CLI; the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "model/pipeline.h"
#include "support/draft_runs.h"
#include "support/isa_cap.h"
#include "support/model_files.h"
#include "support/parallel.h"
#include "support/run_binary.h"
#include "support/scheduler_fixture.h"

namespace qwenrt {
namespace {

const std::string kRoot = std::string(QWENRT_SOURCE_DIR) + "/";
const std::string kDenseQ8 = kRoot + "models/qwen35-chat-tiny.Q8_0.gguf";
const std::string kMoeQ4 = kRoot + "models/qwen35moe-chat-tiny.Q4_K_M.gguf";

// The least possible largest stage, by trying every way to cut n layers into `stages` ranges.
int64_t brute_force_best(const std::vector<int64_t>& bytes, int64_t first, int64_t last,
                         int stages) {
  const int n = static_cast<int>(bytes.size());
  int64_t best = std::numeric_limits<int64_t>::max();
  std::vector<int> cuts(stages - 1);
  // cuts: strictly increasing in [1, n - 1]; enumerate combinations.
  for (int i = 0; i < stages - 1; ++i) cuts[i] = i + 1;
  for (;;) {
    int64_t worst = 0;
    for (int s = 0; s < stages; ++s) {
      const int a = s == 0 ? 0 : cuts[s - 1], b = s == stages - 1 ? n : cuts[s];
      int64_t sum = 0;
      for (int i = a; i < b; ++i) sum += bytes[i];
      if (s == 0) sum += first;
      if (s == stages - 1) sum += last;
      worst = std::max(worst, sum);
    }
    best = std::min(best, worst);
    int k = stages - 2;
    while (k >= 0 && cuts[k] == n - (stages - 1 - k)) --k;
    if (k < 0) break;
    ++cuts[k];
    for (int j = k + 1; j < stages - 1; ++j) cuts[j] = cuts[j - 1] + 1;
  }
  return best;
}

TEST(PipelineSplit, StagesAreContiguousAndTheLargestIsAsSmallAsPossible) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    const int stages = 1 + static_cast<int>(rng() % n);
    std::vector<int64_t> bytes(n);
    for (auto& b : bytes) b = 1 + rng() % 100;
    const int64_t first = rng() % 150, last = rng() % 300;
    const auto split = model::split_layers(bytes, first, last, stages);
    ASSERT_EQ(static_cast<int>(split.size()), stages);
    int next = 0;
    int64_t worst = 0;
    for (int s = 0; s < stages; ++s) {
      EXPECT_EQ(split[s].index, s);
      EXPECT_EQ(split[s].count, stages);
      EXPECT_EQ(split[s].first, next);
      EXPECT_GT(split[s].end, split[s].first) << "stage " << s << " holds no layer";
      int64_t sum = (s == 0 ? first : 0) + (s == stages - 1 ? last : 0);
      for (int i = split[s].first; i < split[s].end; ++i) sum += bytes[i];
      worst = std::max(worst, sum);
      next = split[s].end;
    }
    EXPECT_EQ(next, n);
    EXPECT_EQ(worst, brute_force_best(bytes, first, last, stages)) << "trial " << trial;
  }
  // Eight equal layers and a head of 2.5 layers over two stages: five layers, then three and the
  // head (55 bytes against 60 the other way round).
  const auto two = model::split_layers(std::vector<int64_t>(8, 10), 0, 25, 2);
  EXPECT_EQ(two[0].end, 5);
  EXPECT_THROW(model::split_layers(std::vector<int64_t>(3, 1), 0, 0, 4), Error);
  EXPECT_THROW(model::split_layers(std::vector<int64_t>(3, 1), 0, 0, 0), Error);
}

std::unique_ptr<engine::Engine> load(const std::string& path, const std::string& backend, int pp,
                                     int tp = 1, int n_slots = 2) {
  engine::EngineOptions o;
  o.backend = backend;
  o.n_threads = 2;
  o.n_slots = n_slots;
  o.n_ctx = 512;
  o.verify_rows = 4;
  o.pipeline_parallel = pp;
  o.tensor_parallel = tp;
  return engine::Engine::load(path, o);
}

// Each stage's backend is handed only its layers' weights (the embedding on the first, the head on
// the last), and its state store holds only its layers' KV and recurrent state: asking a stage for
// another's layer is an error, and the recurrent bytes over the stages are one stage's.
TEST(PipelineStages, EachStageHoldsOnlyItsLayersWeightsAndState) {
  std::vector<testing_support::WatchedOps::Log> logs(3);
  int made = 0;
  engine::EngineOptions o;
  o.n_slots = 2;
  o.n_ctx = 256;
  o.pipeline_parallel = 3;
  o.make_backend = [&] {
    return std::make_unique<testing_support::WatchedOps>(ops::make_ref_ops(), &logs.at(made++));
  };
  auto e = engine::Engine::load(kDenseQ8, o);
  ASSERT_EQ(made, 3);
  const auto& stages = e->stages();
  ASSERT_EQ(stages.size(), 3u);
  const int n_layer = e->config().n_layer;
  EXPECT_EQ(stages.front().first, 0);
  EXPECT_EQ(stages.back().end, n_layer);
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(logs[r].placed.empty()) << "rank " << r;
    for (const std::string& name : logs[r].placed) {
      if (name.starts_with("blk.")) {
        const int il = std::atoi(name.c_str() + 4);
        EXPECT_TRUE(stages[r].holds(il, n_layer)) << name << " placed on stage " << r;
      }
      if (name == "output.weight" || name == "output_norm.weight") {
        EXPECT_EQ(r, 2) << name << " placed on stage " << r;
      }
    }
    const bool embeds = std::find(logs[r].placed.begin(), logs[r].placed.end(),
                                  "token_embd.weight") != logs[r].placed.end();
    if (r < 2) {
      EXPECT_EQ(embeds, r == 0) << "the embedding on stage " << r;
    }
    for (int il = 0; il < n_layer; ++il) {
      const bool attention = e->config().is_attention_layer(il);
      if (stages[r].holds(il, n_layer)) {
        EXPECT_NO_THROW(attention ? (void)e->states().kv(il, r)
                                  : (void)e->states().recurrent(il, r));
      } else {
        EXPECT_THROW(attention ? (void)e->states().kv(il, r) : (void)e->states().recurrent(il, r),
                     Error)
            << "layer " << il << " on stage " << r;
      }
    }
  }
  auto one = load(kDenseQ8, "ref", 1);
  EXPECT_EQ(e->states().recurrent_bytes(), one->states().recurrent_bytes());
  EXPECT_TRUE(e->has_mtp());
}

struct PpCase {
  std::string file;
  std::string backend;
  int stages;
  int ranks;  // tensor parallelism inside each stage
};

std::string case_name(const ::testing::TestParamInfo<PpCase>& info) {
  std::string f = info.param.file.substr(info.param.file.rfind('/') + 1);
  for (char& ch : f) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return f + "_" + info.param.backend + "_pp" + std::to_string(info.param.stages) + "_tp" +
         std::to_string(info.param.ranks);
}

class PipelineModel : public ::testing::TestWithParam<PpCase> {};

// Prompts of two sequences in one batch, decode steps, a snapshot restored, and a speculative
// check of three rows rolled back to two: the logits at P stages equal one stage's (at the same
// tensor parallelism) bit for bit. The stages run the same ops on the same rows; the only
// difference is a stage's last residual add and the next stage's norm as two ops instead of one
// fused op, which compute the same floats.
TEST_P(PipelineModel, LogitsEqualOneStageBitForBit) {
  const PpCase& p = GetParam();
  testing_support::MatmulIsaCap cap;
  auto one = load(p.file, p.backend, 1, p.ranks);
  auto many = load(p.file, p.backend, p.stages, p.ranks);
  ASSERT_EQ(many->pipeline_parallel(), p.stages);
  ASSERT_EQ(many->tensor_parallel(), p.ranks);
  const int V = one->config().n_vocab;
  const auto prompt_a = testing_support::random_tokens(23, V, 5);
  const auto prompt_b = testing_support::random_tokens(9, V, 6);
  engine::Batch batch;
  for (size_t i = 0; i < prompt_a.size(); ++i) batch.add(0, prompt_a[i], i, true);
  for (size_t i = 0; i < prompt_b.size(); ++i)
    batch.add(1, prompt_b[i], i, i + 1 == prompt_b.size());
  auto same = [&](const engine::Batch& b, const char* what) {
    const auto want = one->step(b);
    const auto got = many->step(b);
    EXPECT_EQ(got, want) << what;
    return got;
  };
  same(batch, "prompts");
  auto snapshot = many->states().snapshot(0);
  int32_t pos_a = 23, pos_b = 9;
  std::vector<float> after_snapshot;
  for (int t = 0; t < 5; ++t) {
    engine::Batch step;
    step.add(0, (t * 37 + 11) % V, pos_a++, true);
    if (t % 2 == 0) step.add(1, (t * 53 + 7) % V, pos_b++, true);
    const auto got = same(step, "decode");
    if (t == 0) after_snapshot.assign(got.begin(), got.begin() + V);
  }
  // A check of three rows of slot 1, two of them kept.
  engine::Batch check;
  for (int i = 0; i < 3; ++i) check.add(1, (i * 29 + 3) % V, pos_b + i, true);
  check.keep_states = {1};
  same(check, "check");
  one->rollback(1, pos_b + 2);
  many->rollback(1, pos_b + 2);
  engine::Batch next;
  next.add(1, 17, pos_b + 2, true);
  same(next, "after the rollback");
  // Back to the snapshot (the prompt's end): the first decode row again, bit for bit.
  many->states().restore(0, snapshot);
  engine::Batch again;
  again.add(0, 11, 23, true);
  EXPECT_EQ(many->step(again), after_snapshot);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, PipelineModel,
    ::testing::Values(PpCase{kDenseQ8, "cpu", 2, 1}, PpCase{kDenseQ8, "cpu", 3, 1},
                      PpCase{kMoeQ4, "cpu", 2, 1}, PpCase{kMoeQ4, "cpu", 4, 1},
                      PpCase{kDenseQ8, "ref", 3, 1}, PpCase{kMoeQ4, "ref", 2, 1},
                      PpCase{kDenseQ8, "cpu", 2, 2}, PpCase{kMoeQ4, "ref", 2, 2}),
    case_name);

// Greedy generation through the scheduler (prefix cache on, two rounds) at 2 stages: the same
// tokens as one stage, plain and with MTP drafts (the MTP block runs on the last stage).
TEST(PipelineGeneration, GreedyRepliesAreTheSameAsOneStageWithDraftsAndThePrefixCache) {
  testing_support::MatmulIsaCap cap;
  testing_support::expect_same_replies_at_one_and_two(
      {kDenseQ8, kMoeQ4},
      [](const std::string& file, int pp) { return load(file, "cpu", pp, 1, 3); }, "stage");
}

TEST(PipelineErrors, WhatCannotBeSplitIsRefusedNamingIt) {
  auto message = [](const std::string& path, const std::string& backend, int pp) {
    return testing_support::error_of([&] { load(path, backend, pp); });
  };
  const int n_layer = load(kDenseQ8, "ref", 1)->config().n_layer;
  const std::string too_many = message(kDenseQ8, "ref", n_layer + 1);
  EXPECT_NE(too_many.find(fmt::format("{} stages for {} layers", n_layer + 1, n_layer)),
            std::string::npos)
      << too_many;
  const std::string q4 = message(kRoot + "tests/fixtures/models/qwen4exp.Q8_0.gguf", "ref", 2);
  EXPECT_NE(q4.find("pipeline parallel"), std::string::npos) << q4;
  EXPECT_NE(q4.find("qwen4exp"), std::string::npos) << q4;
  const std::string cuda = message(kDenseQ8, "cuda", 2);
  EXPECT_NE(cuda.find("pipeline parallel"), std::string::npos) << cuda;
  engine::EngineOptions o;
  o.backend = "cpu";
  o.pipeline_parallel = 2;
  testing_support::expect_parallel_load_errors(
      kMoeQ4, o, [](engine::EngineOptions& x) { x.pipeline_parallel = 0; });
}

TEST(PipelineCli, RunGivesTheSameReplyAtTwoStages) {
  testing_support::expect_cli_same_reply(kMoeQ4, "--pipeline-parallel 2", "--pipeline-parallel 64",
                                         "stages for");
}

}  // namespace
}  // namespace qwenrt
