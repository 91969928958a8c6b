// The CUDA backend's qwen4exp ops (ops/cuda/qwen4exp.cu, qsa.cu, the DeltaNet sigmoid gate, the
// PLE embedding's host half in cuda_ops_qwen4exp.cpp) against ops::ref on fresh random inputs and
// odd shapes, outputs poisoned with NaN; then the committed qwen4exp fixture end to end on cuda
// against the reference backend, prefill then decode against one prefill, snapshot / restore,
// and graph replay against eager steps. Skipped without a GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"
#include "support/engine_steps.h"
#include "support/model_files.h"
#include "support/op_data.h"
#include "support/qwen4exp_fixture.h"

namespace qwenrt {
namespace {

using ops::Ops;
using ops::Span;
using ops::StepLayout;
using testing_support::rel_l2;

using testing_support::f32_weight;
using testing_support::randn;
std::vector<float> nans(size_t n) {
  return std::vector<float>(n, NAN);
}

// One backend for the stateless op tests, never destroyed (as test_cuda_elementwise.cpp); the
// stateful ones (PLE, QSA) make their own so that no earlier test's state or QSA layers count.
Ops& gpu() {
  static Ops* ops = ops::make_cuda_ops().release();
  return *ops;
}

float* to_device(Ops& ops, const std::vector<float>& host) {
  float* p = ops.alloc(static_cast<int64_t>(host.size()));
  ops.upload(host.data(), p, static_cast<int64_t>(host.size()));
  return p;
}
// Persistent device memory holding host (state pools).
float* to_buffer(Ops& ops, const std::vector<float>& host) {
  auto* p = static_cast<float*>(ops.alloc_buffer(static_cast<int64_t>(host.size()) * 4));
  ops.upload(host.data(), p, static_cast<int64_t>(host.size()));
  return p;
}
std::vector<float> to_host(Ops& ops, const float* device, size_t n) {
  std::vector<float> host(n);
  ops.download(device, host.data(), static_cast<int64_t>(n));
  return host;
}

// The worst relative L2 error over rows of `width` floats (NaN if any element of got is NaN).
double worst_row(const std::vector<float>& got, const std::vector<float>& want, int64_t width) {
  double worst = 0;
  for (size_t r = 0; r * width < want.size(); ++r) {
    const std::vector<float> g(got.begin() + r * width, got.begin() + (r + 1) * width);
    const std::vector<float> w(want.begin() + r * width, want.begin() + (r + 1) * width);
    for (float x : g)
      if (std::isnan(x)) return NAN;
    worst = std::max(worst, rel_l2(g, w));
  }
  return worst;
}

// A step's host arrays: spans in row order, positions n_past + i, page tables (slot s owns pages
// s * pages_per_slot ..), every row an output row.
struct Step {
  std::vector<Span> spans;
  std::vector<int32_t> tokens, positions, output_rows, tables;
  int pages_per_slot = 1;
  bool keep_states = false;
  Step(std::vector<Span> s, int n_slots, int page_size, int64_t capacity,
       std::vector<int32_t> toks = {})
      : spans(std::move(s)) {
    int32_t begin = 0;
    for (Span& sp : spans) {
      sp.begin = begin;
      begin += sp.count;
      keep_states = keep_states || sp.keep_states;
      for (int i = 0; i < sp.count; ++i) positions.push_back(sp.n_past + i);
    }
    tokens = toks.empty() ? std::vector<int32_t>(begin, 0) : std::move(toks);
    output_rows.resize(begin);
    std::iota(output_rows.begin(), output_rows.end(), 0);
    pages_per_slot = static_cast<int>((capacity + page_size - 1) / page_size);
    tables.resize(int64_t{n_slots} * pages_per_slot);
    std::iota(tables.begin(), tables.end(), 0);
  }
  int64_t n() const { return static_cast<int64_t>(positions.size()); }
  StepLayout layout() const {
    return {.tokens = tokens.data(),
            .positions = positions.data(),
            .n = n(),
            .spans = spans.data(),
            .n_spans = static_cast<int>(spans.size()),
            .output_rows = output_rows.data(),
            .n_output_rows = n(),
            .page_tables = tables.data(),
            .page_table_stride = pages_per_slot,
            .keep_states = keep_states};
  }
};

// ---- Stateless ops ----

// rmsnorm_grouped (block per vector; short and long rows, in place), silu_scaled, hc_mix,
// hc_inject, ple_gate. fp32 sums against ref's double ones and expf against std::exp: 2e-6.
TEST(CudaQwen4expOps, ElementwiseMatchTheReference) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ops& ops = gpu();
  constexpr double kTol = 2e-6;
  std::mt19937_64 rng(41);
  for (auto [rows, groups, dim] :
       {std::tuple{7, 3, 5}, std::tuple{3, 4, 37}, std::tuple{5, 2, 300}, std::tuple{2, 4, 2600}}) {
    ops.reset_workspace();
    const int64_t n = int64_t{rows} * groups * dim;
    const auto x = randn(n, rng, 2.0f), w = randn(int64_t{groups} * dim, rng);
    const Weight weight = ops.place(f32_weight(w, {dim, groups}, "hc_norm.weight"));
    std::vector<float> want = nans(n);
    ops::ref::rmsnorm_grouped(x.data(), w.data(), want.data(), rows, groups, dim, 1e-6f);
    float* dx = to_device(ops, x);
    float* dout = to_device(ops, nans(n));
    ops.rmsnorm_grouped(dx, weight, dout, rows, groups, dim, 1e-6f);
    EXPECT_LT(worst_row(to_host(ops, dout, n), want, dim), kTol) << "rmsnorm_grouped " << dim;
    EXPECT_EQ(to_host(ops, dx, n), x) << "the input is left alone";
    ops.rmsnorm_grouped(dx, weight, dx, rows, groups, dim, 1e-6f);
    EXPECT_LT(worst_row(to_host(ops, dx, n), want, dim), kTol) << "in place " << dim;
  }
  {
    ops.reset_workspace();
    const int64_t n = 1001;
    const auto x = randn(n, rng, 3.0f);
    std::vector<float> want = nans(n);
    ops::ref::silu_scaled(x.data(), 0.25f, want.data(), n);
    float* dx = to_device(ops, x);
    float* dout = to_device(ops, nans(n));
    ops.silu_scaled(dx, 0.25f, dout, n);
    EXPECT_LT(rel_l2(to_host(ops, dout, n), want), kTol) << "silu_scaled";
    ops.silu_scaled(dx, 0.25f, dx, n);
    EXPECT_LT(rel_l2(to_host(ops, dx, n), want), kTol) << "silu_scaled in place";
  }
  for (auto [n, hc, dim] : {std::tuple{5, 4, 37}, std::tuple{1, 3, 2560}, std::tuple{9, 4, 129}}) {
    ops.reset_workspace();
    const int64_t wide = int64_t{hc} * dim;
    const auto xn = randn(n * wide, rng), gate = randn(n * wide, rng, 2.0f);
    std::vector<float> want = nans(n * dim);
    ops::ref::hc_mix(xn.data(), gate.data(), want.data(), n, hc, dim);
    float* dout = to_device(ops, nans(n * dim));
    ops.hc_mix(to_device(ops, xn), to_device(ops, gate), dout, n, hc, dim);
    EXPECT_LT(worst_row(to_host(ops, dout, n * dim), want, dim), kTol) << "hc_mix " << dim;

    const auto streams = randn(n * wide, rng), block = randn(n * dim, rng),
               inject = randn(n * hc, rng, 3.0f);
    std::vector<float> want_streams = streams;
    ops::ref::hc_inject(want_streams.data(), block.data(), inject.data(), n, hc, dim);
    float* ds = to_device(ops, streams);
    ops.hc_inject(ds, to_device(ops, block), to_device(ops, inject), n, hc, dim);
    EXPECT_LT(worst_row(to_host(ops, ds, n * wide), want_streams, dim), kTol) << "hc_inject";

    // Keys and queries scaled so the gate's argument spans both signs and the 1e-6 floor.
    const auto key = randn(n * wide, rng), query = randn(n * wide, rng, 0.5f),
               value = randn(n * dim, rng);
    std::vector<float> want_gate = nans(n * wide);
    ops::ref::ple_gate(key.data(), query.data(), value.data(), want_gate.data(), n, hc, dim);
    float* dg = to_device(ops, nans(n * wide));
    ops.ple_gate(to_device(ops, key), to_device(ops, query), to_device(ops, value), dg, n, hc, dim);
    EXPECT_LT(worst_row(to_host(ops, dg, n * wide), want_gate, dim), 1e-5) << "ple_gate " << dim;
  }
}

// ---- PLE conv ----

// Three slots over three steps (prefill spans, decode rows, a keep_states span): the outputs
// (fp32 against ref's double sums, 1e-5), the conv history and the kept histories (copies:
// exact). F32 and F16 taps.
TEST(CudaQwen4expOps, PleConvMatchesTheReferenceAcrossSteps) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::F32, DType::F16}) {
    auto ops = ops::make_cuda_ops();
    std::mt19937_64 rng(dtype == DType::F32 ? 5 : 6);
    const int K = 4, dilation = 3, n_slots = 3, history_rows = 2;
    const int64_t C = dtype == DType::F32 ? 37 : 300, hist = int64_t{K - 1} * dilation;
    std::vector<float> taps = randn(K * C, rng, 0.5f);
    std::vector<uint16_t> taps16(taps.size());
    for (size_t i = 0; i < taps.size(); ++i) {
      taps16[i] = quant::fp32_to_fp16(taps[i]);
      quant::dequantize(DType::F16, &taps16[i], &taps[i], 1, "taps");  // the values F16 holds
    }
    const void* tap_data = dtype == DType::F32 ? static_cast<const void*>(taps.data())
                                               : static_cast<const void*>(taps16.data());
    const Weight host_w{"ple_conv1d.weight",
                        TensorView::contiguous(dtype, 2, {K, C, 1, 1}, tap_data)};
    const Weight dev_w = ops->place(host_w);
    // Host and device state: a random history to start from.
    std::vector<float> state = randn(n_slots * hist * C, rng),
                       history(n_slots * history_rows * hist * C, 0.0f);
    const ops::RecurrentLayer host_state{
        .history_rows = history_rows, .ple_conv = state.data(), .ple_conv_history = history.data()};
    const ops::RecurrentLayer dev_state{.history_rows = history_rows,
                                        .ple_conv = to_buffer(*ops, state),
                                        .ple_conv_history = to_buffer(*ops, history)};
    const std::vector<std::vector<Span>> steps = {
        {{.slot = 0, .count = 5}, {.slot = 1, .count = 1}, {.slot = 2, .count = 12}},
        {{.slot = 0, .count = 1, .n_past = 5},
         {.slot = 1, .count = 1, .n_past = 1},
         {.slot = 2, .count = 1, .n_past = 12}},
        {{.slot = 1, .count = 4, .n_past = 2, .keep_states = 1},
         {.slot = 0, .count = 1, .n_past = 6}}};
    for (size_t si = 0; si < steps.size(); ++si) {
      ops->reset_workspace();
      const Step step(steps[si], n_slots, 64, 64);
      const int64_t n = step.n();
      const auto x = randn(n * C, rng);
      std::vector<float> want = nans(n * C);
      ops::ref::ple_conv_spans(step.layout(), {.x = x.data(),
                                               .kernel = host_w,
                                               .dilation = dilation,
                                               .state = host_state,
                                               .out = want.data()});
      ops->begin_step(step.layout());
      float* dout = to_device(*ops, nans(n * C));
      ops->ple_conv({.x = to_device(*ops, x),
                     .kernel = dev_w,
                     .dilation = dilation,
                     .state = dev_state,
                     .out = dout});
      EXPECT_LT(worst_row(to_host(*ops, dout, n * C), want, C), 1e-5) << "step " << si;
      EXPECT_EQ(to_host(*ops, dev_state.ple_conv, state.size()), state) << "step " << si;
      EXPECT_EQ(to_host(*ops, dev_state.ple_conv_history, history.size()), history)
          << "step " << si;
    }
  }
}

// ---- PLE embedding ----

// The rows of four steps equal ref's bit for bit (both read the F32 table rows on the host), and
// the device token state (and a keep_states span's history) equals ref's after each: across a
// reset (fill_zero) and a copy between slots done outside ple_embed, which the host mirror must
// notice.
TEST(CudaQwen4expOps, PleEmbedMatchesTheReferenceAcrossSteps) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto ops = ops::make_cuda_ops();
  std::mt19937_64 rng(17);
  const int ngram = 3, heads_per_ngram = 2, ctx_len = ngram - 1, heads = 4, head_dim = 5;
  const int n_slots = 3, history_rows = 3;
  const int32_t eos = 2;
  const std::vector<uint64_t> mult = {3, 5, 7};
  const std::vector<int64_t> vocab = {11, 13, 17, 19}, offsets = {0, 11, 24, 41};
  const std::vector<float> table = randn(60 * head_dim, rng);
  const Weight w = f32_weight(table, {head_dim, 60}, "per_layer_token_embd.weight");
  std::vector<float> tokens(n_slots * ctx_len, 0.0f),
      history(n_slots * history_rows * ctx_len, 0.0f);
  const ops::RecurrentLayer host_state{.history_rows = history_rows,
                                       .ple_tokens = tokens.data(),
                                       .ple_tokens_history = history.data()};
  const ops::RecurrentLayer dev_state{.history_rows = history_rows,
                                      .ple_tokens = to_buffer(*ops, tokens),
                                      .ple_tokens_history = to_buffer(*ops, history)};
  auto args = [&](const ops::RecurrentLayer& state, float* out) {
    return ops::PleEmbedArgs{.table = w,
                             .ngram = ngram,
                             .heads_per_ngram = heads_per_ngram,
                             .eos = eos,
                             .multipliers = mult.data(),
                             .offsets = offsets.data(),
                             .vocab = vocab.data(),
                             .state = state,
                             .out = out};
  };
  struct Case {
    std::vector<Span> spans;
    std::vector<int32_t> tokens;
  };
  const std::vector<Case> cases = {
      {{{.slot = 0, .count = 6}, {.slot = 2, .count = 3}}, {9, 4, 2, 6, 8, 1, 7, 3, 2}},
      {{{.slot = 0, .count = 1, .n_past = 6},
        {.slot = 2, .count = 1, .n_past = 3},
        {.slot = 1, .count = 2}},
       {5, 11, 2, 9}},
      {{{.slot = 2, .count = 1},
        {.slot = 1, .count = 1, .n_past = 7},
        {.slot = 0, .count = 1, .n_past = 7}},
       {13, 4, 6}},
      {{{.slot = 0, .count = 4, .n_past = 8, .keep_states = 1},
        {.slot = 1, .count = 1, .n_past = 8}},
       {3, 2, 10, 12, 1}}};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    if (ci == 2) {
      // Outside any ple_embed: slot 2 reset, slot 0's tokens copied to slot 1.
      ops->fill_zero(dev_state.ple_tokens + 2 * ctx_len, ctx_len * 4);
      ops->copy(dev_state.ple_tokens + ctx_len, dev_state.ple_tokens, ctx_len * 4);
      std::fill(tokens.begin() + 2 * ctx_len, tokens.end(), 0.0f);
      std::copy(tokens.begin(), tokens.begin() + ctx_len, tokens.begin() + ctx_len);
    }
    ops->reset_workspace();
    const Step step(cases[ci].spans, n_slots, 64, 64, cases[ci].tokens);
    const int64_t n = step.n(), width = int64_t{heads} * head_dim;
    std::vector<float> want = nans(n * width);
    ops::ref::ple_embed_spans(step.layout(), args(host_state, want.data()));
    ops->begin_step(step.layout());
    float* dout = to_device(*ops, nans(n * width));
    ops->ple_embed(args(dev_state, dout));
    EXPECT_EQ(to_host(*ops, dout, n * width), want) << "step " << ci;
    EXPECT_EQ(to_host(*ops, dev_state.ple_tokens, tokens.size()), tokens) << "step " << ci;
    EXPECT_EQ(to_host(*ops, dev_state.ple_tokens_history, history.size()), history)
        << "step " << ci;
  }
}

// ---- Qwen Sparse Attention ----

struct QsaCase {
  std::string name;
  int n_head, n_head_kv, head_dim, index_heads, index_dim, n_rot, ratio, budget;
  std::vector<Span> spans;       // slots 0.. in order
  bool zero_index_keys = false;  // every pooled key 0: every score ties
  double tol = 1e-4;
};

// One step of qsa_attention on a fresh backend against ref::qsa_attention_spans: the output rows
// (fp32 attention and scores against ref's double: 1e-4, a selection flip would be far above;
// the case's own tolerance where attention.cu's f16 flash prefill runs) and the pools after the
// step (copies: exact).
void run_qsa(const QsaCase& c) {
  auto ops = ops::make_cuda_ops();
  std::mt19937_64 rng(c.head_dim * 131 + c.budget * 7 + c.spans.size());
  const int n_slots = static_cast<int>(c.spans.size()), page_size = 16;
  int64_t capacity = 0;
  for (const Span& s : c.spans) capacity = std::max<int64_t>(capacity, s.n_past + s.count);
  capacity += 37;  // the kernels' grids cover the capacity, past every span's blocks
  const Step step(c.spans, n_slots, page_size, capacity);
  const int64_t n = step.n(), kv_dim = int64_t{c.n_head_kv} * c.head_dim,
                q_dim = int64_t{c.n_head} * c.head_dim;
  const int64_t pool_rows = static_cast<int64_t>(step.tables.size()) * page_size;
  std::vector<float> k_pool = randn(pool_rows * kv_dim, rng),
                     v_pool = randn(pool_rows * kv_dim, rng),
                     idx_pool = randn(pool_rows * c.index_dim, rng);
  const auto q = randn(n * q_dim, rng), k = randn(n * kv_dim, rng), v = randn(n * kv_dim, rng),
             iq = randn(n * c.index_heads * c.index_dim, rng), k_norm = randn(c.index_dim, rng);
  std::vector<float> ik = randn(n * c.index_dim, rng);
  if (c.zero_index_keys) {
    std::fill(idx_pool.begin(), idx_pool.end(), 0.0f);
    std::fill(ik.begin(), ik.end(), 0.0f);
  }
  const ops::KvLayer dev_kv{.k = to_buffer(*ops, k_pool),
                            .v = to_buffer(*ops, v_pool),
                            .page_size = page_size,
                            .kv_dim = kv_dim,
                            .idx = to_buffer(*ops, idx_pool),
                            .idx_dim = c.index_dim};
  const ops::KvLayer host_kv{.k = k_pool.data(),
                             .v = v_pool.data(),
                             .page_size = page_size,
                             .kv_dim = kv_dim,
                             .idx = idx_pool.data(),
                             .idx_dim = c.index_dim};
  const Weight host_norm = f32_weight(k_norm, {c.index_dim}, "indexer.k_norm.weight");
  const Weight dev_norm = ops->place(host_norm);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  auto args = [&](const ops::KvLayer& kv, const float* dq, const float* dk, const float* dv,
                  const float* diq, const float* dik, const Weight& norm, float* out) {
    return ops::QsaArgs{.attn = {.q = dq,
                                 .q_stride = q_dim,
                                 .k = dk,
                                 .v = dv,
                                 .kv = kv,
                                 .out = out,
                                 .n_head = c.n_head,
                                 .n_head_kv = c.n_head_kv,
                                 .head_dim = c.head_dim,
                                 .scale = scale},
                        .index_q = diq,
                        .index_k = dik,
                        .k_norm = norm,
                        .index_heads = c.index_heads,
                        .index_dim = c.index_dim,
                        .ratio = c.ratio,
                        .budget = c.budget,
                        .n_rot = c.n_rot,
                        .rope_theta = 10000.0f,
                        .eps = 1e-6f};
  };
  std::vector<float> want = nans(n * q_dim);
  ops::ref::qsa_attention_spans(step.layout(), args(host_kv, q.data(), k.data(), v.data(),
                                                    iq.data(), ik.data(), host_norm, want.data()));
  ops->begin_step(step.layout());
  float* dout = to_device(*ops, nans(n * q_dim));
  ops->qsa_attention(args(dev_kv, to_device(*ops, q), to_device(*ops, k), to_device(*ops, v),
                          to_device(*ops, iq), to_device(*ops, ik), dev_norm, dout));
  const double err = worst_row(to_host(*ops, dout, n * q_dim), want, c.head_dim);
  fmt::print("[cuda qsa] {}: worst row rel L2 {:.2e}\n", c.name, err);
  EXPECT_LT(err, c.tol) << c.name;
  EXPECT_EQ(to_host(*ops, dev_kv.k, k_pool.size()), k_pool) << c.name;
  EXPECT_EQ(to_host(*ops, dev_kv.v, v_pool.size()), v_pool) << c.name;
  EXPECT_EQ(to_host(*ops, dev_kv.idx, idx_pool.size()), idx_pool) << c.name;
}

TEST(CudaQwen4expOps, QsaMatchesTheReference) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<QsaCase> cases = {
      // Every key kept, a head size attention.cu takes: its kernels (the indexer keys written).
      // Spans of more than 16 query vectors run its flash prefill on f16 inputs
      // (test_cuda_attention.cpp bounds its elements by 1e-2): 1e-2.
      {"dense on attention.cu, head_dim 64",
       4,
       2,
       64,
       3,
       24,
       8,
       4,
       1024,
       {{.slot = 0, .count = 37},
        {.slot = 1, .count = 1, .n_past = 50},
        {.slot = 2, .count = 13, .n_past = 20}},
       false,
       1e-2},
      // Every key kept, a head size only qsa.cu takes.
      {"dense on qsa.cu, head_dim 32",
       4,
       2,
       32,
       2,
       16,
       8,
       4,
       1024,
       {{.slot = 0, .count = 37}, {.slot = 1, .count = 1, .n_past = 50}}},
      // Blocks dropped: a prefill span, decode rows beyond and within the budget, a chunk
      // continuing a slot mid-block.
      {"sparse, budget 8 ratio 4",
       4,
       2,
       64,
       3,
       24,
       8,
       4,
       8,
       {{.slot = 0, .count = 37},
        {.slot = 1, .count = 1, .n_past = 50},
        {.slot = 2, .count = 13, .n_past = 21},
        {.slot = 3, .count = 1, .n_past = 5}}},
      // Odd sizes: 5 heads over 1 KV head, head_dim 40, index_dim 20, ratio 3, budget 10
      // (keep 3 blocks).
      {"sparse, odd sizes",
       5,
       1,
       40,
       2,
       20,
       4,
       3,
       10,
       {{.slot = 0, .count = 29, .n_past = 3}, {.slot = 1, .count = 1, .n_past = 77}}},
      // The released shapes' head sizes, long contexts, more rows than one pass (256).
      {"sparse, head_dim 256, index_dim 128, 300 rows",
       8,
       2,
       256,
       4,
       128,
       64,
       4,
       64,
       {{.slot = 0, .count = 1, .n_past = 300},
        {.slot = 1, .count = 300, .n_past = 40},
        {.slot = 2, .count = 1, .n_past = 513}}},
      // Every score 0: the selection keeps the lowest blocks (ties to the lower block).
      {"sparse, all scores tie",
       4,
       2,
       64,
       3,
       24,
       8,
       4,
       8,
       {{.slot = 0, .count = 41}, {.slot = 1, .count = 1, .n_past = 60}},
       true}};
  for (const QsaCase& c : cases) run_qsa(c);
}

// ---- End to end on the committed fixture ----

const std::string kFile = testing_support::qwen4exp_file();
constexpr int kVocab = 1024;

using testing_support::run_prompt;

std::unique_ptr<engine::Engine> load(const std::string& path, const std::string& backend,
                                     int n_slots = 1) {
  engine::EngineOptions o;
  o.backend = backend;
  o.n_slots = n_slots;
  o.n_threads = 2;
  o.n_ctx = 1024;
  return engine::Engine::load(path, o);
}

std::vector<float> row(const std::vector<float>& logits, int64_t r) {
  return testing_support::logits_row(logits, r, kVocab);
}
using testing_support::argmax;
using Agreement = testing_support::LogitAgreement;

Agreement compare(const std::vector<float>& a, const std::vector<float>& b) {
  Agreement r;
  for (size_t i = 0; i * kVocab < b.size(); ++i) r.add(row(a, i), row(b, i));
  return r;
}

// A copy of the fixture with the indexer budget above the prompt: QSA keeps every key.
const std::string& dense_file() {
  static const std::string path = testing_support::qwen4exp_dense_copy("cuda_qwen4exp_dense.gguf");
  return path;
}

// How close two runs of the fixture must be. The cuda matmuls quantise activations to int8 (decode
// rows) or round them to bf16 (prefill GEMMs); the cpu backend's int8 activations measured 2.2e-2
// against transformers on this fixture (test_qwen4exp.cpp). Most rows here are within 5e-2, but a
// few rows land 0.06-0.17 away, and which rows depends on the rounding, not on the path: on the
// H200 the bf16 prefill put rows 29, 33, 53, 162 over 5e-2, the int8 path (QWENRT_CUDA_GEMM_ROWS=0)
// only row 53, and with QSA keeping every key the int8 path row 130 (0.055). A discrete choice
// (top-10 of the MoE router, QSA's kept blocks) flipping on a near tie moves a whole row; so a few
// rows may exceed 5e-2 (3% of them) but none 0.25, and a top token may differ only where the
// other run's top two logits are within 0.3 (the rule of the cuda chat tests, docs/decisions.md).
void expect_close(const Agreement& a, const std::string& what) {
  EXPECT_LT(a.worst, 0.25) << what << "; " << a.rows_over(5e-2);
  EXPECT_LE(a.rows_above(5e-2), a.n * 3 / 100) << what << "; " << a.rows_over(5e-2);
  EXPECT_LT(a.widest_flip_gap, 0.3) << what << "; " << a.rows_over(5e-2);
}

// The whole prompt in one step on cuda against the reference backend, with QSA dropping blocks
// (budget 8) and keeping every key.
TEST(CudaQwen4exp, FixtureMatchesTheReferenceBackend) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto ids = testing_support::qwen4exp_prompt();
  for (const std::string& file : {kFile, dense_file()}) {
    const auto want = run_prompt(*load(file, "ref"), ids, {});
    const auto got = run_prompt(*load(file, "cuda"), ids, {});
    ASSERT_EQ(got.size(), want.size());
    const Agreement a = compare(got, want);
    const std::string what = file == kFile ? "budget 8" : "dense";
    fmt::print(
        "[cuda qwen4exp] {}: worst rel L2 {:.2e}, {} rows over 5e-2, top-1 {}/{} (widest "
        "flipped gap {:.3f})\n",
        what, a.worst, a.rows_above(5e-2), a.top1, a.n, a.widest_flip_gap);
    expect_close(a, what);
  }
}

// Prefill N, then one token a step (the decode kernels, QSA over the pages written by earlier
// steps, the PLE and DeltaNet state carried), equals one prefill of the whole prompt within the
// same bounds (prefill and decode rows take different matmul kernels: bf16 GEMM against int8
// GEMV).
TEST(CudaQwen4exp, PrefillThenDecodeEqualsOnePrefill) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto ids = testing_support::qwen4exp_prompt();
  auto whole = load(kFile, "cuda");
  const auto one = run_prompt(*whole, ids, {});
  for (size_t n_prefill : {size_t{5}, size_t{40}}) {
    std::vector<size_t> chunks(ids.size() - n_prefill, 1);
    chunks.insert(chunks.begin(), n_prefill);
    auto e = load(kFile, "cuda");
    const auto steps = run_prompt(*e, ids, chunks);
    ASSERT_EQ(steps.size(), one.size());
    const Agreement a = compare(steps, one);
    fmt::print(
        "[cuda qwen4exp] prefill {} + decode: worst rel L2 {:.2e}, {} rows over 5e-2, top-1 "
        "{}/{} (widest flipped gap {:.3f})\n",
        n_prefill, a.worst, a.rows_above(5e-2), a.top1, a.n, a.widest_flip_gap);
    expect_close(a, "prefill " + std::to_string(n_prefill));
  }
}

// A snapshot restored gives the same next logits bit for bit (KV and indexer pages, DeltaNet, PLE
// tokens and conv state; the PLE mirror re-read after the restore's copies), and a slot
// restored into another runs on from there.
TEST(CudaQwen4exp, SnapshotRestoreContinues) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto ids = testing_support::qwen4exp_prompt();
  auto e = load(kFile, "cuda", 2);
  const std::vector<int32_t> head(ids.begin(), ids.begin() + 60);
  run_prompt(*e, head, {});
  state::Snapshot snap = e->states().snapshot(0);
  auto next = [&](int slot, int32_t token, int32_t pos) {
    engine::Batch b;
    b.add(slot, token, pos, true);
    return e->step(b);
  };
  const auto first = next(0, ids[60], 60);
  const auto second = next(0, ids[61], 61);
  next(0, ids[62], 62);
  e->states().restore(0, snap);
  EXPECT_EQ(next(0, ids[60], 60), first) << "restore brings back KV, DeltaNet and PLE state";
  EXPECT_EQ(next(0, ids[61], 61), second);
  e->states().restore(1, snap);
  EXPECT_EQ(next(1, ids[60], 60), first) << "the snapshot restored into another slot";
}

// Greedy decoding through CUDA graphs (the PLE rows filled on the host while a graph replays;
// the QSA path switching from dense to dropping blocks at position 12, a new graph key) equals
// eager steps exactly.
TEST(CudaQwen4exp, GraphReplayEqualsEagerSteps) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto ids = testing_support::qwen4exp_prompt();
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 6);
  auto greedy = [&](engine::Engine& e) {
    ops::SamplingRow row;
    row.temperature = 0;
    std::vector<ops::SampledToken> out, all;
    engine::Batch b;
    for (size_t i = 0; i < prompt.size(); ++i)
      b.add(0, prompt[i], static_cast<int32_t>(i), i + 1 == prompt.size());
    e.step_sample(b, {&row, 1}, 3, out);
    all.push_back(out.at(0));
    for (int i = 1; i < 40; ++i) {
      b.clear();
      b.add(0, all.back().id, static_cast<int32_t>(prompt.size() + i - 1), true);
      e.step_sample(b, {&row, 1}, 3, out);
      all.push_back(out.at(0));
    }
    return all;
  };
  setenv("QWENRT_CUDA_GRAPHS", "0", 1);
  auto eager = load(kFile, "cuda");
  unsetenv("QWENRT_CUDA_GRAPHS");
  auto graphed = load(kFile, "cuda");
  const auto a = greedy(*eager);
  const auto b = greedy(*graphed);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].id, b[i].id) << "token " << i;
    ASSERT_EQ(a[i].logprob, b[i].logprob) << "token " << i;
  }
}

}  // namespace
}  // namespace qwenrt
