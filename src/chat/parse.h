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
//   - a duplicated </parameter>, a missing </parameter> (see below), a missing </function> or
//     </tool_call>;
//   - several calls in a row;
//   - a reply that ends inside a call (max tokens) gives that call with complete = false;
//   - a stray "<think>" inside the think block or "</think>" in content is dropped; a "<think>"
//     before any content opens the think block (the model thought although thinking was off).
// Reasoning and content are trimmed of ASCII whitespace at both ends (reasoning that is only
// whitespace is none); whitespace around a tool call does not reach the content.
// Where a parameter value ends is decided from the format and the tool's schema, not from the
// first tag-like text, so a value may hold tool-call markup (a file being written):
//   - VALUE</parameter> ends the value only when what follows (after whitespace, and after any
//     duplicated </parameter>) can come next: <parameter=NAME> with NAME a parameter of the
//     function's schema not yet given (any name not yet given when the function has no schema),
//     </function>, </tool_call>, or the end of the reply; after </function> and </tool_call> the
//     text must not be one of the four tags that only occur inside a call (then those tags were
//     text of a value too). Otherwise "</parameter>" is text of the value.
//   - Without </parameter> (the model left it out) a value ends at "\n<parameter=NAME>\n" (NAME as
//     above), or at "\n</function>" or "\n</tool_call>" followed as after </parameter> above.
//   - A parameter given twice keeps its first value.
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
    // tool_index, text: the next fragment of the call's arguments as JSON text; before a call's
    // kToolCall event its fragments concatenate to exactly call.arguments.dump() (with
    // error_handler_t::replace where a value is not valid UTF-8). `{"NAME":` comes when a
    // parameter's name is read; a string value streams as its characters become final; a typed
    // (non-string schema) value comes whole once it has ended; `}` comes at the end of the call.
    // A call cut off inside its name gets its `{}` without a kToolCallBegin.
    kToolCallArgs,
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
  // next call decides it. Inside a value, a candidate end (</parameter> and the rest) is held
  // until the text after it decides it: the next non-whitespace text after the closing tags, at
  // most a tag and a parameter name long.
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
  // Whether a candidate end of a value is one; kUndecided: more text is needed to tell.
  enum class Verdict { kNo, kYes, kUndecided };
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
  Verdict after_value_close(std::string_view rest, bool final) const;
  Verdict lenient_value_end(std::string_view tag, char before, std::string_view rest,
                            bool final) const;
  Verdict next_parameter(std::string_view rest, bool final) const;
  static Verdict after_call_close(std::string_view rest, bool final);
  static Verdict after_function_close(std::string_view rest, bool final);
  bool may_come_next(std::string_view name) const;
  bool is_typed(const std::string& function, const std::string& parameter) const;
  Json coerce(const std::string& function, const std::string& parameter, std::string raw) const;
  void stream_value(bool final);
  void push_args(std::string text);
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
  bool param_ignored_ = false;  // the parameter was given before: this value is dropped
  bool param_streams_ = false;  // a string value: its characters stream as they become final
  size_t param_streamed_ = 0;   // bytes of param_value_ already streamed
  bool args_opened_ = false;    // the call's arguments fragment "{" has been sent
  std::unordered_map<std::string, Json> schemas_;  // function name -> parameters.properties
  ParsedReply result_;
  std::vector<ReplyEvent> events_;
};

// parse_reply(text) == feeding text in one piece and calling finish().
ParsedReply parse_reply(std::string_view text, const ReplyParserOptions& options);

}  // namespace qwenrt::chat
