// The generation loop on a real (tiny, converted) model: greedy equals argmax of the engine's own
// logits, stop strings and tokens, streaming, thinking budget, bad input.
#include <gtest/gtest.h>

#include <algorithm>

#include "gen/generator.h"
#include "tokenizer/utf8.h"

namespace qwenrt::gen {
namespace {

const std::string kModel =
    std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/qwen35-dense.Q8_0.gguf";

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = engine::Engine::load(kModel);
    tokenizer_ =
        std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(engine_->file()));
    prompt_ = tokenizer_->encode(
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n", true);
  }
  GenerationOptions greedy(int n) {
    GenerationOptions o;
    o.max_tokens = n;
    o.sampling.temperature = 0;
    return o;
  }
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::vector<int32_t> prompt_;
};

TEST_F(GeneratorTest, GreedyFollowsTheEngineArgmax) {
  Generator g(*engine_, *tokenizer_);
  auto o = greedy(12);
  o.sampling.logit_bias = {{*tokenizer_->token_id("<|im_end|>"), -100.0f},
                           {*tokenizer_->token_id("<|endoftext|>"), -100.0f}};
  const auto r = g.generate(prompt_, o);
  ASSERT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  // Independently: re-run the whole sequence in a fresh slot, one prefill, and take argmaxes.
  std::vector<int32_t> seq = prompt_;
  seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
  engine_->states().reset(0);
  engine::Batch b;
  for (size_t i = 0; i < seq.size(); ++i)
    b.add(0, seq[i], static_cast<int32_t>(i), i + 1 >= prompt_.size());
  const auto logits = engine_->step(b);
  const int V = engine_->config().n_vocab;
  for (size_t t = 0; t < r.tokens.size(); ++t) {
    std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    row[*tokenizer_->token_id("<|im_end|>")] -= 100.0f;
    row[*tokenizer_->token_id("<|endoftext|>")] -= 100.0f;
    EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), r.tokens[t]) << "token " << t;
  }
  EXPECT_EQ(r.text, tokenizer::utf8_lossy(tokenizer_->decode(r.tokens)));
}

TEST_F(GeneratorTest, StopStringCutsTheTextAndIsNotEmitted) {
  Generator g(*engine_, *tokenizer_);
  auto o = greedy(24);
  o.sampling.logit_bias = {{*tokenizer_->token_id("<|im_end|>"), -100.0f},
                           {*tokenizer_->token_id("<|endoftext|>"), -100.0f}};
  const auto full = g.generate(prompt_, o);
  ASSERT_GE(full.text.size(), 6u);
  // Stop on a piece from the middle of what greedy decoding produces.
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  o.stop = {stop};
  std::string streamed;
  const auto r = g.generate(prompt_, o, [&](const std::string& s) { streamed += s; });
  EXPECT_EQ(r.finish, FinishReason::kStopString);
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, r.text);
}

TEST_F(GeneratorTest, StopTokenEndsWithoutEmittingIt) {
  Generator g(*engine_, *tokenizer_);
  auto o = greedy(10);
  o.sampling.logit_bias = {{*tokenizer_->token_id("<|im_end|>"), 100.0f}};
  const auto r = g.generate(prompt_, o);
  EXPECT_EQ(r.finish, FinishReason::kStopToken);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(r.text, "");
}

TEST_F(GeneratorTest, ThinkingBudgetClosesTheThought) {
  Generator g(*engine_, *tokenizer_);
  auto o = greedy(20);
  o.starts_in_thinking = true;
  o.thinking_budget = 4;
  const int32_t think_end = *tokenizer_->token_id("</think>");
  o.sampling.logit_bias = {{think_end, -100.0f},
                           {*tokenizer_->token_id("<|im_end|>"), -100.0f},
                           {*tokenizer_->token_id("<|endoftext|>"), -100.0f}};
  const auto r = g.generate(prompt_, o);
  const auto close = tokenizer_->encode("\n</think>\n\n", true);
  ASSERT_GE(r.tokens.size(), 4 + close.size());
  EXPECT_TRUE(std::equal(close.begin(), close.end(), r.tokens.begin() + 4));
  EXPECT_NE(r.text.find("</think>"), std::string::npos);
}

TEST_F(GeneratorTest, StreamedPiecesAreWholeCharacters) {
  Generator g(*engine_, *tokenizer_);
  GenerationOptions o;
  o.max_tokens = 40;
  o.sampling.seed = 3;
  o.sampling.temperature = 1.5f;  // wander into rarer byte tokens
  std::string streamed;
  const auto r = g.generate(prompt_, o, [&](const std::string& s) {
    EXPECT_EQ(tokenizer::utf8_lossy(s), s) << "a streamed piece split a character";
    streamed += s;
  });
  EXPECT_EQ(streamed, r.text);
}

TEST_F(GeneratorTest, PromptLongerThanTheContextIsAnError) {
  engine::EngineOptions eo;
  eo.n_ctx = 16;
  auto small = engine::Engine::load(kModel, eo);
  Generator g(*small, *tokenizer_);
  std::vector<int32_t> long_prompt(20, prompt_[0]);
  try {
    g.generate(long_prompt, greedy(1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("20 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.generate({}, greedy(1)), Error);
}

}  // namespace
}  // namespace qwenrt::gen
