// The OpenAI dialect: POST /v1/chat/completions and /v1/completions read into gen:: requests, and
// the scheduler's updates written back as OpenAI's JSON (whole, or as SSE chunks). No I/O here:
// server.cpp moves the bytes; tests drive these functions with updates they make.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gen/scheduler.h"
#include "gen/turn.h"
#include "serve/fields.h"
#include "serve/stream_events.h"

namespace qwenrt::serve::openai {

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

// Settings both endpoints share.
struct Generation {
  sample::SamplingRequest sampling;
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;
  int n = 1;  // sequences, one per choice
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int top_logprobs = -1;       // -1: no logprobs
};

struct ChatRequest {
  Generation gen;
  gen::ChatTurn turn;  // messages normalised, tools validated (null with tool_choice none)
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_name;  // kNamed
  bool parallel_tool_calls = true;
  std::optional<int> thinking_budget;
};

struct CompletionRequest {
  Generation gen;
  std::optional<std::string> prompt_text;  // tokenized with control tokens recognised
  std::vector<int32_t> prompt_ids;         // or given as ids
};

// 400 (ApiError naming the field) on anything malformed, of the wrong type or out of range.
ChatRequest parse_chat_request(const Json& body, const ModelInfo& model);
CompletionRequest parse_completion_request(const Json& body, const ModelInfo& model);

// The sequence answering choice `index` (seeds: seed + index, so n choices differ and a seeded
// request repeats). max_tokens is capped to what the context leaves after the prompt.
gen::SequenceParams chat_sequence(const ChatRequest& request, const gen::PreparedTurn& turn,
                                  const ModelInfo& model, int index);
gen::SequenceParams completion_sequence(const CompletionRequest& request,
                                        std::vector<int32_t> prompt, const ModelInfo& model,
                                        int index);

// {"error": {"message", "type", "param", "code"}}.
Json error_json(int status, const std::string& message, const std::string& param = {},
                const std::string& code = {});
// GET /v1/models and /v1/models/{id}.
Json models_json(const ModelInfo& model, int64_t created);
Json model_json(const ModelInfo& model, int64_t created);

// "stop" / "length" / "tool_calls" (calls were made and generation stopped by itself).
std::string finish_reason(gen::FinishReason reason, bool made_tool_calls);

// A token's text (its bytes, possibly half a UTF-8 character).
using TokenText = std::function<std::string(int32_t)>;

struct ReplyFormat {
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;
  std::string model;
  int n = 1;
  bool logprobs = false;
  bool include_usage = false;
  bool parallel_tool_calls = true;
};

// Usage over all choices: the prompt once, the completions summed.
struct Usage {
  int64_t prompt = 0, cached = 0, completion = 0;
  Json to_json() const;
};

// One chat completion request's reply, built from its choices' updates (each choice's updates in
// order; choices interleaved in any order). Streamed: stream() returns the SSE text an update
// adds. Whole: collect() every update, then response().
class ChatReply {
 public:
  ChatReply(ReplyFormat format, TokenText token_text);

  std::string stream(int choice, const gen::SequenceUpdate& update);
  // After every choice is done: the usage chunk (include_usage) and "data: [DONE]".
  std::string stream_end() const;

  void collect(int choice, const gen::SequenceUpdate& update);
  Json response() const;

  bool done() const;                                   // every choice has had its last update
  const std::string& error() const { return error_; }  // a choice ended in kError
  const Usage& usage() const { return usage_; }
  std::string finish_reasons() const;  // "stop,length" for the log line

 private:
  struct Choice {
    bool role_sent = false;
    bool done = false;
    std::vector<std::string> call_ids;  // per tool_index
    StreamEvents events;                // stream(): the parser events regrouped
    std::optional<std::string> finish;
    gen::SequenceUpdate last;  // collect(): the done update (reply, counts)
    Json logprobs = Json::array();
    std::string text;  // collect() without parse
  };
  Json chunk(int choice, Json delta, const Json& logprobs, const Json& finish) const;
  Json logprob_items(const std::vector<gen::TokenLogprob>& items) const;
  const std::string& call_id(Choice& c, size_t index);
  void count(const gen::SequenceUpdate& update);

  ReplyFormat format_;
  TokenText token_text_;
  std::vector<Choice> choices_;
  Usage usage_;
  std::string error_;
};

// The same for /v1/completions (text, no reply parsing; legacy logprobs).
class CompletionReply {
 public:
  CompletionReply(ReplyFormat format, TokenText token_text);
  std::string stream(int choice, const gen::SequenceUpdate& update);
  std::string stream_end() const;
  void collect(int choice, const gen::SequenceUpdate& update);
  Json response() const;
  bool done() const;
  const std::string& error() const { return error_; }
  const Usage& usage() const { return usage_; }
  std::string finish_reasons() const;

 private:
  struct Choice {
    bool done = false;
    std::string text;
    std::optional<std::string> finish;
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
         text_offset = Json::array();
    int64_t offset = 0;
  };
  void add_logprobs(Choice& c, const std::vector<gen::TokenLogprob>& items, Json* out);
  Json chunk(int choice, const std::string& text, const Json& logprobs, const Json& finish) const;
  void count(const gen::SequenceUpdate& update);

  ReplyFormat format_;
  TokenText token_text_;
  std::vector<Choice> choices_;
  Usage usage_;
  std::string error_;
};

}  // namespace qwenrt::serve::openai
