// qwen4exp's reference ops (ops/ref/qwen4exp.cpp) against hand-worked math and against each other:
// QSA equals dense attention while the context fits the budget (bit for bit) and attends to the
// best blocks plus the tail beyond it; the PLE n-gram rows by the hash written out by hand, cut at
// eos and at the sequence start; the PLE conv and embedding carry their state across steps; the
// hyper-connection ops on small numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ops/cpu/qsa.h"
#include "ops/ref/kernels.h"
#include "support/op_data.h"

namespace qwenrt::ops::ref {
namespace {

using testing_support::f32_weight;
using testing_support::randn;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// One slot per span, each slot's pages contiguous in the pool (page p of slot s = s * pages + p).
struct Paged {
  int page_size, pages_per_slot;
  std::vector<int32_t> tables;
  Paged(int n_slots, int page_size, int64_t n_ctx)
      : page_size(page_size),
        pages_per_slot(static_cast<int>((n_ctx + page_size - 1) / page_size)) {
    tables.resize(n_slots * pages_per_slot);
    std::iota(tables.begin(), tables.end(), 0);
  }
  int64_t pool_rows() const { return static_cast<int64_t>(tables.size()) * page_size; }
};

struct QsaCase {
  int n_head = 4, n_head_kv = 2, head_dim = 8, index_heads = 3, index_dim = 6, n_rot = 4;
  int ratio = 4, budget = 8;
  std::vector<Span> spans;  // slots 0.. in order
};

// Runs attention_spans and qsa_attention_spans (with a pool: the cpu backend's
// cpu::qsa_attention_sparse) on the same random step; returns both outputs.
std::pair<std::vector<float>, std::vector<float>> run_both(const QsaCase& c, uint64_t seed,
                                                           ThreadPool* cpu_pool = nullptr) {
  std::mt19937_64 rng(seed);
  int64_t n = 0, n_ctx = 0;
  for (const Span& s : c.spans) {
    n += s.count;
    n_ctx = std::max<int64_t>(n_ctx, s.n_past + s.count);
  }
  const int64_t kv_dim = int64_t{c.n_head_kv} * c.head_dim, q_dim = int64_t{c.n_head} * c.head_dim;
  Paged paged(static_cast<int>(c.spans.size()), 16, n_ctx);
  // The past keys of each slot are in its pages already: fill the whole pool at random, the
  // step overwrites its own positions.
  std::vector<float> k_pool = randn(paged.pool_rows() * kv_dim, rng),
                     v_pool = randn(paged.pool_rows() * kv_dim, rng),
                     idx_pool = randn(paged.pool_rows() * c.index_dim, rng);
  std::vector<float> k_pool2 = k_pool, v_pool2 = v_pool;
  const std::vector<float> q = randn(n * q_dim, rng), k = randn(n * kv_dim, rng),
                           v = randn(n * kv_dim, rng),
                           iq = randn(n * c.index_heads * c.index_dim, rng),
                           ik = randn(n * c.index_dim, rng), k_norm = randn(c.index_dim, rng);
  std::vector<int32_t> tokens(n, 0), positions(n);
  for (const Span& s : c.spans)
    for (int i = 0; i < s.count; ++i) positions[s.begin + i] = s.n_past + i;
  StepLayout step{.tokens = tokens.data(),
                  .positions = positions.data(),
                  .n = n,
                  .spans = c.spans.data(),
                  .n_spans = static_cast<int>(c.spans.size()),
                  .page_tables = paged.tables.data(),
                  .page_table_stride = paged.pages_per_slot};
  const KvLayer dense_kv{.k = k_pool.data(), .v = v_pool.data(), .page_size = 16, .kv_dim = kv_dim};
  const KvLayer qsa_kv{.k = k_pool2.data(),
                       .v = v_pool2.data(),
                       .page_size = 16,
                       .kv_dim = kv_dim,
                       .idx = idx_pool.data(),
                       .idx_dim = c.index_dim};
  std::vector<float> dense(n * q_dim, NAN), sparse(n * q_dim, NAN);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  attention_spans(step, {.q = q.data(),
                         .q_stride = q_dim,
                         .k = k.data(),
                         .v = v.data(),
                         .kv = dense_kv,
                         .out = dense.data(),
                         .n_head = c.n_head,
                         .n_head_kv = c.n_head_kv,
                         .head_dim = c.head_dim,
                         .scale = scale});
  const Weight kn = f32_weight(k_norm, {c.index_dim}, "k_norm");
  const QsaArgs qsa{.attn = {.q = q.data(),
                             .q_stride = q_dim,
                             .k = k.data(),
                             .v = v.data(),
                             .kv = qsa_kv,
                             .out = sparse.data(),
                             .n_head = c.n_head,
                             .n_head_kv = c.n_head_kv,
                             .head_dim = c.head_dim,
                             .scale = scale},
                    .index_q = iq.data(),
                    .index_k = ik.data(),
                    .k_norm = kn,
                    .index_heads = c.index_heads,
                    .index_dim = c.index_dim,
                    .ratio = c.ratio,
                    .budget = c.budget,
                    .n_rot = c.n_rot,
                    .rope_theta = 10000.0f,
                    .eps = 1e-6f};
  if (cpu_pool) {
    cpu::qsa_attention_sparse(step, qsa, *cpu_pool);
  } else {
    qsa_attention_spans(step, qsa);
  }
  return {dense, sparse};
}

TEST(Qwen4ExpOps, QsaEqualsDenseAttentionWithinTheBudget) {
  // Every query sees fewer than budget + ratio keys: QSA keeps them all. Two slots, one a
  // prefill from scratch, one continuing after 5 tokens; then a budget above every context.
  QsaCase c;
  c.spans = {{.slot = 0, .begin = 0, .count = 9, .n_past = 0},
             {.slot = 1, .begin = 9, .count = 3, .n_past = 5}};
  auto [dense, sparse] = run_both(c, 1);
  for (size_t i = 0; i < dense.size(); ++i) ASSERT_EQ(dense[i], sparse[i]) << "element " << i;

  c.budget = 40;
  c.spans = {{.slot = 0, .begin = 0, .count = 37, .n_past = 0},
             {.slot = 1, .begin = 37, .count = 1, .n_past = 30}};
  auto [dense2, sparse2] = run_both(c, 2);
  for (size_t i = 0; i < dense2.size(); ++i) ASSERT_EQ(dense2[i], sparse2[i]) << "element " << i;
}

TEST(Qwen4ExpOps, QsaDropsBlocksBeyondTheBudget) {
  QsaCase c;  // budget 8, ratio 4: from 12 visible keys on, some blocks are dropped
  c.spans = {{.slot = 0, .begin = 0, .count = 30, .n_past = 0}};
  auto [dense, sparse] = run_both(c, 3);
  const int64_t q_dim = int64_t{c.n_head} * c.head_dim;
  for (int64_t t = 0; t < 30; ++t) {
    double diff = 0;
    for (int64_t d = 0; d < q_dim; ++d)
      diff = std::max(diff, std::abs(double(dense[t * q_dim + d]) - sparse[t * q_dim + d]));
    if (t + 1 < c.budget + c.ratio) {
      EXPECT_EQ(diff, 0.0) << "query " << t << " sees every key";
    } else {
      EXPECT_GT(diff, 1e-4) << "query " << t << " attends to a subset";
    }
  }
}

// The cpu backend's sparse QSA (each query's kept positions read in place, queries over the
// pool) against the reference, beyond the budget: two slots, one continuing, spans crossing it.
TEST(Qwen4ExpOps, CpuSparseQsaEqualsTheReference) {
  ThreadPool pool(2);
  QsaCase c;
  c.spans = {{.slot = 0, .begin = 0, .count = 30, .n_past = 0},
             {.slot = 1, .begin = 30, .count = 7, .n_past = 41},
             {.slot = 2, .begin = 37, .count = 1, .n_past = 60}};
  const auto [dense, want] = run_both(c, 4);
  const auto [dense_again, got] = run_both(c, 4, &pool);
  ASSERT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "element " << i << " not written";
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

TEST(Qwen4ExpOps, QsaSelectsTheBestBlocksAndTheTail) {
  // One indexer head of 2 dims, q = (1, 0): a block scores relu(its first dim) / sqrt(2).
  const std::vector<float> q = {1, 0};
  const std::vector<float> pooled = {0.1f, 5, 3, 0, -1, 7, 2, 0, 0.5f, 0, 3, 9};
  std::vector<int64_t> pos;
  // 6 complete blocks of 4 in 26 keys, tail 24, 25; keep 2 blocks: scores 0.1, 3, -1->0, 2, 0.5,
  // 3: blocks 1 and 5 tie at 3 and both beat block 3.
  qsa_select(q.data(), pooled.data(), 26, 1, 2, 4, 8, pos);
  const std::vector<int64_t> want = {4, 5, 6, 7, 20, 21, 22, 23, 24, 25};
  EXPECT_EQ(pos, want);
  // Keep 3: block 3 (score 2) joins.
  qsa_select(q.data(), pooled.data(), 26, 1, 2, 4, 12, pos);
  const std::vector<int64_t> want3 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 24, 25};
  EXPECT_EQ(pos, want3);
  // A tie at the cut goes to the lower block: blocks 1 and 5 tie for a single place.
  qsa_select(q.data(), pooled.data(), 26, 1, 2, 4, 4, pos);
  const std::vector<int64_t> want1 = {4, 5, 6, 7, 24, 25};
  EXPECT_EQ(pos, want1);
}

struct PleSetup {
  std::vector<uint64_t> mult = {3, 5, 7};
  std::vector<int64_t> vocab = {11, 13, 17, 19}, offsets = {0, 11, 24, 41};
  std::vector<float> table;  // [60 rows, 2]: row r = (r, -r)
  PleSetup() {
    for (int r = 0; r < 60; ++r) {
      table.push_back(float(r));
      table.push_back(float(-r));
    }
  }
};

// The rows of one token by the formula written out (PleSetup's multipliers 3, 5, 7, head sizes
// 11, 13, 17, 19): ctx = (t, t-1, t-2), cut already applied.
std::vector<int64_t> hand_rows(int64_t t0, int64_t t1, int64_t t2) {
  const uint64_t bi = uint64_t(t0) * 3 ^ uint64_t(t1) * 5;
  const uint64_t tri = bi ^ uint64_t(t2) * 7;
  return {int64_t(bi % 11), int64_t(bi % 13 + 11), int64_t(tri % 17 + 24), int64_t(tri % 19 + 41)};
}

TEST(Qwen4ExpOps, PleRowsFollowTheHashCutAtEosAndTheStart) {
  PleSetup p;
  const Weight table = f32_weight(p.table, {2, 60}, "per_layer_token_embd.weight");
  std::vector<float> tokens_state(2 * 2, 0.0f);  // 2 slots x (ngram - 1)
  const RecurrentLayer state{.ple_tokens = tokens_state.data()};
  const int32_t eos = 2;
  // Slot 0: tokens 9 4 2 6 8 1 (eos at row 2).
  const std::vector<int32_t> tokens = {9, 4, 2, 6, 8, 1};
  std::vector<int32_t> positions = {0, 1, 2, 3, 4, 5};
  const std::vector<Span> spans = {{.slot = 0, .begin = 0, .count = 6, .n_past = 0}};
  StepLayout step{.tokens = tokens.data(),
                  .positions = positions.data(),
                  .n = 6,
                  .spans = spans.data(),
                  .n_spans = 1};
  std::vector<float> out(6 * 4 * 2, NAN);
  const PleEmbedArgs args{.table = table,
                          .ngram = 3,
                          .heads_per_ngram = 2,
                          .eos = eos,
                          .multipliers = p.mult.data(),
                          .offsets = p.offsets.data(),
                          .vocab = p.vocab.data(),
                          .state = state,
                          .out = out.data()};
  ple_embed_spans(step, args);
  const std::vector<std::vector<int64_t>> want = {
      hand_rows(9, eos, eos),  // the start: both predecessors missing
      hand_rows(4, 9, eos),    // one predecessor
      hand_rows(2, 4, 9),      // the eos itself keeps its own context
      hand_rows(6, eos, eos),  // right after eos: cut
      hand_rows(8, 6, eos),    // eos two back: cut there
      hand_rows(1, 8, 6)};
  for (int r = 0; r < 6; ++r) {
    for (int h = 0; h < 4; ++h) {
      EXPECT_EQ(out[(r * 4 + h) * 2], float(want[r][h])) << "row " << r << " head " << h;
      EXPECT_EQ(out[(r * 4 + h) * 2 + 1], -float(want[r][h]));
    }
  }
  EXPECT_EQ(tokens_state[0], 8.0f);  // the last two tokens, oldest first
  EXPECT_EQ(tokens_state[1], 1.0f);

  // The same six tokens as 1 + 4 + 1 rows over three steps give the same rows.
  std::fill(tokens_state.begin(), tokens_state.end(), 0.0f);
  std::vector<float> out2(6 * 4 * 2, NAN);
  int begin = 0;
  for (int count : {1, 4, 1}) {
    const std::vector<Span> one = {{.slot = 0, .begin = 0, .count = count, .n_past = begin}};
    StepLayout s{.tokens = tokens.data() + begin,
                 .positions = positions.data() + begin,
                 .n = count,
                 .spans = one.data(),
                 .n_spans = 1};
    PleEmbedArgs a = args;
    a.out = out2.data() + begin * 8;
    ple_embed_spans(s, PleEmbedArgs{a});
    begin += count;
  }
  EXPECT_EQ(out, out2);
}

TEST(Qwen4ExpOps, PleConvIsDilatedCausalAndCarriesItsState) {
  // K = 3 taps, dilation 2, 2 channels: out[t] = silu(w0 x[t-4] + w1 x[t-2] + w2 x[t]).
  const std::vector<float> kernel = {0.5f, -1.0f, 2.0f, 1.0f, 0.25f, -0.5f};  // [C=2][K=3]
  const Weight w = f32_weight(kernel, {3, 2}, "ple_conv1d.weight");
  std::mt19937_64 rng(7);
  const std::vector<float> x = randn(9 * 2, rng);
  std::vector<float> conv_state(4 * 2, 0.0f);  // (K - 1) * dilation rows
  const RecurrentLayer state{.ple_conv = conv_state.data()};
  std::vector<int32_t> tokens(9, 0), positions(9);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> out(9 * 2, NAN);
  const std::vector<Span> spans = {{.slot = 0, .begin = 0, .count = 9, .n_past = 0}};
  StepLayout step{.tokens = tokens.data(),
                  .positions = positions.data(),
                  .n = 9,
                  .spans = spans.data(),
                  .n_spans = 1};
  ple_conv_spans(step,
                 {.x = x.data(), .kernel = w, .dilation = 2, .state = state, .out = out.data()});
  for (int t = 0; t < 9; ++t) {
    for (int c = 0; c < 2; ++c) {
      double acc = 0;
      for (int k = 0; k < 3; ++k) {
        const int src = t - (2 - k) * 2;
        if (src >= 0) acc += double(kernel[c * 3 + k]) * x[src * 2 + c];
      }
      EXPECT_NEAR(out[t * 2 + c], acc * sigmoid(acc), 1e-6) << "t " << t << " c " << c;
    }
  }
  // 4 + 5 rows in two steps: the same outputs.
  std::fill(conv_state.begin(), conv_state.end(), 0.0f);
  std::vector<float> out2(9 * 2, NAN);
  for (auto [begin, count] : {std::pair{0, 4}, std::pair{4, 5}}) {
    const std::vector<Span> one = {{.slot = 0, .begin = 0, .count = count, .n_past = begin}};
    StepLayout s{.tokens = tokens.data(),
                 .positions = positions.data() + begin,
                 .n = count,
                 .spans = one.data(),
                 .n_spans = 1};
    ple_conv_spans(s, {.x = x.data() + begin * 2,
                       .kernel = w,
                       .dilation = 2,
                       .state = state,
                       .out = out2.data() + begin * 2});
  }
  EXPECT_EQ(out, out2);
}

TEST(Qwen4ExpOps, HyperConnectionOpsByHand) {
  // 1 row, 2 streams of 2 dims.
  const std::vector<float> xn = {1, 2, 3, 4}, gate = {0, 1, -1, 2};
  std::vector<float> mixed(2, NAN);
  hc_mix(xn.data(), gate.data(), mixed.data(), 1, 2, 2);
  EXPECT_NEAR(mixed[0], (sigmoid(0) * 1 + sigmoid(-1) * 3) / 2, 1e-6);
  EXPECT_NEAR(mixed[1], (sigmoid(1) * 2 + sigmoid(2) * 4) / 2, 1e-6);

  std::vector<float> streams = {1, 1, 2, 2};
  const std::vector<float> block = {10, 20}, inject = {0, 2};
  hc_inject(streams.data(), block.data(), inject.data(), 1, 2, 2);
  EXPECT_NEAR(streams[0], 1 + 10 * 2 * sigmoid(0), 1e-5);  // 2 sigmoid(0 / 2) = 1
  EXPECT_NEAR(streams[3], 2 + 20 * 2 * sigmoid(1), 1e-5);  // 2 sigmoid(2 / 2)

  // Grouped norm: each stream of 2 normalised on its own with its own gamma row.
  const std::vector<float> x = {3, 4, 0, 2}, w = {1, 1, 2, 3};
  std::vector<float> out(4, NAN);
  rmsnorm_grouped(x.data(), w.data(), out.data(), 1, 2, 2, 0.0f);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(out[3], 3 * 2 / std::sqrt(2.0), 1e-6);

  std::vector<float> s = {-2, 0, 4};
  silu_scaled(s.data(), 0.5f, s.data(), 3);
  EXPECT_NEAR(s[0], -1 * sigmoid(-1), 1e-6);
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_NEAR(s[2], 2 * sigmoid(2), 1e-6);

  // PLE gate: stream 0 dot 8 / sqrt(2) -> sigmoid(sqrt(5.657)), stream 1 dot -2 -> negative.
  const std::vector<float> key = {2, 2, 1, 1}, query = {2, 2, -1, -1}, value = {1, -3};
  std::vector<float> gated(4, NAN);
  ple_gate(key.data(), query.data(), value.data(), gated.data(), 1, 2, 2);
  const double g0 = sigmoid(std::sqrt(8 / std::sqrt(2.0))),
               g1 = sigmoid(-std::sqrt(2 / std::sqrt(2.0)));
  EXPECT_NEAR(gated[0], g0, 1e-6);
  EXPECT_NEAR(gated[1], -3 * g0, 1e-6);
  EXPECT_NEAR(gated[2], g1, 1e-6);
  EXPECT_NEAR(gated[3], -3 * g1, 1e-6);
}

}  // namespace
}  // namespace qwenrt::ops::ref
