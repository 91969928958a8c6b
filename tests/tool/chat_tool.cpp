// Driver for tests/python/chat_template_parity.py: renders chat cases with the C++ renderer and
// parses replies with the C++ reply parser, so Python can compare them with its references.
//   qwenrt_chat_tool render CASES.json OUT.json
//     CASES: [{"dialect": "qwen3.5", "messages": [...], "tools": [...] | null, "options": {...}}]
//     OUT:   [{"text": "..."} | {"error": "..."}], one per case, in order
//   qwenrt_chat_tool parse CASES.json OUT.json
//     CASES: [{"text": "...", "starts_in_reasoning": true, "tools": [...] | null}]
//     OUT:   [{"reasoning", "content", "tool_calls": [{"name", "arguments", "complete"}]}]
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "chat/parse.h"
#include "chat/render.h"
#include "core/error.h"

namespace {

using qwenrt::chat::Json;

Json read_json(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) qwenrt::fail("cannot open {}", path);
  std::stringstream text;
  text << file.rdbuf();
  return Json::parse(text.str());
}

Json render_cases(const Json& cases) {
  Json results = Json::array();
  for (const Json& item : cases) {
    Json result = Json::object();
    try {
      const auto dialect = qwenrt::chat::dialect_from_name(item.at("dialect").get<std::string>());
      if (!dialect) qwenrt::fail("unknown dialect {}", item.at("dialect").dump());
      const Json tools = item.contains("tools") ? item["tools"] : Json();
      const auto options = qwenrt::chat::render_options_from_json(
          item.contains("options") ? item["options"] : Json());
      result["text"] = qwenrt::chat::render_chat(*dialect, item.at("messages"), tools, options);
    } catch (const qwenrt::Error& error) {
      result["error"] = error.what();
    }
    results.push_back(std::move(result));
  }
  return results;
}

Json parse_cases(const Json& cases) {
  Json results = Json::array();
  for (const Json& item : cases) {
    qwenrt::chat::ReplyParserOptions options{
        .starts_in_reasoning = item.value("starts_in_reasoning", true),
        .tools = item.contains("tools") ? item["tools"] : Json()};
    const auto reply = qwenrt::chat::parse_reply(item.at("text").get<std::string>(), options);
    Json calls = Json::array();
    for (const auto& call : reply.tool_calls) {
      calls.push_back(
          {{"name", call.name}, {"arguments", call.arguments}, {"complete", call.complete}});
    }
    results.push_back(
        {{"reasoning", reply.reasoning}, {"content", reply.content}, {"tool_calls", calls}});
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: qwenrt_chat_tool render|parse CASES.json OUT.json\n";
    return 2;
  }
  try {
    const std::string command = argv[1];
    const Json cases = read_json(argv[2]);
    Json results;
    if (command == "render") {
      results = render_cases(cases);
    } else if (command == "parse") {
      results = parse_cases(cases);
    } else {
      qwenrt::fail("unknown command '{}'", command);
    }
    std::ofstream out(argv[3], std::ios::binary);
    out << results.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
    if (!out) qwenrt::fail("cannot write {}", argv[3]);
  } catch (const std::exception& error) {
    std::cerr << "qwenrt_chat_tool: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
