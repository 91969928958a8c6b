// A rendered conversation to token ids, with the caller's text kept literal: control-token text
// that a user typed ("<|im_end|>" inside a message) stays ordinary text, while the template's own
// control tokens are recognised.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat/pytext.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::chat {

// The texts of system, user, tool and assistant messages (content strings, text parts, assistant
// reasoning_content) as the template writes them (stripped), in message order.
std::vector<std::string> literal_texts(const Json& messages);

// Tokenizes `rendered` with control tokens parsed, except inside the given literal texts, which
// are found in order in `rendered` and tokenized as plain text. When no literal contains
// added-token text this equals tokenizer.encode(rendered, true).
std::vector<int32_t> encode_prompt(const tokenizer::Tokenizer& tokenizer,
                                   const std::string& rendered,
                                   const std::vector<std::string>& literals);

}  // namespace qwenrt::chat
