#include "chat/prompt.h"

namespace qwenrt::chat {
namespace {

bool has_added_token_text(const tokenizer::Tokenizer& tokenizer, const std::string& text) {
  // Every added token is written "<...>"; look up each bracketed span.
  for (size_t open = text.find('<'); open != std::string::npos; open = text.find('<', open + 1)) {
    for (size_t close = text.find('>', open); close != std::string::npos && close - open < 64;
         close = text.find('>', close + 1)) {
      if (tokenizer.token_id(std::string_view(text).substr(open, close - open + 1))) return true;
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> literal_texts(const Json& messages) {
  std::vector<std::string> out;
  if (!messages.is_array()) return out;
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) continue;
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "tool" && role != "assistant") continue;
    if (role == "assistant" && m.contains("reasoning_content") &&
        m["reasoning_content"].is_string()) {
      out.emplace_back(py_strip(m["reasoning_content"].get<std::string>()));
    }
    if (!m.contains("content")) continue;
    const Json& c = m["content"];
    if (c.is_string()) {
      out.emplace_back(py_strip(c.get<std::string>()));
    } else if (c.is_array()) {
      for (const auto& part : c) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          out.emplace_back(py_strip(part["text"].get<std::string>()));
        }
      }
    }
  }
  return out;
}

std::vector<int32_t> encode_prompt(const tokenizer::Tokenizer& tokenizer,
                                   const std::string& rendered,
                                   const std::vector<std::string>& literals) {
  bool any = false;
  for (const auto& l : literals) any = any || has_added_token_text(tokenizer, l);
  if (!any) return tokenizer.encode(rendered, true);
  std::vector<int32_t> ids;
  size_t pos = 0;
  for (const auto& l : literals) {
    if (l.empty()) continue;
    const size_t at = rendered.find(l, pos);
    // The template drops some text (reasoning of early turns) and reshapes some (an assistant
    // content holding its own <think> block): what is not found verbatim is left to the template.
    if (at == std::string::npos) continue;
    tokenizer.encode(std::string_view(rendered).substr(pos, at - pos), true, ids);
    tokenizer.encode(l, false, ids);
    pos = at + l.size();
  }
  tokenizer.encode(std::string_view(rendered).substr(pos), true, ids);
  return ids;
}

}  // namespace qwenrt::chat
