// Reading a Qwen3.5/3.6/3.8 reply back into reasoning, content and tool calls, whole or streamed.
//
// The reply is the text generated after the rendered prompt: with thinking on the prompt ends
// inside "<think>\n", so the reply starts as reasoning; with thinking off it starts as content.
//   [reasoning] </think> [content] <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>
//   ...</function>\n</tool_call> [more calls]
// Models do not always write that exactly; these are read as the model meant them:
//   - text before <tool_call> is content (or reasoning, inside the think block);
//   - <function=...> without <tool_call> opens a call;
//   - a call inside the think block, or one where </think> never came, is still a call (the think
//     block goes on after it until </think>, if any);
//   - a duplicated </parameter>, a missing </parameter> (the next <parameter=, </function> or
//     </tool_call> ends the value), a missing </function> or </tool_call>;
//   - several calls in a row;
//   - a reply that ends inside a call (max tokens) gives that call with complete = false;
//   - a stray "<think>" inside the think block or "</think>" in content is dropped; a "<think>"
//     before any content opens the think block (the model thought although thinking was off).
// Reasoning and content are trimmed of ASCII whitespace at both ends (reasoning that is only
// whitespace is none); whitespace around a tool call does not reach the content.
// Parameter values are strings unless the tool's JSON schema types the parameter otherwise: then
// the value is read as JSON when it parses to an allowed type ("true"/"True" for a boolean too),
// and kept as the raw string when it does not.
// Feeding the text in any chunking gives the same events (up to how deltas are split) and the same
// result; chunk boundaries may fall anywhere, inside tags or UTF-8 sequences.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/pytext.h"

namespace qwenrt::chat {

struct ToolCall {
  std::string name;
  Json arguments = Json::object();  // parameter name -> value, in the order written
  bool complete = false;            // false: the reply ended inside this call
  bool operator==(const ToolCall&) const = default;
};

struct ParsedReply {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedReply&) const = default;
};

struct ReplyEvent {
  enum class Kind {
    kReasoning,      // text: more reasoning
    kContent,        // text: more content
    kToolCallBegin,  // tool_index, call.name: a call's function name has been read
    kToolCall,       // tool_index, call: a call has ended (complete or cut off)
  };
  Kind kind = Kind::kContent;
  std::string text;
  size_t tool_index = 0;
  ToolCall call;
};

struct ReplyParserOptions {
  // The prompt ended inside an open think block (thinking on): the reply starts as reasoning.
  bool starts_in_reasoning = true;
  // The request's tool definitions ({"type": "function", "function": {...}} or the bare function);
  // their `parameters.properties` schemas decide which parameter values are read as JSON.
  Json tools;
};

class ReplyParser {
 public:
  explicit ReplyParser(const ReplyParserOptions& options);

  // Adds generated text; returns what it completed. Text that may still turn out to be part of a
  // tag (or is an incomplete UTF-8 sequence, or is trailing whitespace) is held back until the
  // next call decides it.
  std::vector<ReplyEvent> feed(std::string_view text);
  // The reply has ended (stop token or token limit): flushes what was held back; a call still open
  // is reported with complete = false.
  std::vector<ReplyEvent> finish();

  // Everything read so far (all of it after finish()).
  const ParsedReply& result() const { return result_; }

 private:
  enum class Mode { kReasoning, kContent, kCall };
  // Where inside a tool call the parser is.
  enum class CallStage { kOpen, kName, kBody, kParamName, kParamValue, kClose };
  struct Channel {
    bool started = false;    // some text has been written (leading whitespace is dropped)
    std::string pending_ws;  // trailing whitespace, written only if more text follows
  };

  bool step(bool final);
  bool step_text(bool final);
  bool step_call(bool final);
  void write_text(Mode channel, std::string_view text);
  void begin_call(bool explicit_open);
  void end_call(bool complete);
  void malformed_call();
  void finish_parameter();
  Json coerce(const std::string& function, const std::string& parameter, std::string raw) const;
  void push_event(ReplyEvent event);

  Mode mode_;
  Mode call_return_mode_ = Mode::kContent;  // the text mode a call was opened from
  CallStage stage_ = CallStage::kOpen;
  std::string buffer_;    // text received and not yet consumed
  bool skip_ws_ = false;  // whitespace after a tool call is not text
  Channel reasoning_, content_;
  ToolCall call_;
  std::string call_raw_;  // the call's text before its name was read (for a malformed call)
  std::string param_name_, param_value_;
  std::unordered_map<std::string, Json> schemas_;  // function name -> parameters.properties
  ParsedReply result_;
  std::vector<ReplyEvent> events_;
};

// parse_reply(text) == feeding text in one piece and calling finish().
ParsedReply parse_reply(std::string_view text, const ReplyParserOptions& options);

}  // namespace qwenrt::chat
