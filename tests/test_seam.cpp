// The backend seam's properties (DESIGN.md "Backends"): one op call per layer per op whatever the
// number of sequences, no allocation in a decode step after warm-up, a snapshot of one slot
// leaves every other slot alone, shared KV pages are copied on write, and sampling on the
// backend equals the sampler.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "ops/ref/sampling.h"
#include "sample/sampler.h"
#include "support/model_files.h"

// Counts heap allocations while armed (the whole test binary shares this operator new). Not under
// AddressSanitizer: replacing some of operator new's forms there would pair ours with its own
// (nothrow new, used by std::stable_sort, is its) and hide its new/delete mismatch checks; the
// plain build runs the count.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QWENRT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define QWENRT_ASAN 1
#endif

namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace

#ifndef QWENRT_ASAN
// GCC pairs the inlined malloc/free with new/delete expressions and warns; the pairing is ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(size_t size) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  return std::malloc(size ? size : 1);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
#endif

namespace qwenrt {
namespace {

using engine::Batch;
using engine::Engine;
using engine::EngineOptions;
using testing_support::random_tokens;
using testing_support::rel_l2;

// Forwards to a backend and counts the calls of each entry.
class CountingOps final : public ops::Ops {
 public:
  explicit CountingOps(std::unique_ptr<ops::Ops> inner, std::map<std::string, int>* counts,
                       int64_t* peak_floats = nullptr)
      : inner_(std::move(inner)), counts_(counts), peak_(peak_floats) {}
  const char* name() const override { return inner_->name(); }
  float* alloc(int64_t n) override {
    live_ += n;
    if (peak_) *peak_ = std::max(*peak_, live_);
    return tick("alloc"), inner_->alloc(n);
  }
  void reset_workspace() override {
    live_ = 0;
    inner_->reset_workspace();
  }
  // Marks are this wrapper's own (the live workspace at the mark), paired with the inner one's.
  int64_t workspace_mark() override {
    marks_.push_back({live_, inner_->workspace_mark()});
    return static_cast<int64_t>(marks_.size()) - 1;
  }
  void workspace_release(int64_t mark) override {
    live_ = marks_.at(mark).first;
    inner_->workspace_release(marks_.at(mark).second);
  }
  void* alloc_buffer(int64_t b) override { return inner_->alloc_buffer(b); }
  void free_buffer(void* b) override { inner_->free_buffer(b); }
  void copy(void* d, const void* s, int64_t b) override { tick("copy"), inner_->copy(d, s, b); }
  void fill_zero(void* d, int64_t b) override { inner_->fill_zero(d, b); }
  void upload(const float* h, float* d, int64_t n) override {
    tick("upload"), inner_->upload(h, d, n);
  }
  void download(const float* s, float* h, int64_t n) override {
    tick("download"), inner_->download(s, h, n);
  }
  Weight place(const Weight& w) override { return inner_->place(w); }
  void begin_step(const ops::StepLayout& l) override { tick("begin_step"), inner_->begin_step(l); }
  void embed(const Weight& t, float* o) override { tick("embed"), inner_->embed(t, o); }
  void matmul(const Weight& w, const float* x, float* y, int64_t n) override {
    tick("matmul"), inner_->matmul(w, x, y, n);
  }
  void rmsnorm(const float* x, const Weight& w, float* o, int64_t r, int64_t d, float e) override {
    tick("rmsnorm"), inner_->rmsnorm(x, w, o, r, d, e);
  }
  void rope_neox(float* x, int h, int hd, int64_t s, int r, float t) override {
    tick("rope_neox"), inner_->rope_neox(x, h, hd, s, r, t);
  }
  void silu_mul(const float* g, const float* u, float* o, int64_t n) override {
    tick("silu_mul"), inner_->silu_mul(g, u, o, n);
  }
  void sigmoid_mul(const float* x, const float* g, int64_t gs, float* o, int64_t r,
                   int64_t c) override {
    tick("sigmoid_mul"), inner_->sigmoid_mul(x, g, gs, o, r, c);
  }
  void add(const float* a, const float* b, float* o, int64_t n) override {
    tick("add"), inner_->add(a, b, o, n);
  }
  void add_rmsnorm(float* x, const float* d, const Weight& w, float* o, int64_t r, int64_t c,
                   float e) override {
    tick("add_rmsnorm"), inner_->add_rmsnorm(x, d, w, o, r, c, e);
  }
  void matmuls(const float* x, int64_t n, std::span<const Projection> p) override {
    tick("matmuls"), inner_->matmuls(x, n, p);
  }
  void ffn_swiglu(const Weight& g, const Weight& u, const Weight& d, const float* x, float* o,
                  int64_t n) override {
    tick("ffn_swiglu"), inner_->ffn_swiglu(g, u, d, x, o, n);
  }
  bool copies_weights() const override { return inner_->copies_weights(); }
  void set_place_progress(std::function<void(uint64_t, uint64_t)> p, uint64_t total) override {
    inner_->set_place_progress(std::move(p), total);
  }
  void copy_2d(const float* s, int64_t ss, float* d, int64_t ds, int64_t r, int64_t c) override {
    tick("copy_2d"), inner_->copy_2d(s, ss, d, ds, r, c);
  }
  void gather_output_rows(const float* x, int64_t d, float* o) override {
    tick("gather_output_rows"), inner_->gather_output_rows(x, d, o);
  }
  void attention(const ops::AttentionArgs& a) override { tick("attention"), inner_->attention(a); }
  void deltanet(const ops::DeltaNetArgs& a) override { tick("deltanet"), inner_->deltanet(a); }
  void moe(const ops::MoeWeights& w, const float* x, float* o, int64_t n, int ne, int k) override {
    tick("moe"), inner_->moe(w, x, o, n, ne, k);
  }
  void sample(const float* l, int64_t v, const ops::SamplingRow* r, int t,
              ops::SampledToken* o) override {
    tick("sample"), inner_->sample(l, v, r, t, o);
  }

 private:
  void tick(const char* what) { ++(*counts_)[what]; }
  std::unique_ptr<ops::Ops> inner_;
  std::map<std::string, int>* counts_;
  int64_t* peak_;
  int64_t live_ = 0;
  std::vector<std::pair<int64_t, int64_t>> marks_;
};

struct SeamCase {
  model::Arch arch;
  const char* backend;
  int tensor_parallel = 1;  // ranks (model/shard.h)
};

std::string case_name(const ::testing::TestParamInfo<SeamCase>& info) {
  return std::string(info.param.arch == model::Arch::kQwen35 ? "dense_" : "moe_") +
         info.param.backend +
         (info.param.tensor_parallel > 1 ? "_tp" + std::to_string(info.param.tensor_parallel) : "");
}

class SeamTest : public ::testing::TestWithParam<SeamCase> {
 protected:
  void SetUp() override {
    if (std::string(GetParam().backend) == "cuda" && !ops::cuda_available()) {
      GTEST_SKIP() << "no CUDA device";
    }
  }
  std::string path() {
    const bool dense = GetParam().arch == model::Arch::kQwen35;
    if (std::string(GetParam().backend) == "cuda") {
      // The cuda attention kernels take head_dim 64, 128 or 256 (the tiny default is 16).
      return testing_support::write_tiny(GetParam().arch,
                                         dense ? "seam_dense_hd64.gguf" : "seam_moe_hd64.gguf",
                                         [](model::SynthSpec& s) { s.config.head_dim = 64; });
    }
    return testing_support::write_tiny(GetParam().arch,
                                       dense ? "seam_dense.gguf" : "seam_moe.gguf");
  }
  std::unique_ptr<Engine> load(int slots, std::map<std::string, int>* counts = nullptr) {
    EngineOptions o;
    o.backend = GetParam().backend;
    o.n_slots = slots;
    o.n_ctx = 256;
    o.tensor_parallel = GetParam().tensor_parallel;
    if (counts) {
      const std::string backend = o.backend;
      o.make_backend = [counts, backend] {
        return std::make_unique<CountingOps>(backend == "ref"    ? ops::make_ref_ops()
                                             : backend == "cuda" ? ops::make_cuda_ops()
                                                                 : ops::make_cpu_ops(2),
                                             counts);
      };
    }
    return Engine::load(path(), o);
  }
};

// A batch with `prompt` tokens of each of `n_seq` sequences starting at each slot's length.
Batch prefill_batch(Engine& e, int n_seq, int prompt, uint64_t seed) {
  Batch b;
  for (int s = 0; s < n_seq; ++s) {
    const auto ids = random_tokens(prompt, e.config().n_vocab, seed + s);
    const int64_t start = e.states().n_tokens(s);
    for (int i = 0; i < prompt; ++i) b.add(s, ids[i], static_cast<int32_t>(start + i), true);
  }
  return b;
}

TEST_P(SeamTest, OpCallsPerStepDoNotGrowWithSequences) {
  // The counting backend keeps one map, which the ranks' threads would share.
  if (GetParam().tensor_parallel > 1) GTEST_SKIP() << "counted on one rank";
  std::map<std::string, int> counts;
  auto e = load(5, &counts);
  // Prefill steps of 1 and of 5 sequences (17 tokens each), then decode steps of 1 and 5 rows.
  std::map<std::string, int> per_step[4];
  const int n_seqs[4] = {1, 5, 1, 5}, prompts[4] = {17, 17, 1, 1};
  for (int k = 0; k < 4; ++k) {
    for (int s = 0; s < 5; ++s) e->states().reset(s);
    if (prompts[k] == 1) e->step(prefill_batch(*e, 5, 3, 40));  // decode after a short prompt
    counts.clear();
    e->step(prefill_batch(*e, n_seqs[k], prompts[k], 50 + k));
    per_step[k] = counts;
  }
  EXPECT_EQ(per_step[0], per_step[1]);
  EXPECT_EQ(per_step[2], per_step[3]);
  // One attention / DeltaNet / MoE call per layer of its kind.
  const auto& c = e->config();
  EXPECT_EQ(per_step[1]["attention"], c.n_attention_layers());
  EXPECT_EQ(per_step[1]["deltanet"], c.n_layer - c.n_attention_layers());
  EXPECT_EQ(per_step[1]["moe"], c.is_moe() ? c.n_layer : 0);
  EXPECT_EQ(per_step[1]["begin_step"], 1);
}

TEST_P(SeamTest, SnapshotOfOneSlotLeavesOthersBitIdentical) {
  auto plain = load(3);
  auto snapped = load(3);
  for (Engine* e : {plain.get(), snapped.get()}) e->step(prefill_batch(*e, 3, 20, 60));
  // snapped: snapshot slot 1, run it on, restore it; slots 0 and 2 must not notice.
  auto snap = snapped->states().snapshot(1);
  Batch only1;
  only1.add(1, 5, 20, true);
  snapped->step(only1);
  snapped->states().restore(1, snap);
  Batch rows;
  for (int s = 0; s < 3; ++s) rows.add(s, 7 + s, 20, true);
  const auto a = plain->step(rows);
  const auto b = snapped->step(rows);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST_P(SeamTest, SharedKvPagesAreCopiedOnWrite) {
  auto e = load(2);
  auto alone = load(1);
  // 70 tokens span two pages of 64; slot 1 shares them and writes past them.
  e->step(prefill_batch(*e, 1, 70, 70));
  alone->step(prefill_batch(*alone, 1, 70, 70));
  const int64_t pages = e->states().pages_in_use(state::Track::kTrunk);
  auto snap = e->states().snapshot(0);
  e->states().share_kv(0, 1, 70);
  e->states().restore(1, snap);  // slot 1 = slot 0 (recurrent state from the snapshot)
  EXPECT_EQ(e->states().pages_in_use(state::Track::kTrunk), pages);  // shared, not copied
  Batch b1;
  b1.add(1, 9, 70, true);
  const auto from_shared = e->step(b1);
  EXPECT_EQ(e->states().pages_in_use(state::Track::kTrunk), pages + 1);  // last page copied
  // Slot 0 still reads its own keys: its next token gives what an unshared engine gives.
  Batch b0;
  b0.add(0, 9, 70, true);
  const auto from_owner = e->step(b0);
  const auto expected = alone->step(b0);
  EXPECT_EQ(0, std::memcmp(from_owner.data(), expected.data(), expected.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(from_shared.data(), expected.data(), expected.size() * sizeof(float)));
}

TEST_P(SeamTest, BackendSamplingEqualsTheSampler) {
  auto e = load(1);
  const auto ids = random_tokens(12, e->config().n_vocab, 80);
  Batch b;
  for (int i = 0; i < 12; ++i) b.add(0, ids[i], i, i == 11);
  auto logits = load(1)->step(b);
  sample::SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  p.logit_bias = {{ids[3], 2.0f}};
  p.seed = 1234;
  sample::Sampler on_backend(p), on_host(p);
  const std::vector<int32_t> history(ids.begin(), ids.begin() + 6);
  const ops::SamplingRow row = on_backend.next_row(history);
  std::vector<ops::SampledToken> out;
  e->step_sample(b, {&row, 1}, 5, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, on_host.sample(logits, history));
  // Log-probabilities are the raw model's: log-softmax of the logits.
  double mx = -INFINITY, z = 0;
  for (float l : logits) mx = std::max<double>(mx, l);
  for (float l : logits) z += std::exp(l - mx);
  EXPECT_NEAR(out[0].logprob, logits[out[0].id] - mx - std::log(z), 1e-4);
  ASSERT_EQ(out[0].n_top, 5);
  for (int i = 1; i < 5; ++i) EXPECT_GE(out[0].top_logprobs[i - 1], out[0].top_logprobs[i]);
  const int32_t best =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(out[0].top_ids[0], best);
}

// A row that does not want log-probabilities picks the same token as one that does: greedy on
// the raw logits (the argmax), greedy after a bias, and a seeded draw after penalties.
TEST_P(SeamTest, RowsWithoutLogprobsPickTheSameTokens) {
  auto e = load(1);
  const int V = e->config().n_vocab;
  const auto ids = random_tokens(12, V, 81);
  Batch b;
  for (int i = 0; i < 12; ++i) b.add(0, ids[i], i, i == 11);
  const auto logits = load(1)->step(b);
  const int32_t best =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const std::vector<std::pair<int32_t, float>> bias = {{(best + 1) % V, 50.0f}};
  const std::vector<int32_t> history(ids.begin(), ids.begin() + 6);
  ops::SamplingRow rows[3];
  rows[0].temperature = 0.0f;
  rows[1].temperature = 0.0f;
  rows[1].logit_bias = bias;
  rows[2].temperature = 0.9f;
  rows[2].top_k = 30;
  rows[2].repetition_penalty = 1.2f;
  rows[2].history = history;
  rows[2].u = 0.37;
  for (int r = 0; r < 3; ++r) {
    int32_t picked[2];
    for (int want : {0, 1}) {
      ops::SamplingRow row = rows[r];
      row.logprobs = want == 1;
      std::vector<ops::SampledToken> out;
      e->states().reset(0);
      e->step_sample(b, {&row, 1}, want ? 3 : 0, out);
      ASSERT_EQ(out.size(), 1u);
      picked[want] = out[0].id;
    }
    EXPECT_EQ(picked[0], picked[1]) << "row " << r;
    const int32_t want = r == 0 ? best : r == 1 ? (best + 1) % V : picked[1];
    EXPECT_EQ(picked[0], want) << "row " << r;
  }
}

TEST_P(SeamTest, NoAllocationInADecodeStepAfterWarmUp) {
  if (std::string(GetParam().backend) == "ref") GTEST_SKIP() << "the oracle allocates freely";
#ifdef QWENRT_ASAN
  GTEST_SKIP() << "operator new is AddressSanitizer's here; the plain build counts";
#endif
  auto e = load(2);
  e->step(prefill_batch(*e, 2, 9, 90));
  sample::SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 20;
  p.top_p = 0.8f;
  p.seed = 5;
  sample::Sampler sampler(p);
  std::vector<int32_t> history = {1, 2, 3};
  history.reserve(64);
  Batch b;
  b.tokens.reserve(2);
  b.positions.reserve(2);
  b.slots.reserve(2);
  b.want_logits.reserve(2);
  std::vector<ops::SampledToken> out;
  out.reserve(2);
  ops::SamplingRow rows[2];
  int64_t allocs_after_warmup = -1;
  for (int step = 0; step < 6; ++step) {
    b.clear();
    for (int s = 0; s < 2; ++s) b.add(s, 3 + step, 9 + step, true);
    rows[0] = sampler.next_row(history);
    rows[1] = sampler.next_row(history);
    if (step == 3) {
      g_allocs = 0;
      g_count_allocs = true;
    }
    e->step_sample(b, rows, 0, out);
    if (step == 3) {
      g_count_allocs = false;
      allocs_after_warmup = g_allocs.load();
    }
    ASSERT_EQ(out.size(), 2u);
  }
  EXPECT_EQ(allocs_after_warmup, 0);
}

// Each layer's temporaries go back to the workspace when the layer is done: a step's peak
// workspace is the same for a model of 4 layers and one of 8 (without the release it doubles).
TEST_P(SeamTest, WorkspacePeakDoesNotGrowWithLayers) {
  // The counting backend keeps one map, which the ranks' threads would share.
  if (GetParam().tensor_parallel > 1) GTEST_SKIP() << "counted on one rank";
  int64_t peak[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int layers = i == 0 ? 4 : 8;
    const bool dense = GetParam().arch == model::Arch::kQwen35;
    const std::string file =
        testing_support::write_tiny(GetParam().arch,
                                    fmt::format("seam_layers{}_{}_{}.gguf", layers,
                                                dense ? "dense" : "moe", GetParam().backend),
                                    [&](model::SynthSpec& s) {
                                      s.config.n_layer = layers;
                                      if (std::string(GetParam().backend) == "cuda")
                                        s.config.head_dim = 64;
                                    });
    std::map<std::string, int> counts;
    EngineOptions o;
    o.n_ctx = 256;
    const std::string backend = GetParam().backend;
    int64_t* p = &peak[i];
    o.make_backend = [&counts, backend, p] {
      return std::make_unique<CountingOps>(backend == "ref"    ? ops::make_ref_ops()
                                           : backend == "cuda" ? ops::make_cuda_ops()
                                                               : ops::make_cpu_ops(2),
                                           &counts, p);
    };
    auto e = Engine::load(file, o);
    e->step(prefill_batch(*e, 1, 20, 70));
  }
  EXPECT_GT(peak[0], 0);
  EXPECT_EQ(peak[0], peak[1]);
}

INSTANTIATE_TEST_SUITE_P(Backends, SeamTest,
                         ::testing::Values(SeamCase{model::Arch::kQwen35, "ref"},
                                           SeamCase{model::Arch::kQwen35Moe, "ref"},
                                           SeamCase{model::Arch::kQwen35, "cpu"},
                                           SeamCase{model::Arch::kQwen35Moe, "cpu"},
                                           SeamCase{model::Arch::kQwen35, "cuda"},
                                           SeamCase{model::Arch::kQwen35Moe, "cuda"},
                                           SeamCase{model::Arch::kQwen35, "cpu", 2},
                                           SeamCase{model::Arch::kQwen35Moe, "cpu", 2}),
                         case_name);

}  // namespace
}  // namespace qwenrt
