// Tensor parallelism (issue 17; model/shard.h): how heads go to ranks on the family's shapes, the
// weight slices, the host group's all-reduce, and end to end on the tiny models (cpu and ref): the
// logits of N = 2 and 4 ranks against one, over a prompt and the decode steps after it, batches of
// several sequences, snapshots, greedy generation with and without MTP drafting, and the errors
// for what cannot be split.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "model/checkpoints.h"
#include "model/shard.h"
#include "ops/host_group.h"
#include "quant/quant.h"
#include "support/draft_runs.h"
#include "support/isa_cap.h"
#include "support/model_files.h"
#include "support/parallel.h"
#include "support/run_binary.h"

namespace qwenrt {
namespace {

using model::Config;
using model::Shard;
using testing_support::rel_l2;

const std::string kRoot = std::string(QWENRT_SOURCE_DIR) + "/";
const std::string kDenseQ8 = kRoot + "models/qwen35-chat-tiny.Q8_0.gguf";
const std::string kDenseQ4 = kRoot + "models/qwen35-chat-tiny.Q4_K_M.gguf";
const std::string kMoeQ4 = kRoot + "models/qwen35moe-chat-tiny.Q4_K_M.gguf";

// Every head lands on exactly one rank (KV heads on N / n_head_kv ranks when they are fewer than
// the ranks), and each rank's local mapping reads the head the model's does: query head q reads
// KV head q / group, V head v reads K head v % Hk. On the shapes of the released 27B and 35B-A3B
// (model/checkpoints.h) at 1, 2, 4 and 8 ranks.
void expect_heads_shared(const Config& c, int n) {
  std::vector<int> q_seen(c.n_head, 0), v_seen(c.ssm_v_heads, 0), kv_seen(c.n_head_kv, 0);
  for (int r = 0; r < n; ++r) {
    const model::HeadShare h = model::share_heads(c, {r, n});
    const Config local = model::shard_config(c, {r, n});
    ASSERT_EQ(local.n_head, static_cast<int>(h.q.size()));
    ASSERT_EQ(local.ssm_v_heads, static_cast<int>(h.v.size()));
    ASSERT_EQ(local.conv_channels(),
              2 * local.ssm_k_heads * c.ssm_head_dim + local.ssm_v_heads * c.ssm_head_dim);
    EXPECT_EQ(static_cast<int>(h.q.size()) * n, c.n_head) << n;
    const int group = c.n_head / c.n_head_kv, local_group = local.n_head / local.n_head_kv;
    for (size_t j = 0; j < h.q.size(); ++j) {
      ++q_seen[h.q[j]];
      EXPECT_EQ(h.q[j] / group, h.kv[j / local_group]) << "rank " << r << " of " << n;
    }
    for (int kv : h.kv) ++kv_seen[kv];
    for (size_t j = 0; j < h.v.size(); ++j) {
      ++v_seen[h.v[j]];
      EXPECT_EQ(h.v[j] % c.ssm_k_heads, h.k[j % h.k.size()]) << "rank " << r << " of " << n;
    }
  }
  for (int s : q_seen) EXPECT_EQ(s, 1) << n;
  for (int s : v_seen) EXPECT_EQ(s, 1) << n;
  for (int s : kv_seen) EXPECT_EQ(s, std::max(1, n / c.n_head_kv)) << n;
}

Config shape(const char* name) {
  const auto s = model::checkpoint_shape(name);
  EXPECT_TRUE(s.has_value()) << name;
  return s ? s->config : Config{};
}

TEST(TensorParallelShard, HeadsOfTheReleasedShapesGoToRanksKeepingWhatEachHeadReads) {
  for (const char* name : {"Qwen3.6-27B", "Qwen3.6-35B-A3B"}) {
    for (int n : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(name) + " over " + std::to_string(n));
      expect_heads_shared(shape(name), n);
    }
  }
  const Config c = shape("Qwen3.6-27B");
  // 32 ranks: DeltaNet's 48 V heads cannot be shared (3 per K head over 2 ranks each).
  Config many = c;
  many.n_head = 32;
  EXPECT_THROW(model::share_heads(many, {0, 32}), Error);
  // 16 ranks: one K head each, its 3 V heads with it.
  many.n_head = 16;
  EXPECT_EQ(model::share_heads(many, {5, 16}).v, (std::vector<int>{5, 21, 37}));
  Config odd = c;
  odd.n_head = 6;
  odd.n_head_kv = 3;
  try {
    model::share_heads(odd, {0, 4});
    FAIL() << "6 heads over 4 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 attention heads"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelShard, VocabularyRowsCoverTheHeadOnce) {
  const Config c = shape("Qwen3.6-27B");
  for (int n : {1, 3, 8}) {
    int64_t next = 0;
    for (int r = 0; r < n; ++r) {
      const model::VocabRange v = model::vocab_range(c, {r, n});
      EXPECT_EQ(v.begin, next);
      next = v.end;
    }
    EXPECT_EQ(next, c.n_vocab);
  }
}

// The FFN widths split on whole K-quant blocks where each rank gets one: the 27B's 17,408 columns
// over 8 ranks go as 8 or 9 blocks of 256 (an even split, 2,176, would fall off the blocks and
// hold the down matrix in fp32), covering the width once; narrower widths fall back to 32-column
// Q8_0 blocks, then single columns; a width narrower than the ranks is refused.
TEST(TensorParallelShard, FfnWidthsSplitOnWholeQuantBlocks) {
  auto expect_cover = [](int64_t width, int n, int64_t unit) {
    int64_t next = 0, least = width, most = 0;
    for (int r = 0; r < n; ++r) {
      const model::Range part = model::width_part(width, {r, n});
      EXPECT_EQ(part.begin, next) << width << " over " << n;
      EXPECT_EQ(part.begin % unit, 0) << width << " over " << n;
      EXPECT_EQ(part.count % unit, 0) << width << " over " << n;
      least = std::min(least, part.count);
      most = std::max(most, part.count);
      next = part.begin + part.count;
    }
    EXPECT_EQ(next, width);
    EXPECT_GT(least, 0);
    EXPECT_LE(most - least, unit) << width << " over " << n;
  };
  const Config dense = shape("Qwen3.6-27B");
  ASSERT_EQ(dense.n_ff, 17408);
  for (int n : {1, 2, 3, 4, 8}) expect_cover(dense.n_ff, n, 256);
  EXPECT_EQ(model::width_part(dense.n_ff, {0, 8}).count, 2048);
  EXPECT_EQ(model::width_part(dense.n_ff, {7, 8}).count, 2304);
  EXPECT_EQ(model::shard_config(dense, {7, 8}).n_ff, 2304);
  const Config moe = shape("Qwen3.6-35B-A3B");
  expect_cover(moe.n_ff_shexp, 2, 256);
  expect_cover(moe.n_ff_shexp, 8, 32);  // 512 over 8: 64 columns, Q8_0 blocks but not K-quant
  EXPECT_EQ(model::shard_config(moe, {3, 8}).n_ff_shexp, 64);
  expect_cover(96, 2, 32);  // the tiny models' FFN: 32 + 64
  expect_cover(96, 4, 1);
  expect_cover(5, 5, 1);
  try {
    model::width_part(3, {0, 4});
    FAIL() << "3 columns over 4 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 columns"), std::string::npos) << e.what();
  }
}

// A Q8_0 matrix [in 128, out 6] of known values.
struct Q8Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantised, [6, 128]
  Weight w;
};
Q8Matrix q8_matrix() {
  Q8Matrix m;
  const int64_t in = 128, out = 6;
  std::vector<float> src(in * out);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.37f * static_cast<float>(i));
  const auto& t = traits(DType::Q8_0);
  m.bytes.resize(in / t.block_elems * t.block_bytes * out);
  quant::quantize(DType::Q8_0, src.data(), m.bytes.data(), in * out);
  m.values.resize(src.size());
  quant::dequantize(DType::Q8_0, m.bytes.data(), m.values.data(), in * out);
  m.w = {"m", TensorView::contiguous(DType::Q8_0, 2, {in, out, 1, 1}, m.bytes.data())};
  return m;
}

TEST(TensorParallelShard, TakeViewsOneRowRangeAndCopiesColumns) {
  const Q8Matrix m = q8_matrix();
  model::ShardArena arena;
  // One row range: a view of the same bytes.
  const Weight rows = model::take(m.w, {{2, 3}}, {}, arena);
  EXPECT_EQ(rows.view.data, m.w.view.row(2));
  EXPECT_EQ(rows.view.ne[1], 3);
  // Rows 4..5 then 0 and columns on block boundaries: a Q8_0 copy of those blocks.
  const Weight blocks = model::take(m.w, {{4, 2}, {0, 1}}, {{32, 64}}, arena);
  ASSERT_EQ(blocks.view.dtype, DType::Q8_0);
  ASSERT_EQ(blocks.view.ne[0], 64);
  ASSERT_EQ(blocks.view.ne[1], 3);
  std::vector<float> got(64);
  const int64_t src_rows[] = {4, 5, 0};
  for (int i = 0; i < 3; ++i) {
    quant::dequantize(DType::Q8_0, blocks.view.row(i), got.data(), 64);
    for (int c = 0; c < 64; ++c) EXPECT_EQ(got[c], m.values[src_rows[i] * 128 + 32 + c]);
  }
  // Columns off the blocks (16..23 and 100..103): fp32 values of the dequantised weights.
  const Weight f32 = model::take(m.w, {{1, 2}}, {{16, 8}, {100, 4}}, arena);
  ASSERT_EQ(f32.view.dtype, DType::F32);
  ASSERT_EQ(f32.view.ne[0], 12);
  for (int i = 0; i < 2; ++i) {
    const auto* row = reinterpret_cast<const float*>(f32.view.row(i));
    for (int c = 0; c < 8; ++c) EXPECT_EQ(row[c], m.values[(1 + i) * 128 + 16 + c]);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(row[8 + c], m.values[(1 + i) * 128 + 100 + c]);
  }
  EXPECT_THROW(model::take(m.w, {{5, 2}}, {}, arena), Error);  // past the last row
}

// A stack of three Q8_0 expert matrices: take_experts selects the same rows or columns of every
// expert as take does of each alone (columns off the blocks in fp32), expert after expert.
TEST(TensorParallelShard, TakeExpertsCutsEveryExpertAlike) {
  const Q8Matrix m = q8_matrix();  // [128, 6]; three experts: the same bytes, rows rotated
  std::vector<uint8_t> stack;
  const size_t one = m.bytes.size(), row = one / 6;
  for (int e = 0; e < 3; ++e)
    for (int r = 0; r < 6; ++r)
      stack.insert(stack.end(), m.bytes.begin() + ((r + e) % 6) * row,
                   m.bytes.begin() + ((r + e) % 6 + 1) * row);
  const Weight w{"exps", TensorView::contiguous(DType::Q8_0, 3, {128, 6, 3, 1}, stack.data())};
  model::ShardArena arena;
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::vector<model::Range>, std::vector<model::Range>>>{
           {{{1, 2}, {4, 1}}, {}}, {{}, {{32, 64}}}, {{}, {{16, 8}}}}) {
    const Weight cut = model::take_experts(w, rows, cols, arena);
    ASSERT_EQ(cut.view.ne[2], 3);
    for (int e = 0; e < 3; ++e) {
      const Weight alone = model::take(
          w.expert(e), rows.empty() ? std::vector<model::Range>{{0, 6}} : rows, cols, arena);
      ASSERT_EQ(cut.view.dtype, alone.view.dtype);
      ASSERT_EQ(cut.view.ne[0], alone.view.ne[0]);
      ASSERT_EQ(cut.view.ne[1], alone.view.ne[1]);
      const TensorView ev = cut.expert_view(e);
      const int64_t bytes = alone.view.ne[1] * alone.view.nb[1];
      EXPECT_EQ(std::memcmp(ev.data, alone.view.data, static_cast<size_t>(bytes)), 0)
          << "expert " << e;
    }
  }
  // The expert width over ranks: the 35B-A3B's 512 columns, 256 a rank at 2.
  const Config moe = shape("Qwen3.6-35B-A3B");
  EXPECT_EQ(model::shard_config(moe, {1, 2, false}).n_ff_exp, 256);
  EXPECT_EQ(model::shard_config(moe, {1, 2, true}).n_ff_exp, moe.n_ff_exp);
}

// Three ranks sum arrays of different values: each gets the sum in rank order, the same floats.
TEST(TensorParallelGroup, AllReduceGivesEveryRankTheSameSum) {
  const int n_ranks = 3;
  const int64_t n = 1001;
  ops::HostGroup group(n_ranks);
  std::vector<std::vector<float>> x(n_ranks, std::vector<float>(n));
  for (int r = 0; r < n_ranks; ++r)
    for (int64_t i = 0; i < n; ++i) x[r][i] = std::cos(0.1f * static_cast<float>(i * (r + 1)));
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = (x[0][i] + x[1][i]) + x[2][i];
  for (int round = 0; round < 3; ++round) {  // the group is reused call after call
    auto y = x;
    std::vector<std::thread> threads;
    for (int r = 0; r < n_ranks; ++r)
      threads.emplace_back([&, r] { group.all_reduce_sum(r, y[r].data(), n); });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n_ranks; ++r) EXPECT_EQ(y[r], want) << "rank " << r;
  }
}

// A rank that fails aborts the group: the others' calls throw instead of waiting forever.
TEST(TensorParallelGroup, AnAbortWakesTheOtherRanks) {
  ops::HostGroup group(3);
  std::atomic<int> threw{0};
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  std::thread t1([&] {
    try {
      group.all_reduce_sum(0, a.data(), 8);
    } catch (const Error&) {
      ++threw;
    }
  });
  std::thread t2([&] {
    try {
      group.all_reduce_sum(1, b.data(), 8);
    } catch (const Error&) {
      ++threw;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  group.abort();  // rank 2 never arrives
  t1.join();
  t2.join();
  EXPECT_EQ(threw.load(), 2);
  group.reset();
  std::vector<float> c(8, 3.0f), d(8, 4.0f);
  std::thread t3([&] { group.all_reduce_sum(0, c.data(), 8); });
  std::thread t4([&] { group.all_reduce_sum(1, d.data(), 8); });
  group.all_reduce_sum(2, a.data(), 8);
  t3.join();
  t4.join();
  EXPECT_EQ(a[0], 3.0f + 4.0f + 1.0f);
  EXPECT_EQ(c, a);
  EXPECT_EQ(d, a);
}

std::unique_ptr<engine::Engine> load(const std::string& path, const std::string& backend, int tp,
                                     int n_slots = 2, bool expert_parallel = true) {
  engine::EngineOptions o;
  o.expert_parallel = expert_parallel;
  o.backend = backend;
  o.n_threads = 2;
  o.n_slots = n_slots;
  o.n_ctx = 512;
  o.verify_rows = 4;
  o.tensor_parallel = tp;
  return engine::Engine::load(path, o);
}

struct TpCase {
  std::string file;
  std::string backend;
  int ranks;
  bool expert_parallel = true;  // MoE: experts by expert, or every expert's width split
};

std::string case_name(const ::testing::TestParamInfo<TpCase>& info) {
  std::string f = info.param.file.substr(info.param.file.rfind('/') + 1);
  for (char& ch : f) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return f + "_" + info.param.backend + "_" + std::to_string(info.param.ranks) +
         (info.param.expert_parallel ? "" : "_expert_width");
}

class TensorParallelModel : public ::testing::TestWithParam<TpCase> {};

// Prompt logits, then decode steps, of two sequences in one batch and one alone, on the reference
// backend at one rank (the oracle), the case's backend at one rank and at N: N ranks are no
// further from the oracle than one rank of the same backend (the split only changes fp32 summation
// order, and on cpu runs columns off the quant blocks in fp32 where one rank quantises activations
// to int8); on ref itself, within 1e-5. Snapshot and restore bring every rank's state back, bit
// for bit.
TEST_P(TensorParallelModel, LogitsAreAsCloseToTheOracleAsOneRankThroughDecodeAndSnapshots) {
  const TpCase& p = GetParam();
  testing_support::MatmulIsaCap cap;
  auto oracle = load(p.file, "ref", 1);
  auto one = load(p.file, p.backend, 1);
  auto many = load(p.file, p.backend, p.ranks, 2, p.expert_parallel);
  ASSERT_EQ(many->tensor_parallel(), p.ranks);
  const int V = one->config().n_vocab;
  const auto prompt_a = testing_support::random_tokens(23, V, 5);
  const auto prompt_b = testing_support::random_tokens(9, V, 6);
  engine::Batch batch;
  for (size_t i = 0; i < prompt_a.size(); ++i) batch.add(0, prompt_a[i], i, true);
  for (size_t i = 0; i < prompt_b.size(); ++i)
    batch.add(1, prompt_b[i], i, i + 1 == prompt_b.size());
  double err_one = 0, err_many = 0;
  auto compare = [&](const engine::Batch& b) {
    const auto want = oracle->step(b);
    err_one = std::max(err_one, rel_l2(one->step(b), want));
    const auto got = many->step(b);
    err_many = std::max(err_many, rel_l2(got, want));
    return got;
  };
  compare(batch);
  auto snapshot = many->states().snapshot(0);
  int32_t pos_a = 23, pos_b = 9;
  std::vector<float> after_snapshot;
  for (int t = 0; t < 6; ++t) {
    engine::Batch step;
    step.add(0, (t * 37 + 11) % V, pos_a++, true);
    if (t % 2 == 0) step.add(1, (t * 53 + 7) % V, pos_b++, true);
    const auto got = compare(step);
    if (t == 0) after_snapshot.assign(got.begin(), got.begin() + V);
  }
  std::printf("[tp] %s %s: logits rel L2 to ref at one rank: %.2e at 1 rank, %.2e at %d\n",
              p.file.c_str(), p.backend.c_str(), err_one, err_many, p.ranks);
  EXPECT_LE(err_many, std::max(1e-5, 1.5 * err_one));
  // Back to the snapshot (the prompt's end): the first decode row again, bit for bit.
  many->states().restore(0, snapshot);
  engine::Batch again;
  again.add(0, 11, 23, true);
  EXPECT_EQ(many->step(again), after_snapshot);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TensorParallelModel,
                         ::testing::Values(TpCase{kDenseQ8, "cpu", 2}, TpCase{kDenseQ8, "cpu", 4},
                                           TpCase{kDenseQ4, "cpu", 2}, TpCase{kMoeQ4, "cpu", 2},
                                           TpCase{kMoeQ4, "cpu", 4}, TpCase{kDenseQ8, "ref", 2},
                                           TpCase{kMoeQ4, "ref", 4},
                                           TpCase{kMoeQ4, "cpu", 2, false},
                                           TpCase{kMoeQ4, "cpu", 4, false},
                                           TpCase{kMoeQ4, "ref", 2, false}),
                         case_name);

// Greedy generation through the scheduler: the same tokens at 2 ranks as at one, plain and with
// MTP drafts (the draft head's rows are split too) and with the prefix cache (snapshots of every
// rank's state) over two rounds.
TEST(TensorParallelGeneration, GreedyRepliesAreTheSameAsOneRankWithDraftsAndThePrefixCache) {
  testing_support::MatmulIsaCap cap;
  testing_support::expect_same_replies_at_one_and_two(
      {kDenseQ8, kMoeQ4}, [](const std::string& file, int tp) { return load(file, "cpu", tp, 3); },
      "rank");
}

TEST(TensorParallelErrors, WhatCannotBeSplitIsRefusedNamingIt) {
  auto message = [](const std::string& path, const std::string& backend, int tp) {
    return testing_support::error_of([&] { load(path, backend, tp); });
  };
  // 4 attention heads over 3 ranks.
  EXPECT_NE(message(kDenseQ8, "cpu", 3).find("4 attention heads"), std::string::npos);
  // Qwen3.8-Flash-Next is not split yet.
  EXPECT_NE(message(kRoot + "tests/fixtures/models/qwen4exp.Q8_0.gguf", "ref", 2).find("qwen4exp"),
            std::string::npos);
  engine::EngineOptions o;
  o.backend = "cpu";
  o.tensor_parallel = 2;
  testing_support::expect_parallel_load_errors(
      kMoeQ4, o, [](engine::EngineOptions& x) { x.tensor_parallel = 0; });
}

TEST(TensorParallelCli, RunGivesTheSameReplyAtTwoRanks) {
  testing_support::expect_cli_same_reply(kDenseQ8, "--tensor-parallel 2", "--tensor-parallel 3",
                                         "attention heads");
}

}  // namespace
}  // namespace qwenrt
