// One chat turn, from messages to the sequence that answers them: render with the checkpoint's
// dialect, tokenize (user text kept literal), and the reply parser's options. What `run`, `chat`
// and the server's chat endpoints share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat/parse.h"
#include "chat/prompt.h"
#include "chat/render.h"
#include "gen/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::gen {

struct ChatTurn {
  chat::Json messages;         // OpenAI-style messages (chat/render.h), non-empty
  chat::Json tools = nullptr;  // null or an array of tool definitions
  chat::RenderOptions render;  // enable_thinking, preserve_thinking, reasoning_effort
};

struct PreparedTurn {
  std::string rendered;         // the prompt text (for count_tokens and debugging)
  std::vector<int32_t> prompt;  // its tokens
  bool thinking = false;        // the prompt ends inside an open think block
  chat::ReplyParserOptions parse;
};

// Error (naming the message and problem) on messages the template rejects or text that is not
// valid UTF-8.
PreparedTurn prepare_turn(const tokenizer::Tokenizer& tokenizer, chat::Dialect dialect,
                          const ChatTurn& turn);

}  // namespace qwenrt::gen
