// The Anthropic dialect without a model: request reading (every field's type, required
// max_tokens, content blocks, tools, tool_choice, thinking) and replies built from SequenceUpdate
// values made here: the streamed event sequence is Anthropic's, its deltas concatenate to the whole
// reply's blocks, input_json_delta fragments to the tool input's JSON.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/parse.h"
#include "serve/anthropic.h"
#include "serve/http.h"

namespace qwenrt::serve {
namespace {

using anthropic::parse_count_tokens_request;
using anthropic::parse_messages_request;

ModelInfo tiny_model() {
  ModelInfo m;
  m.name = "tiny";
  m.n_ctx = 512;
  m.n_vocab = 3072;
  return m;
}

Json body() {
  return Json::parse(
      R"({"model": "tiny", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]})");
}

const char* kTools = R"([{"name": "get_time", "description": "Time in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}])";

ApiError error_of(const Json& b) {
  try {
    parse_messages_request(b, tiny_model());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << b.dump();
  return ApiError(0, "");
}

TEST(ServeAnthropic, WrongTypesNameTheField) {
  struct Case {
    const char* key;
    Json value;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"max_tokens", "10", "max_tokens"},
      {"max_tokens", 0, "max_tokens"},
      {"max_tokens", 1.5, "max_tokens"},
      {"model", 5, "model"},
      {"temperature", 1.5, "temperature"},
      {"temperature", "x", "temperature"},
      {"top_p", 0, "top_p"},
      {"top_k", -1, "top_k"},
      {"top_k", "3", "top_k"},
      {"stop_sequences", 5, "stop_sequences"},
      {"stop_sequences", Json::array({"a", 2}), "stop_sequences[1]"},
      {"stream", "yes", "stream"},
      {"metadata", "x", "metadata"},
      {"system", 5, "system"},
      {"system", Json::parse(R"([{"type": "image"}])"), "system[0].type"},
      {"messages", "hi", "messages"},
      {"messages", Json::array(), "messages"},
      {"messages", Json::parse(R"([{"role": "system", "content": "x"}])"), "messages[0].role"},
      {"messages", Json::parse(R"([{"role": "user"}])"), "messages[0].content"},
      {"messages", Json::parse(R"([{"role": "user", "content": 5}])"), "messages[0].content"},
      {"messages", Json::parse(R"([{"role": "user", "content": [{"type": "image"}]}])"),
       "messages[0].content[0].type"},
      {"messages", Json::parse(R"([{"role": "user", "content": [{"type": "text"}]}])"),
       "messages[0].content[0].text"},
      {"messages", Json::parse(R"([{"role": "user", "content": [{"type": "tool_use"}]}])"),
       "messages[0].content[0].type"},
      {"messages",
       Json::parse(R"([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])"),
       "messages[0].content[0].tool_use_id"},
      {"messages",
       Json::parse(
           R"([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}])"),
       "messages[0].content[0].input"},
      {"tools", "x", "tools"},
      {"tools", Json::parse(R"([{"name": "f"}])"), "tools[0].input_schema"},
      {"tools", Json::parse(R"([{"name": "f", "input_schema": {"type": "array"}}])"),
       "tools[0].input_schema.type"},
      {"tools", Json::parse(R"([{"name": "f", "input_schema": {"properties": 3}}])"),
       "tools[0].input_schema.properties"},
      {"tools", Json::parse(R"([{"name": "f", "input_schema": {"required": [1]}}])"),
       "tools[0].input_schema.required[0]"},
      {"tools", Json::parse(R"([{"name": "bad name", "input_schema": {}}])"), "tools[0].name"},
      {"tools", Json::parse(R"([{"type": "web_search_20250305", "name": "w"}])"), "tools[0].type"},
      {"tool_choice", "auto", "tool_choice"},
      {"tool_choice", Json::parse(R"({"type": "sometimes"})"), "tool_choice.type"},
      {"tool_choice", Json::parse(R"({"type": "tool", "name": "nope"})"), "tool_choice.name"},
      {"tool_choice", Json::parse(R"({"type": "any"})"), "tool_choice"},
      {"thinking", "on", "thinking"},
      {"thinking", Json::parse(R"({"type": "enabled"})"), "thinking.budget_tokens"},
      {"thinking", Json::parse(R"({"type": "enabled", "budget_tokens": "9"})"),
       "thinking.budget_tokens"},
      {"thinking", Json::parse(R"({"type": "sometimes"})"), "thinking.type"},
  };
  for (const auto& c : cases) {
    Json b = body();
    b[c.key] = c.value;
    const ApiError e = error_of(b);
    EXPECT_EQ(e.status(), 400) << c.key << " = " << c.value.dump();
    EXPECT_EQ(e.param(), c.param) << c.key << " = " << c.value.dump() << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
  }
  // Tool names are checked against the tools given.
  Json b = body();
  b["tools"] = Json::parse(kTools);
  b["tools"].push_back(b["tools"][0]);
  EXPECT_EQ(error_of(b).param(), "tools[1].name");
}

TEST(ServeAnthropic, MaxTokensRequiredExceptForCountTokens) {
  Json b = body();
  b.erase("max_tokens");
  const ApiError e = error_of(b);
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_NE(std::string(e.what()).find("required"), std::string::npos);
  EXPECT_NO_THROW(parse_count_tokens_request(b, tiny_model()));
  b.erase("model");
  EXPECT_EQ(error_of(b).param(), "model");
  // Invalid UTF-8 never reaches the reader.
  EXPECT_THROW(parse_json_body("{\"model\": \"a\xff\"}"), ApiError);
}

TEST(ServeAnthropic, MessagesBecomeTheTemplatesMessages) {
  const Json b = Json::parse(R"({"model": "m", "max_tokens": 64,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Time in Paris?"}]},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "10:00"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true}]},
      {"role": "user", "content": "Thanks"}]})");
  const auto r = parse_messages_request(b, tiny_model());
  const Json& m = r.turn.messages;
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], Json::parse(R"({"role": "system", "content": "Be brief.\nBe kind."})"));
  EXPECT_EQ(m[1], Json::parse(R"({"role": "user", "content": "Time in Paris?"})"));
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["reasoning_content"], "Use the tool.");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(m[3],
            Json::parse(R"({"role": "tool", "tool_call_id": "toolu_1", "content": "10:00"})"));
  EXPECT_EQ(m[4]["content"], "Error: boom");
  EXPECT_EQ(m[5]["content"], "Thanks");
  EXPECT_EQ(r.gen.max_tokens, 64);
  EXPECT_FALSE(r.turn.render.enable_thinking);  // no `thinking`: off
  EXPECT_TRUE(r.turn.render.add_generation_prompt);
}

TEST(ServeAnthropic, SettingsToolsToolChoiceThinking) {
  Json b = body();
  b.update(Json::parse(R"({"temperature": 0.2, "top_p": 0.9, "top_k": 5,
      "stop_sequences": ["END"], "stream": true, "metadata": {"user_id": "u"},
      "thinking": {"type": "enabled", "budget_tokens": 100},
      "tool_choice": {"type": "tool", "name": "get_time", "disable_parallel_tool_use": true}})"));
  b["tools"] = Json::parse(kTools);
  auto r = parse_messages_request(b, tiny_model());
  EXPECT_FLOAT_EQ(*r.gen.sampling.temperature, 0.2f);
  EXPECT_FLOAT_EQ(*r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.gen.sampling.top_k, 5);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.turn.render.enable_thinking);
  EXPECT_EQ(r.thinking_budget, 100);
  EXPECT_EQ(r.tool_choice, openai::ToolChoice::kNamed);
  EXPECT_EQ(r.tool_name, "get_time");
  EXPECT_FALSE(r.parallel_tool_calls);
  // Tools in the template's function shape, the schema as parameters.
  const Json& fn = r.turn.tools[0]["function"];
  EXPECT_EQ(r.turn.tools[0]["type"], "function");
  EXPECT_EQ(fn["name"], "get_time");
  EXPECT_EQ(fn["parameters"]["required"][0], "city");
  // Named and any force the call after thinking, as OpenAI's named and required do.
  gen::PreparedTurn turn;
  turn.prompt = {1, 2, 3};
  auto p = openai::chat_sequence(r, turn, tiny_model(), 0);
  EXPECT_EQ(p.forced_after_thinking, "<tool_call>\n<function=get_time>\n");
  EXPECT_EQ(p.thinking_budget, 100);
  b["tool_choice"] = {{"type", "any"}};
  r = parse_messages_request(b, tiny_model());
  EXPECT_EQ(r.tool_choice, openai::ToolChoice::kRequired);
  EXPECT_EQ(openai::chat_sequence(r, turn, tiny_model(), 0).forced_after_thinking,
            "<tool_call>\n<function=");
  b["tool_choice"] = {{"type", "none"}};
  EXPECT_TRUE(parse_messages_request(b, tiny_model()).turn.tools.is_null());
  b["thinking"] = {{"type", "disabled"}};
  EXPECT_FALSE(parse_messages_request(b, tiny_model()).turn.render.enable_thinking);
}

TEST(ServeAnthropic, ErrorShape) {
  const std::vector<std::pair<int, const char*>> cases = {{400, "invalid_request_error"},
                                                          {401, "authentication_error"},
                                                          {404, "not_found_error"},
                                                          {429, "rate_limit_error"},
                                                          {503, "overloaded_error"},
                                                          {529, "overloaded_error"},
                                                          {500, "api_error"}};
  for (const auto& [status, type] : cases) {
    const Json e = anthropic::error_json(status, "max_tokens: required");
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["type"], type) << status;
    EXPECT_EQ(e["error"]["message"], "max_tokens: required");
  }
}

struct Event {
  std::string name;
  Json data;
};

std::vector<Event> parse_sse(const std::string& sse) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    const std::string frame = sse.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(frame.rfind("event: ", 0), 0u) << frame;
    const size_t nl = frame.find('\n');
    const std::string name = frame.substr(7, nl - 7);
    EXPECT_EQ(frame.substr(nl + 1, 6), "data: ");
    Json data = Json::parse(frame.substr(nl + 7));
    EXPECT_EQ(data["type"], name);
    out.push_back({name, std::move(data)});
  }
  return out;
}

// The same generated text through a streamed and a whole reply, in `chunk`-byte updates.
struct Replayed {
  std::vector<Event> events;
  Json whole;
};

Replayed replay(const std::string& text, size_t chunk, gen::FinishReason finish,
                std::vector<std::string> stop = {}, const Json& tools = Json::parse(kTools)) {
  const anthropic::ReplyFormat format{.id = "msg_x", .model = "tiny", .n_prompt = 7, .stop = stop};
  // Token i spells the i-th chunk.
  std::vector<std::string> pieces;
  auto token_text = [&pieces](int32_t id) { return pieces.at(id); };
  anthropic::MessageReply streamed(format, token_text), whole(format, token_text);
  chat::ReplyParser parser({.starts_in_reasoning = true, .tools = tools});
  std::string sse;
  for (size_t i = 0; i < text.size(); i += chunk) {
    gen::SequenceUpdate u;
    u.text = text.substr(i, chunk);
    pieces.push_back(u.text);
    u.tokens = {static_cast<int32_t>(pieces.size() - 1)};
    u.events = parser.feed(u.text);
    sse += streamed.stream(0, u);
    whole.collect(0, u);
  }
  gen::SequenceUpdate last;
  last.events = parser.finish();
  last.done = true;
  last.finish = finish;
  last.reply = parser.result();
  last.n_prompt = 7;
  last.n_generated = static_cast<int64_t>(pieces.size());
  sse += streamed.stream(0, last);
  whole.collect(0, last);
  EXPECT_TRUE(streamed.done() && whole.done());
  sse += streamed.stream_end();
  return {parse_sse(sse), whole.response()};
}

TEST(ServeAnthropic, StreamedEventsConcatenateToTheWholeMessage) {
  const std::string text =
      "Need the tool.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_time>\n"
      "<parameter=city>\nChicago\n</parameter>\n</function>\n</tool_call>";
  for (size_t chunk : {1, 3, 7, 64}) {
    const auto [events, whole] = replay(text, chunk, gen::FinishReason::kStopToken);
    ASSERT_GE(events.size(), 4u);
    EXPECT_EQ(events.front().name, "message_start");
    EXPECT_EQ(events.front().data["message"]["usage"]["input_tokens"], 7);
    EXPECT_EQ(events.back().name, "message_stop");
    const Event& delta = events[events.size() - 2];
    EXPECT_EQ(delta.name, "message_delta");
    EXPECT_EQ(delta.data["delta"]["stop_reason"], "tool_use");
    EXPECT_EQ(delta.data["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    // Blocks: start, deltas of its kind, stop; indices 0, 1, 2 in order.
    std::vector<std::string> kinds;
    std::vector<std::string> texts;
    int open = -1;
    for (size_t i = 1; i + 2 < events.size(); ++i) {
      const Json& d = events[i].data;
      if (events[i].name == "content_block_start") {
        EXPECT_EQ(open, -1);
        open = d["index"];
        EXPECT_EQ(open, static_cast<int>(kinds.size()));
        kinds.push_back(d["content_block"]["type"]);
        texts.emplace_back();
      } else if (events[i].name == "content_block_delta") {
        EXPECT_EQ(d["index"], open);
        const std::string type = d["delta"]["type"];
        const std::string key = type == "thinking_delta" ? "thinking"
                                : type == "text_delta"   ? "text"
                                                         : "partial_json";
        texts.back() += d["delta"][key].get<std::string>();
      } else {
        ASSERT_EQ(events[i].name, "content_block_stop");
        EXPECT_EQ(d["index"], open);
        open = -1;
      }
    }
    EXPECT_EQ(open, -1);
    ASSERT_EQ(kinds, (std::vector<std::string>{"thinking", "text", "tool_use"})) << chunk;
    const Json& content = whole["content"];
    ASSERT_EQ(content.size(), 3u) << whole.dump();
    EXPECT_EQ(texts[0], content[0]["thinking"]);
    EXPECT_EQ(texts[0], "Need the tool.");
    EXPECT_EQ(texts[1], content[1]["text"]);
    EXPECT_EQ(content[2]["name"], "get_time");
    EXPECT_EQ(content[2]["input"], Json::parse(R"({"city": "Chicago"})"));
    // input_json_delta fragments concatenate to the input object's JSON.
    EXPECT_EQ(texts[2], dump_json(content[2]["input"]));
    EXPECT_EQ(whole["stop_reason"], "tool_use");
    EXPECT_EQ(content[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  }
}

// A call's input streams as input_json_delta fragments while it is generated (not whole at its
// end): a string value in pieces, a typed value once it has ended.
TEST(ServeAnthropic, ToolInputStreamsAsJsonFragments) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}}}}])");
  const std::string text =
      "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\"\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  for (size_t chunk : {1, 2, 5, 16}) {
    const auto [events, whole] = replay(text, chunk, gen::FinishReason::kStopToken, {}, tools);
    ASSERT_EQ(whole["content"].size(), 1u) << whole.dump();
    const Json& input = whole["content"][0]["input"];
    EXPECT_EQ(input, Json::parse(R"({"city": "New \"York\"", "days": 3})"));
    std::vector<std::string> fragments;
    bool started = false, stopped = false;
    for (const auto& e : events) {
      if (e.name == "content_block_start") {
        EXPECT_EQ(e.data["content_block"]["type"], "tool_use");
        EXPECT_EQ(e.data["content_block"]["name"], "get_weather");
        EXPECT_EQ(e.data["content_block"]["input"], Json::object());
        started = true;
      } else if (e.name == "content_block_delta") {
        EXPECT_TRUE(started && !stopped);
        EXPECT_EQ(e.data["delta"]["type"], "input_json_delta");
        fragments.push_back(e.data["delta"]["partial_json"]);
      } else if (e.name == "content_block_stop") {
        stopped = true;
      }
    }
    EXPECT_TRUE(stopped);
    std::string joined;
    for (const auto& f : fragments) joined += f;
    EXPECT_EQ(joined, dump_json(input)) << chunk;
    EXPECT_EQ(Json::parse(joined), input);
    EXPECT_GE(fragments.size(), chunk <= 5 ? 4u : 2u) << chunk;
    // The first fragment opens the object and names the first parameter, long before the end.
    EXPECT_EQ(fragments.front().rfind("{\"city\":", 0), 0u) << fragments.front();
    EXPECT_LT(fragments.front().size(), joined.size() / 2) << chunk;
  }
}

TEST(ServeAnthropic, StopReasons) {
  // A stop sequence: the one whose text came first is named.
  auto r = replay("</think>\n\nabcSTOPxyEND", 3, gen::FinishReason::kStopString, {"END", "STOP"});
  EXPECT_EQ(r.whole["stop_reason"], "stop_sequence");
  EXPECT_EQ(r.whole["stop_sequence"], "STOP");
  EXPECT_EQ(r.events[r.events.size() - 2].data["delta"]["stop_sequence"], "STOP");
  r = replay("</think>\n\nsome text", 2, gen::FinishReason::kLength);
  EXPECT_EQ(r.whole["stop_reason"], "max_tokens");
  EXPECT_TRUE(r.whole["stop_sequence"].is_null());
  r = replay("</think>\n\nfine.", 2, gen::FinishReason::kStopToken);
  EXPECT_EQ(r.whole["stop_reason"], "end_turn");
  EXPECT_EQ(r.whole["content"], Json::parse(R"([{"type": "text", "text": "fine."}])"));
  EXPECT_EQ(r.whole["usage"]["input_tokens"], 7);
  EXPECT_EQ(r.whole["usage"]["cache_read_input_tokens"], 0);
  EXPECT_EQ(r.whole["usage"]["cache_creation_input_tokens"], 0);
  // A failed sequence streams an error event and no message_stop.
  const anthropic::ReplyFormat format{.id = "msg_x", .model = "tiny"};
  anthropic::MessageReply reply(format, [](int32_t) { return std::string(); });
  gen::SequenceUpdate u;
  u.done = true;
  u.finish = gen::FinishReason::kError;
  u.error = "boom";
  std::string sse = reply.stream(0, u);  // first: it decides what stream_end() writes
  sse += reply.stream_end();
  const auto events = parse_sse(sse);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].name, "error");
  EXPECT_EQ(events[1].data["error"]["type"], "api_error");
  EXPECT_EQ(reply.error(), "boom");
}

}  // namespace
}  // namespace qwenrt::serve
