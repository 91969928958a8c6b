// Test support for the scheduler tests (test_scheduler.cpp, test_scheduler_lifecycle.cpp): the
// dense fixture model, a backend wrapper that records each step's layout and can fail on demand,
// a sink that collects what one sequence received, and the SchedulerTest fixture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/parse.h"
#include "engine/engine.h"
#include "gen/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qwenrt::testing_support {

inline const std::string kModel =
    std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/qwen35-dense.Q8_0.gguf";

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
    std::vector<std::string> placed;  // the names of the weights placed, in order
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
  Weight place(const Weight& w) override {
    log_->placed.push_back(w.name);
    return inner_->place(w);
  }
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
  std::vector<gen::TokenLogprob> logprobs;
  std::vector<chat::ReplyEvent> events;
  int updates = 0, dones = 0;
  bool update_after_done = false;
  bool split_character = false;  // some update's text was not whole UTF-8 characters
  gen::SequenceUpdate last;      // the done update
};

inline gen::Sink collect(Outcome& o) {
  return [&o](gen::SequenceUpdate&& u) {
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

inline void run_until_idle(gen::Scheduler& s) {
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
  gen::SequenceParams greedy(std::vector<int32_t> p, int max_tokens) const {
    gen::SequenceParams sp;
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

}  // namespace qwenrt::testing_support
