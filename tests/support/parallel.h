// Test support for the tensor- and pipeline-parallel suites: what an engine load refuses, and the
// CLI giving one reply with and without a parallel setting.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"
#include "support/draft_runs.h"
#include "support/run_binary.h"

namespace qwenrt::testing_support {

// The message of the Error fn() throws ("(no error)" when it throws none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The error message of loading `path` with `o` ("(no error)" when it loads).
inline std::string load_error(const std::string& path, const engine::EngineOptions& o) {
  return error_of([&] { engine::Engine::load(path, o); });
}

// Greedy chat replies (cached_chat_rounds: prefix cache on, two rounds) from make(file, 1) and
// make(file, 2) (one and two ranks or stages), each plain and with MTP drafts: all four the same,
// on each file. `unit` names the setting in messages ("rank", "stage").
template <class Make>
void expect_same_replies_at_one_and_two(const std::vector<std::string>& files, Make make,
                                        const std::string& unit) {
  for (const std::string& file : files) {
    std::vector<std::vector<DraftOutcome>> runs;
    std::vector<std::string> names;
    for (int n : {1, 2}) {
      for (bool drafts : {false, true}) {
        auto e = make(file, n);
        runs.push_back(cached_chat_rounds(*e, drafts));
        names.push_back(std::to_string(n) + " " + unit + (n > 1 ? "s" : "") +
                        (drafts ? ", drafts" : ""));
      }
    }
    for (size_t r = 1; r < runs.size(); ++r)
      expect_same(true, runs[0], runs[r], file + ", " + names[r]);
  }
}

// `o` (some parallelism on) refuses streamed experts, naming --expert-cache, and a parallel
// setting of 0 (set_zero clears it) is an error.
template <class SetZero>
void expect_parallel_load_errors(const std::string& moe_path, engine::EngineOptions o,
                                 SetZero set_zero) {
  o.expert_cache_bytes = int64_t{1} << 30;
  const std::string streamed = load_error(moe_path, o);
  EXPECT_NE(streamed.find("--expert-cache"), std::string::npos) << streamed;
  o.expert_cache_bytes = -1;
  set_zero(o);
  EXPECT_NE(load_error(moe_path, o), "(no error)");
}

// `qwenrt run` on `model` gives the same greedy reply with `flag` as without; with `bad` it fails
// naming `why`.
inline void expect_cli_same_reply(const std::string& model, const std::string& flag,
                                  const std::string& bad, const std::string& why) {
  const std::string args = "run -m " + model +
                           " -p \"Tell me a short story about a cat.\" --no-think --temp 0 -n 40 "
                           "--backend cpu -t 2";
  const auto one = run_qwenrt(args);
  const auto two = run_qwenrt(args + " " + flag);
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_EQ(one.out, two.out);
  EXPECT_FALSE(one.out.empty());
  const auto refused = run_qwenrt(args + " " + bad);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find(why), std::string::npos) << refused.err;
}

}  // namespace qwenrt::testing_support
