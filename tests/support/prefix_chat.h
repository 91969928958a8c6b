// Test support for the prefix cache tests (test_prefix_cache.cpp on the cpu backend,
// test_cuda_prefix_cache.cpp on the cuda backend): a scheduler run of one sequence, and a recorded
// agent-style conversation played on two schedulers at once, one with the cache off and one with
// it on.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "chat/render.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::testing_support {

struct TurnResult {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
  chat::ParsedReply reply;
  int64_t n_prompt = 0, n_cached = 0;
};

// Submits one sequence and steps the scheduler until it is idle.
inline TurnResult run_one(gen::Scheduler& s, gen::SequenceParams p) {
  TurnResult r;
  r.prompt = p.prompt;
  s.submit(std::move(p), [&](gen::SequenceUpdate&& u) {
    r.tokens.insert(r.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.done) {
      r.reply = u.reply;
      r.n_prompt = u.n_prompt;
      r.n_cached = u.n_cached;
    }
  });
  while (s.step()) {
  }
  return r;
}

inline chat::Json read_file_tool() {
  return chat::Json::parse(R"([{"type": "function", "function": {"name": "read_file",
      "description": "Read a file", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])");
}

struct ChatRuns {
  std::vector<TurnResult> off, on;  // per turn: the scheduler without and with the cache
};

// A recorded agent-style conversation of six turns: the user asks, the model answers (the reply of
// the cache-off run goes into the history as parsed, reasoning included), every other turn a
// scripted tool call and its result. Both schedulers get the same prompt every turn.
inline ChatRuns run_agent_chat(gen::Scheduler& off, gen::Scheduler& on,
                               const tokenizer::Tokenizer& tok, const chat::Dialect& dialect,
                               bool thinking) {
  ChatRuns runs;
  chat::Json messages = chat::Json::array(
      {{{"role", "system"}, {"content", "You are a careful assistant with file access."}}});
  for (int t = 0; t < 6; ++t) {
    messages.push_back({{"role", "user"},
                        {"content", "Question " + std::to_string(t) + ": what is in notes.txt?"}});
    gen::ChatTurn turn{.messages = messages, .tools = read_file_tool()};
    turn.render.enable_thinking = thinking;
    const gen::PreparedTurn pt = gen::prepare_turn(tok, dialect, turn);
    gen::SequenceParams p;
    p.prompt = pt.prompt;
    p.max_tokens = 12;
    p.sampling.temperature = 0;
    p.starts_in_thinking = pt.thinking;
    p.parse = pt.parse;
    runs.off.push_back(run_one(off, p));
    runs.on.push_back(run_one(on, p));
    const chat::ParsedReply& reply = runs.off.back().reply;
    chat::Json assistant = {{"role", "assistant"}, {"content", reply.content}};
    if (!reply.reasoning.empty()) assistant["reasoning_content"] = reply.reasoning;
    messages.push_back(assistant);
    if (t % 2 == 1) {  // a scripted tool round
      const std::string id = "call_" + std::to_string(t);
      messages.push_back(
          {{"role", "assistant"},
           {"content", ""},
           {"tool_calls", chat::Json::array({{{"type", "function"},
                                              {"id", id},
                                              {"function",
                                               {{"name", "read_file"},
                                                {"arguments", R"({"path": "notes.txt"})"}}}}})}});
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", id},
                          {"content", "line one\nline two of the notes " + std::to_string(t)}});
    }
  }
  return runs;
}

// With the cache, every turn after the first resumes from a cached prefix and prefills at most its
// new tokens plus one page; without it nothing is cached.
inline void expect_only_new_tokens_prefilled(const ChatRuns& runs, const std::string& name) {
  for (size_t t = 0; t < runs.off.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t));
    const TurnResult& on = runs.on[t];
    EXPECT_EQ(on.n_prompt, runs.off[t].n_prompt);
    EXPECT_EQ(runs.off[t].n_cached, 0);
    if (t == 0) continue;
    const int64_t new_tokens = on.n_prompt - runs.on[t - 1].n_prompt;
    const int64_t prefilled = on.n_prompt - on.n_cached;
    EXPECT_GT(on.n_cached, 0);
    EXPECT_LE(prefilled, new_tokens + 64) << "prompt " << on.n_prompt << ", cached " << on.n_cached;
    std::printf("[ note ] %s turn %zu: prompt %ld, new %ld, cached %ld, prefilled %ld\n",
                name.c_str(), t, long(on.n_prompt), long(new_tokens), long(on.n_cached),
                long(prefilled));
  }
}

}  // namespace qwenrt::testing_support
