// The sequence scheduler (continuous batching) on real tiny models: a sequence gives the same
// tokens alone or in any batch, one engine step per iteration carries every running sequence,
// cancel / queue / shutdown, validation, log-probabilities against the engine's logits, forced
// text after thinking, the thinking budget, concurrent submitters, run() idle, and prepare_turn.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chat/parse.h"
#include "chat/prompt.h"
#include "chat/render.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "ops/cpu/isa.h"
#include "support/isa_cap.h"
#include "tokenizer/utf8.h"

namespace qwenrt::gen {
namespace {

const std::string kModel =
    std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/qwen35-dense.Q8_0.gguf";
const std::string kChatModel =
    std::string(QWENRT_SOURCE_DIR) + "/models/qwen35-chat-tiny.Q8_0.gguf";

// Forwards every entry to a backend; records each step's layout and can fail on demand.
class WatchedOps final : public ops::Ops {
 public:
  struct StepRecord {
    int64_t n = 0;
    std::vector<ops::Span> spans;
    int64_t n_output_rows = 0;
  };
  struct Log {
    std::vector<StepRecord> steps;
    int samples = 0;
    std::vector<double> draws;  // every sampled row's uniform draw, in order
    bool fail_next_step = false;
  };
  WatchedOps(std::unique_ptr<ops::Ops> inner, Log* log) : inner_(std::move(inner)), log_(log) {}
  const char* name() const override { return inner_->name(); }
  float* alloc(int64_t n) override { return inner_->alloc(n); }
  void reset_workspace() override { inner_->reset_workspace(); }
  int64_t workspace_mark() override { return inner_->workspace_mark(); }
  void workspace_release(int64_t mark) override { inner_->workspace_release(mark); }
  void* alloc_buffer(int64_t b) override { return inner_->alloc_buffer(b); }
  void free_buffer(void* b) override { inner_->free_buffer(b); }
  void copy(void* d, const void* s, int64_t b) override { inner_->copy(d, s, b); }
  void fill_zero(void* d, int64_t b) override { inner_->fill_zero(d, b); }
  void upload(const float* h, float* d, int64_t n) override { inner_->upload(h, d, n); }
  void download(const float* s, float* h, int64_t n) override { inner_->download(s, h, n); }
  Weight place(const Weight& w) override { return inner_->place(w); }
  void begin_step(const ops::StepLayout& l) override {
    if (log_->fail_next_step) {
      log_->fail_next_step = false;
      throw Error("injected backend failure");
    }
    log_->steps.push_back(
        {.n = l.n, .spans = {l.spans, l.spans + l.n_spans}, .n_output_rows = l.n_output_rows});
    inner_->begin_step(l);
  }
  void embed(const Weight& t, float* o) override { inner_->embed(t, o); }
  void matmul(const Weight& w, const float* x, float* y, int64_t n) override {
    inner_->matmul(w, x, y, n);
  }
  void rmsnorm(const float* x, const Weight& w, float* o, int64_t r, int64_t d, float e) override {
    inner_->rmsnorm(x, w, o, r, d, e);
  }
  void rope_neox(float* x, int h, int hd, int64_t s, int r, float t) override {
    inner_->rope_neox(x, h, hd, s, r, t);
  }
  void silu_mul(const float* g, const float* u, float* o, int64_t n) override {
    inner_->silu_mul(g, u, o, n);
  }
  void sigmoid_mul(const float* x, const float* g, int64_t gs, float* o, int64_t r,
                   int64_t c) override {
    inner_->sigmoid_mul(x, g, gs, o, r, c);
  }
  void add(const float* a, const float* b, float* o, int64_t n) override {
    inner_->add(a, b, o, n);
  }
  void add_rmsnorm(float* x, const float* d, const Weight& w, float* o, int64_t r, int64_t c,
                   float e) override {
    inner_->add_rmsnorm(x, d, w, o, r, c, e);
  }
  void matmuls(const float* x, int64_t n, std::span<const Projection> p) override {
    inner_->matmuls(x, n, p);
  }
  void ffn_swiglu(const Weight& g, const Weight& u, const Weight& d, const float* x, float* o,
                  int64_t n) override {
    inner_->ffn_swiglu(g, u, d, x, o, n);
  }
  bool copies_weights() const override { return inner_->copies_weights(); }
  void set_place_progress(std::function<void(uint64_t, uint64_t)> p, uint64_t total) override {
    inner_->set_place_progress(std::move(p), total);
  }
  void copy_2d(const float* s, int64_t ss, float* d, int64_t ds, int64_t r, int64_t c) override {
    inner_->copy_2d(s, ss, d, ds, r, c);
  }
  void gather_output_rows(const float* x, int64_t d, float* o) override {
    inner_->gather_output_rows(x, d, o);
  }
  void attention(const ops::AttentionArgs& a) override { inner_->attention(a); }
  void deltanet(const ops::DeltaNetArgs& a) override { inner_->deltanet(a); }
  void moe(const ops::MoeWeights& w, const float* x, float* o, int64_t n, int ne, int k) override {
    inner_->moe(w, x, o, n, ne, k);
  }
  void sample(const float* l, int64_t v, const ops::SamplingRow* r, int t,
              ops::SampledToken* o) override {
    ++log_->samples;
    for (int64_t i = 0; i < log_->steps.back().n_output_rows; ++i) log_->draws.push_back(r[i].u);
    inner_->sample(l, v, r, t, o);
  }

 private:
  std::unique_ptr<ops::Ops> inner_;
  Log* log_;
};

// Everything a sink received for one sequence.
struct Outcome {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::vector<chat::ReplyEvent> events;
  int updates = 0, dones = 0;
  bool update_after_done = false;
  bool split_character = false;  // some update's text was not whole UTF-8 characters
  SequenceUpdate last;           // the done update
};

// How close (in nats) the alone run's two best tokens may be where a batch on the cpu matmul's
// GEMM (n >= 4 rows at AVX-512) picks the other one; the logits move by up to ~0.15 once an int8
// activation rounds the other way (measured on the dense fixture).
constexpr float kNearTie = 0.5f;

Sink collect(Outcome& o) {
  return [&o](SequenceUpdate&& u) {
    if (o.dones > 0) o.update_after_done = true;
    ++o.updates;
    if (tokenizer::utf8_lossy(u.text) != u.text) o.split_character = true;
    o.text += u.text;
    o.tokens.insert(o.tokens.end(), u.tokens.begin(), u.tokens.end());
    o.logprobs.insert(o.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    o.events.insert(o.events.end(), u.events.begin(), u.events.end());
    if (u.done) {
      ++o.dones;
      o.last = std::move(u);
    }
  };
}

void run_until_idle(Scheduler& s) {
  while (s.step()) {
  }
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { use_model(kModel); }
  // The model load() loads and whose tokenizer the prompts use.
  void use_model(const std::string& path) {
    model_ = path;
    engine_ = load({});
    tokenizer_ =
        std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(engine_->file()));
    im_end_ = *tokenizer_->token_id("<|im_end|>");
    eot_ = *tokenizer_->token_id("<|endoftext|>");
    think_end_ = *tokenizer_->token_id("</think>");
  }
  std::unique_ptr<engine::Engine> load(engine::EngineOptions eo, int n_slots = 1,
                                       int64_t n_ctx = 512) const {
    if (!eo.make_backend && eo.backend == "auto") eo.backend = "cpu";
    eo.n_slots = n_slots;
    eo.n_ctx = n_ctx;
    return engine::Engine::load(model_, eo);
  }
  std::vector<int32_t> prompt(int i) const {
    static const char* kTopics[] = {"the sea",  "numbers", "a red fox", "rain",
                                    "old maps", "bread",   "winter",    "trains"};
    std::string text = "<|im_start|>user\nTell me about " + std::string(kTopics[i % 8]);
    for (int k = 0; k < i % 5; ++k) text += " and more";
    text += " (" + std::to_string(i) + ")<|im_end|>\n<|im_start|>assistant\n";
    return tokenizer_->encode(text, true);
  }
  // Greedy, with the stop tokens pushed away so every sequence runs its max_tokens.
  SequenceParams greedy(std::vector<int32_t> p, int max_tokens) const {
    SequenceParams sp;
    sp.prompt = std::move(p);
    sp.max_tokens = max_tokens;
    sp.sampling.temperature = 0;
    sp.sampling.logit_bias = {{im_end_, -100.0f}, {eot_, -100.0f}};
    return sp;
  }
  // Log-softmax of one logits row.
  static std::vector<double> log_softmax(const float* row, int n) {
    double mx = *std::max_element(row, row + n), sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp(double(row[i]) - mx);
    std::vector<double> out(n);
    for (int i = 0; i < n; ++i) out[i] = double(row[i]) - mx - std::log(sum);
    return out;
  }

  std::string model_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  int32_t im_end_ = -1, eot_ = -1, think_end_ = -1;
};

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

// --- cancel, queue, shutdown -------------------------------------------------------------------

TEST_F(SchedulerTest, CancelFreesTheSlot) {
  auto e = load({}, 2);
  Scheduler s(*e, *tokenizer_);
  Outcome a, b, c;
  const uint64_t ia = s.submit(greedy(prompt(0), 200), collect(a));
  const uint64_t ib = s.submit(greedy(prompt(1), 200), collect(b));
  const uint64_t ic = s.submit(greedy(prompt(2), 200), collect(c));  // queued: two slots
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.step());
  EXPECT_EQ(s.stats().running, 2);
  EXPECT_EQ(s.stats().queued, 1);
  EXPECT_GT(s.stats().kv_pages_in_use, 0);
  s.cancel(ic);  // still queued
  ASSERT_TRUE(s.step());
  EXPECT_EQ(c.dones, 1);
  EXPECT_EQ(c.last.finish, FinishReason::kCancelled);
  EXPECT_EQ(c.last.n_generated, 0);
  EXPECT_TRUE(c.tokens.empty());
  s.cancel(ia);
  const size_t b_before = b.tokens.size();
  ASSERT_TRUE(s.step());
  EXPECT_EQ(a.dones, 1);
  EXPECT_EQ(a.last.finish, FinishReason::kCancelled);
  EXPECT_EQ(a.last.n_generated, int64_t(a.tokens.size()));
  EXPECT_EQ(b.tokens.size(), b_before + 1) << "the other sequence goes on";
  EXPECT_EQ(s.stats().running, 1);
  s.cancel(ib);
  s.cancel(ia);     // already finished: ignored
  s.cancel(12345);  // unknown: ignored
  ASSERT_TRUE(s.step());
  EXPECT_EQ(b.dones, 1);
  EXPECT_EQ(b.last.finish, FinishReason::kCancelled);
  const auto st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.kv_pages_in_use, 0);
  EXPECT_EQ(st.cancelled, 3u);
  EXPECT_EQ(st.finished, 3u);
  EXPECT_FALSE(s.step());
  for (const Outcome* o : {&a, &b, &c}) EXPECT_FALSE(o->update_after_done);
}

TEST_F(SchedulerTest, QueueFullAndShuttingDown) {
  // One slot, max_queue 2: while the slot is free, three may wait (the one about to take it and
  // two more); once it is taken, two.
  Scheduler s(*engine_, *tokenizer_, {.max_queue = 2});
  Outcome o[3];
  s.submit(greedy(prompt(0), 2), collect(o[0]));
  s.submit(greedy(prompt(1), 2), collect(o[1]));
  EXPECT_EQ(s.stats().queued, 2);
  ASSERT_TRUE(s.step());  // one admitted (the slot is taken): room for one more in the queue
  EXPECT_EQ(s.stats().queued, 1);
  s.submit(greedy(prompt(2), 2), collect(o[2]));
  EXPECT_THROW(s.submit(greedy(prompt(3), 2), nullptr), QueueFull);
  s.shutdown(true);
  EXPECT_THROW(s.submit(greedy(prompt(3), 2), nullptr), ShuttingDown);
  s.run();  // drains, then returns
  for (const auto& x : o) {
    EXPECT_EQ(x.dones, 1);
    EXPECT_EQ(x.last.finish, FinishReason::kLength);
    EXPECT_EQ(x.tokens.size(), 2u);
    EXPECT_EQ(x.last.n_generated, 2);
    EXPECT_EQ(x.last.n_prompt, int64_t(prompt(int(&x - o)).size()));
    EXPECT_GT(x.last.prompt_seconds, 0.0);
    EXPECT_GT(x.last.generate_seconds, 0.0);
  }
  // One slot: the second waited in the queue for the whole of the first.
  EXPECT_GE(o[1].last.queue_seconds, o[0].last.prompt_seconds + o[0].last.generate_seconds);
  EXPECT_GE(o[2].last.queue_seconds, o[1].last.prompt_seconds + o[1].last.generate_seconds);
  EXPECT_EQ(s.stats().submitted, 3u);
}

// A burst at an idle scheduler: max_queue counts the sequences waiting beyond the free slots, so
// slots + max_queue are taken before the first step admits any (none refused while a slot is
// free), and the next one is refused.
TEST_F(SchedulerTest, ABurstFillsTheFreeSlotsAndTheQueue) {
  auto e = load({}, 4);
  Scheduler s(*e, *tokenizer_, {.max_queue = 3});
  std::vector<Outcome> o(7);
  for (int i = 0; i < 7; ++i) s.submit(greedy(prompt(i % 4), 2), collect(o[i]));
  EXPECT_THROW(s.submit(greedy(prompt(0), 2), nullptr), QueueFull);
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.stats().running, 4);
  EXPECT_EQ(s.stats().queued, 3);
  EXPECT_THROW(s.submit(greedy(prompt(0), 2), nullptr), QueueFull);
  while (s.step()) {
  }
  for (const auto& x : o) EXPECT_EQ(x.dones, 1);
  EXPECT_EQ(s.stats().finished, 7u);
}

TEST_F(SchedulerTest, ShutdownDrainFinishesEverything) {
  auto e = load({}, 2);
  Scheduler s(*e, *tokenizer_);
  std::vector<Outcome> o(5);
  for (int i = 0; i < 5; ++i) s.submit(greedy(prompt(i), 5), collect(o[i]));
  std::thread runner([&] { s.run(); });
  s.shutdown(true);
  runner.join();
  for (const auto& x : o) {
    EXPECT_EQ(x.dones, 1);
    EXPECT_EQ(x.last.finish, FinishReason::kLength);
    EXPECT_EQ(x.tokens.size(), 5u);
  }
  EXPECT_EQ(s.stats().finished, 5u);
  EXPECT_EQ(s.stats().cancelled, 0u);
  EXPECT_EQ(s.stats().kv_pages_in_use, 0);
}

TEST_F(SchedulerTest, ShutdownWithoutDrainCancels) {
  auto e = load({}, 2);
  Scheduler s(*e, *tokenizer_);
  std::vector<Outcome> o(5);
  std::mutex m;
  std::condition_variable cv;
  bool started = false;
  for (int i = 0; i < 5; ++i) {
    s.submit(greedy(prompt(i), 400), [&, inner = collect(o[i])](SequenceUpdate&& u) mutable {
      inner(std::move(u));
      std::lock_guard lock(m);
      started = true;
      cv.notify_all();
    });
  }
  std::thread runner([&] { s.run(); });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return started; });
  }
  s.shutdown(false);
  runner.join();
  for (const auto& x : o) {
    EXPECT_EQ(x.dones, 1);
    EXPECT_EQ(x.last.finish, FinishReason::kCancelled);
    EXPECT_LT(x.tokens.size(), 400u);
  }
  const auto st = s.stats();
  EXPECT_EQ(st.cancelled, 5u);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.kv_pages_in_use, 0);
}

TEST_F(SchedulerTest, RunSleepsWhileIdleAndWakesForASubmit) {
  Scheduler s(*engine_, *tokenizer_);
  std::thread runner([&] { s.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  clockid_t clock;
  ASSERT_EQ(pthread_getcpuclockid(runner.native_handle(), &clock), 0);
  timespec used{};
  ASSERT_EQ(clock_gettime(clock, &used), 0);
  EXPECT_LT(used.tv_sec + used.tv_nsec * 1e-9, 0.05) << "run() spun while idle";
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Outcome o;
  s.submit(greedy(prompt(0), 3), [&, inner = collect(o)](SequenceUpdate&& u) mutable {
    std::lock_guard lock(m);
    done |= u.done;
    inner(std::move(u));
    cv.notify_all();
  });
  {
    std::unique_lock lock(m);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  }
  s.shutdown(true);
  runner.join();
  EXPECT_EQ(o.dones, 1);
  EXPECT_EQ(o.tokens.size(), 3u);
}

TEST_F(SchedulerTest, AFailedStepEndsItsSequencesAndTheSchedulerGoesOn) {
  WatchedOps::Log log;
  auto e = load(
      {.make_backend = [&] { return std::make_unique<WatchedOps>(ops::make_cpu_ops(0), &log); }},
      2);
  Scheduler s(*e, *tokenizer_);
  Outcome a, b, c;
  s.submit(greedy(prompt(0), 50), collect(a));
  s.submit(greedy(prompt(1), 50), collect(b));
  ASSERT_TRUE(s.step());
  log.fail_next_step = true;
  ASSERT_TRUE(s.step());
  for (const Outcome* o : {&a, &b}) {
    EXPECT_EQ(o->dones, 1);
    EXPECT_EQ(o->last.finish, FinishReason::kError);
    EXPECT_NE(o->last.error.find("injected backend failure"), std::string::npos) << o->last.error;
  }
  EXPECT_EQ(s.stats().running, 0);
  EXPECT_EQ(s.stats().kv_pages_in_use, 0);
  s.submit(greedy(prompt(2), 3), collect(c));
  run_until_idle(s);
  EXPECT_EQ(c.last.finish, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 3u);
}

// --- validation --------------------------------------------------------------------------------

TEST_F(SchedulerTest, InvalidRequestsAreErrorsNamingTheProblem) {
  auto small = load({}, 1, 16);
  Scheduler s(*small, *tokenizer_);
  auto expect_error = [&](SequenceParams p, const std::string& needle) {
    try {
      s.submit(std::move(p), nullptr);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const QueueFull&) {
      ADD_FAILURE() << "QueueFull instead of a validation error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(greedy({}, 4), "empty");
  expect_error(greedy(std::vector<int32_t>(16, 5), 4), "16 tokens");
  auto p = greedy({5, 6, 7}, 4);
  p.stop = {"ok", ""};
  expect_error(p, "stop string 1 is empty");
  p = greedy({5, 6, 7}, 4);
  p.top_logprobs = 21;
  expect_error(p, "top_logprobs");
  p.top_logprobs = -2;
  expect_error(p, "top_logprobs");
  expect_error(greedy({5, -1}, 4), "outside the vocabulary");
  expect_error(greedy({5, 6}, 0), "max_tokens");
  EXPECT_EQ(s.stats().submitted, 0u);
  // The boundary: 15 prompt tokens fit a 16-token context, leaving one generated token.
  Outcome o;
  s.submit(greedy(std::vector<int32_t>(15, 5), 10), collect(o));
  run_until_idle(s);
  EXPECT_EQ(o.last.finish, FinishReason::kLength);
  EXPECT_EQ(o.last.n_generated, 1);
}

TEST_F(SchedulerTest, TheContextFillingUpFinishesAsLength) {
  auto e = load({}, 2, 40);
  Scheduler s(*e, *tokenizer_);
  Outcome o;
  const auto p = prompt(0);
  ASSERT_LT(p.size(), 40u);
  s.submit(greedy(p, 1000), collect(o));
  run_until_idle(s);
  EXPECT_EQ(o.last.finish, FinishReason::kLength);
  EXPECT_EQ(o.last.n_prompt + o.last.n_generated, 40) << "prompt + generated fill the context";
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

// --- threads -----------------------------------------------------------------------------------

TEST_F(SchedulerTest, ConcurrentSubmittersWhileRunning) {
  const MatmulIsaCap cap(ops::cpu::Isa::kAvx2);  // bit-equal batches (see MatmulIsaCap)
  auto e = load({}, 4);
  const int kThreads = 4, kEach = 6;
  // What each gives alone (one at a time), to compare with the concurrent run.
  std::vector<Outcome> alone(kThreads * kEach);
  {
    Scheduler s(*e, *tokenizer_);
    for (int i = 0; i < kThreads * kEach; ++i) {
      s.submit(greedy(prompt(i), 4 + i % 3), collect(alone[i]));
      run_until_idle(s);
    }
  }
  Scheduler s(*e, *tokenizer_, {.max_queue = kThreads * kEach});
  std::thread runner([&] { s.run(); });
  std::vector<Outcome> out(kThreads * kEach);
  std::mutex m;  // guards `out` (the sinks run on the scheduler's thread, the test reads here)
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int k = 0; k < kEach; ++k) {
        const int i = t * kEach + k;
        // The last thread cancels every other sequence of its own as soon as it is in.
        const bool cancel = t == kThreads - 1 && k % 2 == 1;
        const uint64_t id = s.submit(greedy(prompt(i), cancel ? 300 : 4 + i % 3),
                                     [&, inner = collect(out[i])](SequenceUpdate&& u) mutable {
                                       std::lock_guard lock(m);
                                       const bool last = u.done;
                                       inner(std::move(u));
                                       if (last) ++done;
                                       cv.notify_all();
                                     });
        if (cancel) s.cancel(id);
        std::this_thread::sleep_for(std::chrono::milliseconds(k % 2));
      }
    });
  }
  for (auto& th : submitters) th.join();
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(120), [&] { return done == kThreads * kEach; }));
  }
  s.shutdown(true);
  runner.join();
  int cancelled = 0;
  for (int i = 0; i < kThreads * kEach; ++i) {
    EXPECT_EQ(out[i].dones, 1) << i;
    EXPECT_FALSE(out[i].update_after_done) << i;
    if (i / kEach == kThreads - 1 && i % 2 == 1) {
      EXPECT_EQ(out[i].last.finish, FinishReason::kCancelled) << i;
      EXPECT_LT(out[i].tokens.size(), 300u);
      ++cancelled;
      continue;
    }
    EXPECT_EQ(out[i].last.finish, FinishReason::kLength) << i;
    EXPECT_EQ(out[i].tokens, alone[i].tokens) << i;
    EXPECT_EQ(out[i].text, alone[i].text) << i;
  }
  const auto st = s.stats();
  EXPECT_EQ(st.submitted, uint64_t(kThreads * kEach));
  EXPECT_EQ(st.finished, uint64_t(kThreads * kEach));
  EXPECT_EQ(st.cancelled, uint64_t(cancelled));
  EXPECT_EQ(st.kv_pages_in_use, 0);
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
