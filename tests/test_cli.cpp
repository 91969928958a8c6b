// The qwenrt binary end to end: exit codes, one-line errors, and that the text subcommands print
// what the modules compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include <unistd.h>

#include "chat/render.h"
#include "gguf/reader.h"
#include "support/model_files.h"
#include "support/run_binary.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt {
namespace {

const std::string kModel =
    std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/qwen35-dense.Q8_0.gguf";

using testing_support::Output;

Output run(const std::string& args) {
  return testing_support::run_qwenrt(args);
}

TEST(Cli, TokenizePrintsTheTokenizerIds) {
  const auto file = gguf::File::open(kModel).value();
  const auto tok = tokenizer::Tokenizer::from_gguf(file);
  std::string want;
  for (int32_t id : tok.encode("Hello <|im_end|> world", false))
    want += (want.empty() ? "" : " ") + std::to_string(id);
  const Output o = run("tokenize -m " + kModel + " 'Hello <|im_end|> world'");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, want + "\n");
  const Output special = run("tokenize -m " + kModel + " --special '<|im_end|>'");
  EXPECT_EQ(special.out, std::to_string(*tok.token_id("<|im_end|>")) + "\n");
}

TEST(Cli, TemplatePrintsTheRenderExactly) {
  const std::string path = testing_support::temp_path("messages.json");
  std::ofstream(path)
      << R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";
  const Output o = run("template -m " + kModel + " --messages " + path + " --no-think");
  EXPECT_EQ(o.code, 0) << o.err;
  chat::RenderOptions ro;
  ro.enable_thinking = false;
  const auto messages = chat::Json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])");
  EXPECT_EQ(o.out, chat::render_chat(chat::Dialect::kQwen35, messages, nullptr, ro));
  EXPECT_NE(o.out.find("<think>\n\n</think>\n\n"), std::string::npos);
}

TEST(Cli, RunGeneratesAndReportsSpeed) {
  const Output o = run("run -m " + kModel + " -p 'What is 2 + 2?' -n 8 --temp 0 --no-think");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.err.find("tok/s"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("generated"), std::string::npos) << o.err;
}

// With --tools the trained default model answers a matching request with a parsed tool call.
TEST(Cli, RunWithToolsPrintsTheParsedCall) {
  const std::string tools = testing_support::temp_path("tools.json");
  std::ofstream(tools) << R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Get the current weather for a city.", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}])";
  const Output o = run("run --tools " + tools +
                       " -p \"What's the weather in Paris?\" --temp 0 -n 120 --no-think");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("[tool call] get_weather({\"city\":\"Paris\"})"), std::string::npos)
      << o.out;
  const std::string bad = testing_support::temp_path("bad_tools.json");
  std::ofstream(bad) << "{}";
  const Output b = run("run --tools " + bad + " -p hi");
  EXPECT_EQ(b.code, 1);
  EXPECT_NE(b.err.find("must hold a JSON array"), std::string::npos) << b.err;
}

// bench reports every figure it was asked for, each from as many timed repeats, with rates that
// agree with the recorded seconds.
TEST(Cli, BenchReportsEachFigureFromItsRepeats) {
  const Output o = run("bench -m " + kModel + " -p 8,16 -n 3 -b 2 -r 2 --check-rows 3 --json");
  ASSERT_EQ(o.code, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  std::vector<std::string> tests;
  for (const auto& r : j["results"]) {
    tests.push_back(r["test"]);
    const auto secs = r["seconds"].get<std::vector<double>>();
    ASSERT_EQ(secs.size(), 2u) << r.dump();
    const double slowest = *std::max_element(secs.begin(), secs.end());
    EXPECT_GT(slowest, 0.0);
    EXPECT_NEAR(r["tok_s_min"].get<double>(), r["tokens"].get<double>() / slowest, 1e-6);
    EXPECT_LE(r["tok_s_min"].get<double>(), r["tok_s_median"].get<double>());
    EXPECT_LE(r["tok_s_median"].get<double>(), r["tok_s_max"].get<double>());
  }
  EXPECT_EQ(tests, (std::vector<std::string>{"pp8", "pp16", "tg3", "tg3 check3", "tg3 x2"}));
  EXPECT_EQ(j["results"][3]["tokens"], 3);  // a check keeps one token a step
  EXPECT_EQ(j["results"][4]["tokens"], 6);
  EXPECT_GT(j["peak_rss_mib"].get<double>(), 0.0);
}

// --mtp-drafts times MTP drafts (one token a step) on a model with an MTP block, with the draft
// vocabulary in the figure's name; a model without one is a one-line error (below).
TEST(Cli, BenchTimesMtpDrafts) {
  const std::string tiny = std::string(QWENRT_SOURCE_DIR) + "/models/qwen35-chat-tiny.Q8_0.gguf";
  const Output o = run("bench -m " + tiny +
                       " -p 8 -n 3 -b 0 -r 2 --mtp-drafts --draft-vocab 512 --backend cpu --json");
  ASSERT_EQ(o.code, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  std::vector<std::string> tests;
  for (const auto& r : j["results"]) tests.push_back(r["test"]);
  EXPECT_EQ(tests, (std::vector<std::string>{"pp8", "tg3", "tg3 mtp-draft v512"}));
  EXPECT_EQ(j["results"][2]["tokens"], 3);
  EXPECT_GT(j["results"][2]["tok_s_median"].get<double>(), 0.0);
}

TEST(Cli, ErrorsAreOneLineWithExitCodeOne) {
  for (const std::string& args : std::vector<std::string>{
           "info /nonexistent.gguf", "run -m /nonexistent.gguf -p hi",
           "logits -m " + kModel + " --ids 1,x --out /dev/null",
           "logits -m " + kModel + " --ids 5000 --out /dev/null",
           "run -m " + kModel + " -p \"$(printf 'bad \\377 byte')\"",
           "run -m " + kModel + " -c 8 -p 'longer than eight tokens, surely'",
           "bench -m " + kModel + " -r 0", "bench -m " + kModel + " -b 1",
           "bench -m " + kModel + " -p 0", "bench -m " + kModel + " --check-rows 1",
           "bench -m " + kModel + " -p 8 -n 2 -b 0 -r 1 --mtp-drafts"}) {
    const Output o = run(args);
    EXPECT_EQ(o.code, 1) << args << "\n" << o.err;
    EXPECT_EQ(o.err.rfind("qwenrt: error: ", 0), 0u) << args << "\n" << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << args << "\n" << o.err;
  }
}

}  // namespace
}  // namespace qwenrt
