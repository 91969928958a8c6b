// Test support for the reply parser's tests (test_chat_parse.cpp, test_chat_parse_markup.cpp):
// parse() with the tests' defaults, a ToolCall builder, a reply's readable form for failures
// (EXPECT_REPLY), a tool set whose parameters cover every schema type, and a UTF-8 check.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>

#include "chat/parse.h"
#include "chat/pytext.h"

#define EXPECT_REPLY(got, want)                                                       \
  EXPECT_EQ(got, want) << "got " << ::qwenrt::testing_support::show(got) << "\nwant " \
                       << ::qwenrt::testing_support::show(want)

namespace qwenrt::testing_support {

inline chat::ParsedReply parse(std::string_view text, bool thinking = true,
                               const chat::Json& tools = chat::Json()) {
  return chat::parse_reply(text, {.starts_in_reasoning = thinking, .tools = tools});
}

inline chat::ToolCall call(const std::string& name, chat::Json arguments, bool complete = true) {
  return chat::ToolCall{.name = name, .arguments = std::move(arguments), .complete = complete};
}

inline std::string show(const chat::ParsedReply& reply) {
  chat::Json calls = chat::Json::array();
  for (const auto& c : reply.tool_calls) {
    calls.push_back({{"name", c.name}, {"arguments", c.arguments}, {"complete", c.complete}});
  }
  return chat::Json{
      {"reasoning", reply.reasoning}, {"content", reply.content}, {"tool_calls", calls}}
      .dump(-1, ' ', false, chat::Json::error_handler_t::replace);
}

inline std::string dump_arguments(const chat::ToolCall& c) {
  return c.arguments.dump(-1, ' ', false, chat::Json::error_handler_t::replace);
}

inline const chat::Json kTools =
    chat::Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
  "type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
    "opt": {"type": ["integer", "null"]}, "any": {"anyOf": [{"type": "number"}, {"type": "string"}]},
    "e": {"enum": ["x", "y"]}}}}},
  {"name": "bare", "parameters": {"type": "object", "properties": {"k": {"type": "integer"}}}}])");

inline bool valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80    ? 1
                          : lead >= 0xF0 ? 4
                          : lead >= 0xE0 ? 3
                          : lead >= 0xC0 ? 2
                                         : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

}  // namespace qwenrt::testing_support
