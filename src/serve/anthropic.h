// The Anthropic dialect: POST /v1/messages and /v1/messages/count_tokens read into the same chat
// request the OpenAI dialect makes (so sequences are built by openai::chat_sequence), and the
// scheduler's updates written back as Anthropic's Message JSON or its SSE event sequence
// (message_start, content_block_start / _delta / _stop per block, message_delta, message_stop).
// No I/O here: server.cpp moves the bytes; tests drive these functions with updates they make.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gen/scheduler.h"
#include "serve/fields.h"
#include "serve/openai.h"
#include "serve/stream_events.h"

namespace qwenrt::serve::anthropic {

// 400 (ApiError naming the field, e.g. "messages[1].content[0].tool_use_id") on anything malformed.
// max_tokens is required, as Anthropic requires it; count_tokens bodies have none.
openai::ChatRequest parse_messages_request(const Json& body, const ModelInfo& model);
openai::ChatRequest parse_count_tokens_request(const Json& body, const ModelInfo& model);

// {"type": "error", "error": {"type": "invalid_request_error" ..., "message"}}.
Json error_json(int status, const std::string& message);
// The error type Anthropic gives a status (400 invalid_request_error, 401 authentication_error,
// 404 not_found_error, 429 rate_limit_error, 503/529 overloaded_error, 5xx api_error).
std::string error_type(int status);

struct ReplyFormat {
  std::string id;  // "msg_..."
  std::string model;
  int64_t n_prompt = 0;           // the prompt's tokens, for message_start's usage
  std::vector<std::string> stop;  // the request's stop_sequences (which one matched is reported)
};

// end_turn / max_tokens / stop_sequence / tool_use.
std::string stop_reason(gen::FinishReason reason, bool made_tool_calls);

// One /v1/messages reply (one sequence: choice 0). Streamed: stream() returns the SSE events an
// update adds, stream_end() the message_delta and message_stop. Whole: collect() every update,
// then response().
class MessageReply {
 public:
  MessageReply(ReplyFormat format, openai::TokenText token_text);

  std::string stream(int choice, const gen::SequenceUpdate& update);
  std::string stream_end() const;
  void collect(int choice, const gen::SequenceUpdate& update);
  Json response() const;

  bool done() const { return done_; }
  const std::string& error() const { return error_; }
  const openai::Usage& usage() const { return usage_; }
  std::string finish_reasons() const { return stop_reason_.value_or("?"); }
  // What server.cpp writes for a failure in this dialect (a timeout, a failed sequence).
  Json error_body(int status, const std::string& message) const;
  std::string stream_error(int status, const std::string& message);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  std::string open_block(Block kind, Json content_block);
  std::string close_block();
  void finish(const gen::SequenceUpdate& update);

  ReplyFormat format_;
  openai::TokenText token_text_;
  bool started_ = false, done_ = false, failed_ = false;
  Block block_ = Block::kNone;
  int index_ = -1;               // the open block's index
  StreamEvents events_;          // the parser events regrouped for stream()
  std::vector<int32_t> tokens_;  // every generated token (to tell which stop sequence matched)
  gen::SequenceUpdate last_;     // the done update
  std::optional<std::string> stop_reason_;
  Json stop_sequence_ = nullptr;
  openai::Usage usage_;
  std::string error_;
};

}  // namespace qwenrt::serve::anthropic
