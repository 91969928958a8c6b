#include "gen/turn.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace qwenrt::gen {
namespace {

// Error naming `where` and the first invalid byte unless every string in `value` (object keys
// included) is valid UTF-8: text the tokenizer would otherwise repair silently.
void require_utf8(const chat::Json& value, const std::string& where) {
  auto check = [&](const std::string& text, const std::string& what) {
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = tokenizer::utf8_sequence_length(text, pos);
      if (n == 0)
        fail("{}: {} is not valid UTF-8 (byte {:#04x} at offset {})", where, what,
             static_cast<uint8_t>(text[pos]), pos);
      pos += n;
    }
  };
  if (value.is_string()) {
    check(value.get_ref<const std::string&>(), "the text");
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      check(key, "a key");
      if (item.is_string()) {
        check(item.get_ref<const std::string&>(), "'" + key + "'");
      } else if (item.is_structured()) {
        require_utf8(item, where + " '" + key + "'");
      }
    }
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      require_utf8(value[i], where + " [" + std::to_string(i) + "]");
  }
}

}  // namespace

PreparedTurn prepare_turn(const tokenizer::Tokenizer& tokenizer, chat::Dialect dialect,
                          const ChatTurn& turn) {
  if (turn.messages.is_array()) {
    for (size_t i = 0; i < turn.messages.size(); ++i)
      require_utf8(turn.messages[i], "message " + std::to_string(i));
  }
  if (!turn.tools.is_null()) require_utf8(turn.tools, "tools");
  PreparedTurn out;
  out.rendered = chat::render_chat(dialect, turn.messages, turn.tools, turn.render);
  out.prompt = chat::encode_prompt(tokenizer, out.rendered, chat::literal_texts(turn.messages));
  // With the generation prompt and thinking on, the prompt ends inside "<think>\n".
  out.thinking = turn.render.enable_thinking && turn.render.add_generation_prompt;
  out.parse = {.starts_in_reasoning = out.thinking, .tools = turn.tools};
  return out;
}

}  // namespace qwenrt::gen
