// `qwenrt perplexity` end to end: its PPL equals exp(mean NLL) computed here from Engine logits
// (second halves of fresh-state chunks, or every position), and its KL divergence is 0 for a
// model against itself and positive against another quantization of the same weights.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>

#include "engine/engine.h"
#include "gguf/reader.h"
#include "support/run_binary.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt {
namespace {

const std::string kFixtures = std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/";
const std::string kDense = kFixtures + "qwen35-dense.Q8_0.gguf";
const std::string kMoeQ8 = kFixtures + "qwen35moe.Q8_0.gguf";
const std::string kMoeQ4 = kFixtures + "qwen35moe.Q4_K_M.gguf";

using testing_support::Output;

Output run(const std::string& args) {
  return testing_support::run_qwenrt(args);
}

double number_after(const std::string& text, const std::string& label) {
  std::smatch m;
  const std::regex re(label + R"( = ([0-9.eE+-]+))");
  if (!std::regex_search(text, m, re)) {
    ADD_FAILURE() << "no '" << label << "' in: " << text;
    return NAN;
  }
  return std::stod(m[1]);
}

std::string text_file() {
  const std::string path = testing_support::temp_path("ppl_text.txt");
  std::ofstream out(path, std::ios::binary);
  // Plain text; the "<|im_end|>" must stay text (no specials parsing).
  for (int i = 0; i < 6; ++i) {
    out << "The answer to " << 17 + i << " plus " << 25 * i << " is " << 17 + 26 * i
        << ". We checked it twice, then wrote it down. <|im_end|> Next question!\n";
  }
  return path;
}

// exp(mean NLL) over positions [first, ctx - 1) of every whole chunk, each chunk from a fresh
// engine state: the definition, computed without the command's code. On the reference backend
// (as the command below), whose logits do not depend on how a chunk is split into steps.
double reference_ppl(const std::string& model, const std::string& text_path, int ctx,
                     bool all_positions) {
  engine::EngineOptions eo;
  eo.backend = "ref";
  auto engine = engine::Engine::load(model, eo);
  const auto tok = tokenizer::Tokenizer::from_gguf(engine->file());
  std::ifstream in(text_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const auto ids = tok.encode(text, false);
  const int V = engine->config().n_vocab;
  const int first = all_positions ? 0 : ctx / 2;
  double nll = 0;
  int count = 0;
  for (size_t c = 0; (c + 1) * ctx <= ids.size(); ++c) {
    engine->states().reset(0);
    engine::Batch b;
    for (int j = 0; j < ctx; ++j) b.add(0, ids[c * ctx + j], j, true);
    const auto logits = engine->step(b);
    for (int j = first; j < ctx - 1; ++j) {
      const float* row = logits.data() + size_t(j) * V;
      double z = 0;
      for (int i = 0; i < V; ++i) z += std::exp(double(row[i]));
      nll += std::log(z) - row[ids[c * ctx + j + 1]];
      ++count;
    }
  }
  EXPECT_GT(count, 0);
  return std::exp(nll / count);
}

TEST(Perplexity, EqualsExpMeanNllOfEngineLogits) {
  const std::string text = text_file();
  for (const bool all : {false, true}) {
    SCOPED_TRACE(all ? "all positions" : "second halves");
    const Output o = run("perplexity -m " + kDense + " -f " + text + " --ctx 32" +
                         (all ? " --score all" : "") + " --batch 13 --backend ref");
    ASSERT_EQ(o.code, 0) << o.err;
    const double ppl = number_after(o.out, "PPL");
    const double want = reference_ppl(kDense, text, 32, all);
    EXPECT_NEAR(ppl / want, 1.0, 1e-5) << o.out;
    EXPECT_GT(ppl, 1.0);
    EXPECT_NE(o.out.find("+/-"), std::string::npos);
  }
}

TEST(Perplexity, KlOfAModelAgainstItselfIsZero) {
  const std::string text = text_file();
  const std::string base = testing_support::temp_path("ppl_base.npy");
  const Output saved =
      run("perplexity -m " + kMoeQ8 + " -f " + text + " --ctx 32 --save-logits " + base);
  ASSERT_EQ(saved.code, 0) << saved.err;
  const Output self =
      run("perplexity -m " + kMoeQ8 + " -f " + text + " --ctx 32 --kl-base " + base);
  ASSERT_EQ(self.code, 0) << self.err;
  EXPECT_NEAR(number_after(self.out, "Mean KLD"), 0.0, 1e-9) << self.out;
  EXPECT_EQ(number_after(self.out, "Same top-1"), 100.0);
  EXPECT_EQ(number_after(self.out, "PPL"), number_after(saved.out, "PPL"));

  const Output other =
      run("perplexity -m " + kMoeQ4 + " -f " + text + " --ctx 32 --kl-base " + base);
  ASSERT_EQ(other.code, 0) << other.err;
  const double kld = number_after(other.out, "Mean KLD");
  EXPECT_GT(kld, 1e-5) << other.out;
  EXPECT_LT(kld, 10.0) << other.out;  // same weights, coarser quantization: near, not equal

  // A base of another chunking is refused before any work.
  const Output mismatch =
      run("perplexity -m " + kMoeQ4 + " -f " + text + " --ctx 16 --kl-base " + base);
  EXPECT_EQ(mismatch.code, 1);
  EXPECT_NE(mismatch.err.find("--kl-base"), std::string::npos) << mismatch.err;
}

TEST(Perplexity, TooShortTextIsAnError) {
  const std::string path = testing_support::temp_path("ppl_short.txt");
  std::ofstream(path) << "Too short.";
  const Output o = run("perplexity -m " + kDense + " -f " + path + " --ctx 512");
  EXPECT_EQ(o.code, 1);
  EXPECT_NE(o.err.find("fewer than one chunk"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find('\n'), o.err.size() - 1) << o.err;  // one line
}

}  // namespace
}  // namespace qwenrt
