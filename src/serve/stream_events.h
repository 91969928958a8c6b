// The reply parser's events regrouped for a streamed reply, the part every dialect shares: text of
// one kind in a row joined into one event, a call's argument fragments in a row joined into one,
// and every call opened (kToolCallBegin, with its name) before its first fragment. The dialects
// then write kToolCallBegin as the call's header (OpenAI's id / name delta, Anthropic's tool_use
// content_block_start, the Responses function_call item), each kToolCallArgs as one arguments
// delta, and kToolCall as the call's end; the fragments of a call concatenate to
// dump_json(call.arguments) (chat/parse.h), so a client's accumulated string is the whole reply's.
#pragma once

#include <string>
#include <vector>

#include "chat/parse.h"

namespace qwenrt::serve {

class StreamEvents {
 public:
  // One update's events, regrouped. Calls are tracked across updates (a call's header goes out
  // once, in the update that read its name).
  std::vector<chat::ReplyEvent> next(const std::vector<chat::ReplyEvent>& events);

 private:
  std::vector<bool> begun_;             // per tool_index: its kToolCallBegin has gone out
  std::vector<std::string> held_args_;  // per tool_index: fragments that came before the name
};

}  // namespace qwenrt::serve
