// The OpenAI Responses API without a model: request reading (input items, instructions, tools,
// tool_choice, reasoning, the stateless refusals) and replies built from SequenceUpdate values made
// here: every streamed event has the next sequence_number, items open and close in order, and the
// streamed deltas concatenate to the whole response's reasoning, text and call arguments.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/parse.h"
#include "serve/http.h"
#include "serve/responses.h"

namespace qwenrt::serve {
namespace {

ModelInfo tiny_model() {
  ModelInfo m;
  m.name = "tiny";
  m.n_ctx = 512;
  m.n_vocab = 3072;
  return m;
}

Json body() {
  return Json::parse(R"({"model": "tiny", "input": "hi"})");
}

const char* kTools = R"([{"type": "function", "name": "get_time", "description": "Time.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])";

ApiError error_of(const Json& b) {
  try {
    responses::parse_request(b, tiny_model());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << b.dump();
  return ApiError(0, "");
}

TEST(ServeResponses, WrongTypesNameTheField) {
  struct Case {
    const char* key;
    Json value;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"previous_response_id", "resp_1", "previous_response_id"},
      {"conversation", "c", "conversation"},
      {"store", "no", "store"},
      {"model", 3, "model"},
      {"max_output_tokens", 0, "max_output_tokens"},
      {"max_output_tokens", "5", "max_output_tokens"},
      {"temperature", 3, "temperature"},
      {"top_p", 0, "top_p"},
      {"stream", 1, "stream"},
      {"instructions", 5, "instructions"},
      {"input", 5, "input"},
      {"input", Json::array(), "input"},
      {"input", Json::parse(R"([5])"), "input[0]"},
      {"input", Json::parse(R"([{"content": "x"}])"), "input[0].type"},
      {"input", Json::parse(R"([{"role": "tool", "content": "x"}])"), "input[0].role"},
      {"input", Json::parse(R"([{"role": "user", "content": [{"type": "input_image"}]}])"),
       "input[0].content[0].type"},
      {"input", Json::parse(R"([{"type": "function_call", "call_id": "c", "name": "f"}])"),
       "input[0].arguments"},
      {"input",
       Json::parse(
           R"([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}])"),
       "input[0].arguments"},
      {"input", Json::parse(R"([{"type": "function_call_output", "output": "x"}])"),
       "input[0].call_id"},
      {"input", Json::parse(R"([{"type": "reasoning", "summary": "x"}])"), "input[0].summary"},
      {"input", Json::parse(R"([{"type": "item_reference", "id": "x"}])"), "input[0].type"},
      {"input", Json::parse(R"([{"type": "web_search_call"}])"), "input[0].type"},
      {"tools", Json::parse(R"([{"type": "web_search"}])"), "tools[0].type"},
      {"tools", Json::parse(R"([{"type": "function"}])"), "tools[0].name"},
      {"tools",
       Json::parse(R"([{"type": "function", "name": "f", "parameters": {"type": "string"}}])"),
       "tools[0].parameters.type"},
      {"tool_choice", "always", "tool_choice"},
      {"tool_choice", "required", "tool_choice"},
      {"tool_choice", Json::parse(R"({"type": "function", "name": "nope"})"), "tool_choice.name"},
      {"reasoning", "high", "reasoning"},
      {"reasoning", Json::parse(R"({"effort": "extreme"})"), "reasoning.effort"},
      {"text", Json::parse(R"({"format": {"type": "json_schema"}})"), "text.format.type"},
  };
  for (const auto& c : cases) {
    Json b = body();
    b[c.key] = c.value;
    const ApiError e = error_of(b);
    EXPECT_EQ(e.status(), 400) << c.key << " = " << c.value.dump();
    EXPECT_EQ(e.param(), c.param) << c.key << " = " << c.value.dump() << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
  }
  Json b = body();
  b.erase("input");
  EXPECT_EQ(error_of(b).param(), "input");
}

TEST(ServeResponses, InputItemsBecomeMessages) {
  Json b = Json::parse(R"({"instructions": "Be brief.", "max_output_tokens": 40, "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Time in Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Call it."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_time",
       "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "10:00"},
      {"type": "message", "role": "assistant",
       "content": [{"type": "output_text", "text": "It is 10:00."}]},
      {"role": "developer", "content": "Note."}]})");
  b["tools"] = Json::parse(kTools);
  b["tool_choice"] = Json::parse(R"({"type": "function", "name": "get_time"})");
  const auto r = responses::parse_request(b, tiny_model());
  const Json& m = r.turn.messages;
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], Json::parse(R"({"role": "system", "content": "Be brief."})"));
  EXPECT_EQ(m[1]["content"], "Time in Paris?");
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["reasoning_content"], "Call it.");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(m[3], Json::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "10:00"})"));
  EXPECT_EQ(m[4]["content"], "It is 10:00.");
  EXPECT_EQ(m[5]["role"], "system");
  EXPECT_EQ(r.gen.max_tokens, 40);
  EXPECT_EQ(r.tool_choice, openai::ToolChoice::kNamed);
  EXPECT_EQ(r.turn.tools[0]["function"]["name"], "get_time");
  EXPECT_TRUE(r.turn.render.enable_thinking);  // the model's default without reasoning
  b["reasoning"] = {{"effort", "none"}};
  EXPECT_FALSE(responses::parse_request(b, tiny_model()).turn.render.enable_thinking);
  b["reasoning"] = {{"effort", "low"}};
  EXPECT_EQ(responses::parse_request(b, tiny_model()).turn.render.reasoning_effort, "low");
}

struct Replayed {
  std::vector<Json> events;
  Json whole;
};

Replayed replay(const std::string& text, size_t chunk, gen::FinishReason finish,
                const Json& tools = Json::parse(kTools)) {
  responses::ReplyFormat format{
      .id = "resp_x", .created = 1, .model = "tiny", .n_prompt = 9, .thinking = true};
  auto token_text = [](int32_t) { return std::string("t"); };
  responses::ResponseReply streamed(format, token_text), whole(format, token_text);
  chat::ReplyParser parser({.starts_in_reasoning = true, .tools = tools});
  std::string sse;
  int64_t n = 0;
  for (size_t i = 0; i < text.size(); i += chunk, ++n) {
    gen::SequenceUpdate u;
    u.text = text.substr(i, chunk);
    u.tokens = {0};
    u.events = parser.feed(u.text);
    sse += streamed.stream(0, u);
    whole.collect(0, u);
  }
  gen::SequenceUpdate last;
  last.events = parser.finish();
  last.done = true;
  last.finish = finish;
  last.reply = parser.result();
  last.n_prompt = 9;
  last.n_generated = n;
  sse += streamed.stream(0, last);
  whole.collect(0, last);
  sse += streamed.stream_end();
  std::vector<Json> events;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    const std::string frame = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t data = frame.find("\ndata: ");
    EXPECT_NE(data, std::string::npos) << frame;
    events.push_back(Json::parse(frame.substr(data + 7)));
    EXPECT_EQ(frame.substr(7, data - 7), events.back()["type"]);
  }
  return {std::move(events), whole.response()};
}

TEST(ServeResponses, StreamedEventsConcatenateToTheWholeResponse) {
  const std::string text =
      "Need the tool.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_time>\n"
      "<parameter=city>\nChicago\n</parameter>\n</function>\n</tool_call>";
  for (size_t chunk : {1, 5, 64}) {
    const auto [events, whole] = replay(text, chunk, gen::FinishReason::kStopToken);
    ASSERT_GE(events.size(), 3u);
    for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i]["sequence_number"], i);
    EXPECT_EQ(events[0]["type"], "response.created");
    EXPECT_EQ(events[0]["response"]["status"], "in_progress");
    EXPECT_EQ(events[1]["type"], "response.in_progress");
    EXPECT_EQ(events.back()["type"], "response.completed");
    std::string reasoning, content, arguments, reasoning_done, content_done, arguments_done;
    std::vector<std::string> added, finished;
    for (const auto& e : events) {
      const std::string type = e["type"];
      if (type == "response.output_item.added") {
        EXPECT_EQ(e["output_index"], added.size());
        added.push_back(e["item"]["type"]);
      } else if (type == "response.output_item.done") {
        EXPECT_EQ(e["output_index"], finished.size());
        finished.push_back(e["item"]["type"]);
        EXPECT_EQ(e["item"]["status"], "completed");
      } else if (type == "response.reasoning_text.delta") {
        reasoning += e["delta"].get<std::string>();
      } else if (type == "response.output_text.delta") {
        content += e["delta"].get<std::string>();
        EXPECT_TRUE(e["logprobs"].is_array());
      } else if (type == "response.function_call_arguments.delta") {
        arguments += e["delta"].get<std::string>();
      } else if (type == "response.reasoning_text.done") {
        reasoning_done = e["text"];
      } else if (type == "response.output_text.done") {
        content_done = e["text"];
      } else if (type == "response.function_call_arguments.done") {
        arguments_done = e["arguments"];
      }
    }
    const std::vector<std::string> kinds = {"reasoning", "message", "function_call"};
    EXPECT_EQ(added, kinds);
    EXPECT_EQ(finished, kinds);
    const Json& out = whole["output"];
    ASSERT_EQ(out.size(), 3u) << whole.dump();
    EXPECT_EQ(reasoning, out[0]["content"][0]["text"]);
    EXPECT_EQ(reasoning, reasoning_done);
    EXPECT_EQ(content, out[1]["content"][0]["text"]);
    EXPECT_EQ(content, content_done);
    EXPECT_EQ(content, "Let me check.");
    EXPECT_EQ(out[2]["name"], "get_time");
    EXPECT_EQ(arguments, out[2]["arguments"]);
    EXPECT_EQ(arguments, arguments_done);
    EXPECT_EQ(Json::parse(arguments.empty() ? "null" : arguments),
              Json::parse(R"({"city": "Chicago"})"));
    EXPECT_EQ(whole["status"], "completed");
    EXPECT_EQ(whole["usage"]["input_tokens"], 9);
    EXPECT_EQ(whole["usage"]["total_tokens"], whole["usage"]["input_tokens"].get<int64_t>() +
                                                  whole["usage"]["output_tokens"].get<int64_t>());
    const int64_t reasoning_tokens = whole["usage"]["output_tokens_details"]["reasoning_tokens"];
    EXPECT_GT(reasoning_tokens, 0);
    EXPECT_LT(reasoning_tokens, whole["usage"]["output_tokens"].get<int64_t>());
    // The completed event carries the same items.
    const Json& completed = events.back()["response"]["output"];
    ASSERT_EQ(completed.size(), 3u);
    EXPECT_EQ(completed[2]["arguments"], arguments);
    EXPECT_EQ(completed[1]["content"][0]["text"], content);
  }
}

// A call's arguments stream as response.function_call_arguments.delta events while it is
// generated; they concatenate to the .done event's and the whole response's arguments.
TEST(ServeResponses, ArgumentsStreamAsFragments) {
  const Json tools = Json::parse(R"([{"type": "function", "name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}}}])");
  const std::string text =
      "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  for (size_t chunk : {1, 3, 16}) {
    const auto [events, whole] = replay(text, chunk, gen::FinishReason::kStopToken, tools);
    ASSERT_EQ(whole["output"].size(), 1u) << whole.dump();
    const std::string whole_args = whole["output"][0]["arguments"];
    EXPECT_EQ(Json::parse(whole_args), Json::parse(R"({"city": "São Paulo", "days": 3})"));
    std::string arguments, done;
    size_t fragments = 0;
    for (const auto& e : events) {
      if (e["type"] == "response.function_call_arguments.delta") {
        EXPECT_TRUE(done.empty()) << "a delta after .done";
        arguments += e["delta"].get<std::string>();
        ++fragments;
      } else if (e["type"] == "response.function_call_arguments.done") {
        done = e["arguments"];
      }
    }
    EXPECT_EQ(arguments, whole_args) << chunk;
    EXPECT_EQ(done, whole_args) << chunk;
    EXPECT_GE(fragments, chunk <= 3 ? 4u : 2u) << chunk;
  }
}

TEST(ServeResponses, MaxOutputTokensIsIncomplete) {
  const auto [events, whole] = replay("</think>\n\nsome text that", 4, gen::FinishReason::kLength);
  EXPECT_EQ(whole["status"], "incomplete");
  EXPECT_EQ(whole["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(whole["output"].back()["status"], "incomplete");
  EXPECT_EQ(events.back()["type"], "response.incomplete");
  EXPECT_EQ(events.back()["response"]["incomplete_details"]["reason"], "max_output_tokens");
  // No reasoning: no reasoning item.
  EXPECT_EQ(whole["output"].size(), 1u);
  EXPECT_EQ(whole["output"][0]["type"], "message");
}

}  // namespace
}  // namespace qwenrt::serve
