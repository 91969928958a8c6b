// The OpenAI Responses API, stateless: POST /v1/responses read into the same chat request the chat
// completions endpoint makes (so sequences are built by openai::chat_sequence), and the
// scheduler's updates written back as a Response object (reasoning, message and function_call
// output items) or as its streaming events (response.created ... response.completed, each with a
// sequence_number). Errors are in OpenAI's shape (openai::error_json). No I/O here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gen/scheduler.h"
#include "serve/fields.h"
#include "serve/openai.h"
#include "serve/stream_events.h"

namespace qwenrt::serve::responses {

// 400 naming the field (previous_response_id and item_reference name themselves as unsupported:
// nothing is stored between requests).
openai::ChatRequest parse_request(const Json& body, const ModelInfo& model);

struct ReplyFormat {
  std::string id;  // "resp_..."
  int64_t created = 0;
  std::string model;
  int64_t n_prompt = 0;
  bool thinking = false;  // the reply starts in the think block (reasoning tokens are counted)
  // Echoed in the Response object as the request gave them.
  Json instructions = nullptr;
  Json tools = Json::array();
  Json tool_choice = "auto";
  Json temperature = nullptr, top_p = nullptr, max_output_tokens = nullptr;
  Json reasoning = nullptr;
  bool parallel_tool_calls = true;
};

// The request's echo fields (instructions, tools, tool_choice, sampling) for the format.
void echo_request(const Json& body, ReplyFormat& format);

// One /v1/responses reply (one sequence). Streamed: stream() returns the events an update adds,
// stream_end() response.completed (or response.incomplete). Whole: collect(), then response().
class ResponseReply {
 public:
  ResponseReply(ReplyFormat format, openai::TokenText token_text);

  std::string stream(int choice, const gen::SequenceUpdate& update);
  std::string stream_end();
  void collect(int choice, const gen::SequenceUpdate& update);
  Json response() const;

  bool done() const { return done_; }
  const std::string& error() const { return error_; }
  const openai::Usage& usage() const { return usage_; }
  std::string finish_reasons() const;
  std::string stream_error(int status, const std::string& message);

 private:
  enum class Item { kNone, kReasoning, kMessage, kCall };
  std::string emit(const std::string& type, Json fields);
  std::string open_item(Item kind, const chat::ReplyEvent* call);
  std::string close_item();
  void count(const gen::SequenceUpdate& update);
  Json snapshot(const std::string& status, const Json& output) const;
  Json usage_json() const;

  ReplyFormat format_;
  openai::TokenText token_text_;
  bool started_ = false, done_ = false, failed_ = false;
  int64_t sequence_ = 0;
  Item item_ = Item::kNone;
  Json open_ = nullptr;            // the open item (its text / arguments so far)
  StreamEvents events_;            // the parser events regrouped for stream()
  Json streamed_ = Json::array();  // output items closed so far
  bool in_reasoning_ = false;
  int64_t reasoning_tokens_ = 0;
  gen::SequenceUpdate last_;
  openai::Usage usage_;
  std::string error_;
};

}  // namespace qwenrt::serve::responses
