// The OpenAI dialect without a model: request reading (every field's type and range, messages,
// tools, tool_choice) and replies built from SequenceUpdate values made here (whole and
// streamed; streamed tool-call argument fragments concatenate to the whole reply's string).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/parse.h"
#include "serve/http.h"
#include "serve/openai.h"

namespace qwenrt::serve {
namespace {

using openai::parse_chat_request;
using openai::parse_completion_request;

ModelInfo tiny_model() {
  ModelInfo m;
  m.name = "tiny";
  m.n_ctx = 512;
  m.n_vocab = 3072;
  return m;
}

Json chat_body() {
  return Json::parse(R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})");
}

// The 400 a body gets, with its param.
ApiError chat_error(const Json& body) {
  try {
    parse_chat_request(body, tiny_model());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return ApiError(0, "");
}

TEST(ServeOpenai, MalformedBodies) {
  for (const char* text : {"", "{", "[1, 2]", "\"text\"", "{\"a\": }", "nul", "{\"a\": 1} x"}) {
    try {
      parse_json_body(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << text;
      EXPECT_NE(std::string(e.what()).find("JSON"), std::string::npos) << e.what();
    }
  }
  // Invalid UTF-8 inside a string.
  const std::string bad = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\xff\xfe\"}]}";
  EXPECT_THROW(parse_json_body(bad), ApiError);
  const std::string overlong = "{\"x\": \"\xc0\xaf\"}";
  EXPECT_THROW(parse_json_body(overlong), ApiError);
  // A number too large for a double is a 400 too, not an escaping exception.
  EXPECT_THROW(parse_json_body("{\"temperature\": 1e999}"), ApiError);
  EXPECT_NO_THROW(parse_json_body(chat_body().dump()));
}

TEST(ServeOpenai, WrongTypesNameTheField) {
  struct Case {
    const char* key;
    Json value;
  };
  const std::vector<Case> cases = {
      {"temperature", "hot"},
      {"temperature", -1},
      {"temperature", 2.5},
      {"temperature", 1e300},
      {"top_p", 0},
      {"top_p", 1.5},
      {"top_p", true},
      {"top_k", -2},
      {"top_k", 1.5},
      {"top_k", "5"},
      {"min_p", 2},
      {"presence_penalty", 3},
      {"frequency_penalty", -3},
      {"repetition_penalty", 0},
      {"seed", "x"},
      {"seed", 1.5},
      {"max_tokens", 0},
      {"max_tokens", -5},
      {"max_tokens", "10"},
      {"max_tokens", 1e30},
      {"max_completion_tokens", 0.5},
      {"n", 0},
      {"n", 17},
      {"n", "2"},
      {"stream", "yes"},
      {"stream", 1},
      {"stop", 5},
      {"stop", Json::array({"a", 1})},
      {"stop", ""},
      {"logprobs", "true"},
      {"top_logprobs", 21},
      {"top_logprobs", -1},
      {"logit_bias", "x"},
      {"logit_bias", {{"abc", 1}}},
      {"logit_bias", {{"99999", 1}}},
      {"logit_bias", {{"5", 200}}},
      {"logit_bias", {{"5", "x"}}},
      {"stream_options", 1},
      {"tools", "x"},
      {"tool_choice", 5},
      {"tool_choice", "sometimes"},
      {"parallel_tool_calls", "no"},
      {"chat_template_kwargs", "x"},
      {"reasoning_effort", "extreme"},
      {"reasoning_effort", 3},
      {"response_format", {{"type", "json_schema"}}},
      {"thinking_budget", -1},
      {"model", 5},
      {"messages", "hi"},
      {"messages", Json::array()},
      {"best_of", 3},
  };
  for (const auto& c : cases) {
    Json body = chat_body();
    body[c.key] = c.value;
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status(), 400) << c.key << " = " << c.value.dump();
    EXPECT_EQ(e.param().rfind(c.key, 0), 0u)
        << c.key << " = " << c.value.dump() << ": param '" << e.param() << "', " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.key), std::string::npos) << e.what();
  }
  Json body = chat_body();
  body["top_logprobs"] = 3;  // without logprobs: true
  EXPECT_EQ(chat_error(body).param(), "top_logprobs");
  body["stream_options"] = {{"include_usage", "yes"}};
  body["logprobs"] = true;
  EXPECT_EQ(chat_error(body).param(), "stream_options.include_usage");
}

TEST(ServeOpenai, ValuesAreRead) {
  Json body = chat_body();
  body.update(Json::parse(R"({"temperature": 0, "top_p": 0.5, "top_k": -1, "min_p": 0.1,
      "presence_penalty": 1, "frequency_penalty": -1, "repetition_penalty": 1.1, "seed": -7,
      "max_tokens": 10, "max_completion_tokens": 20, "stop": "END", "n": 3, "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 4,
      "logit_bias": {"17": -100}, "thinking_budget": 64,
      "chat_template_kwargs": {"enable_thinking": false, "reasoning_effort": "low"}})"));
  const auto r = parse_chat_request(body, tiny_model());
  EXPECT_EQ(*r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(*r.gen.sampling.top_p, 0.5f);
  EXPECT_EQ(*r.gen.sampling.top_k, 0);
  EXPECT_EQ(*r.gen.sampling.seed, static_cast<uint64_t>(-7));
  EXPECT_EQ(*r.gen.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.gen.n, 3);
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.include_usage);
  EXPECT_EQ(r.gen.top_logprobs, 4);
  EXPECT_EQ(r.gen.sampling.logit_bias.at(17), -100.0f);
  EXPECT_EQ(*r.thinking_budget, 64);
  EXPECT_FALSE(r.turn.render.enable_thinking);
  EXPECT_EQ(*r.turn.render.reasoning_effort, "low");
  EXPECT_TRUE(r.turn.render.add_generation_prompt);

  // reasoning_effort: none turns thinking off; chat_template_kwargs is read strictly.
  Json b2 = chat_body();
  b2["reasoning_effort"] = "none";
  EXPECT_FALSE(parse_chat_request(b2, tiny_model()).turn.render.enable_thinking);
  b2["chat_template_kwargs"] = {{"enable_thinking", "no"}};
  EXPECT_EQ(chat_error(b2).param(), "chat_template_kwargs");
  b2["chat_template_kwargs"] = {{"reasoning_effort", "max"}};
  EXPECT_EQ(chat_error(b2).param(), "chat_template_kwargs.reasoning_effort");
}

TEST(ServeOpenai, Messages) {
  auto with_messages = [](const char* json) {
    Json body = chat_body();
    body["messages"] = Json::parse(json);
    return body;
  };
  EXPECT_EQ(chat_error(with_messages(R"([{"role": "wizard", "content": "x"}])")).param(),
            "messages[0].role");
  EXPECT_EQ(chat_error(with_messages(R"([{"content": "x"}])")).param(), "messages[0].role");
  EXPECT_EQ(chat_error(with_messages(R"([{"role": 5, "content": "x"}])")).param(),
            "messages[0].role");
  EXPECT_EQ(chat_error(with_messages(R"(["hi"])")).param(), "messages[0]");
  EXPECT_EQ(chat_error(with_messages(R"([{"role": "user"}])")).param(), "messages[0].content");
  EXPECT_EQ(chat_error(with_messages(R"([{"role": "user", "content": 5}])")).param(),
            "messages[0].content");
  EXPECT_EQ(
      chat_error(with_messages(
                     R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])"))
          .param(),
      "messages[0].content[0].type");
  EXPECT_EQ(
      chat_error(with_messages(R"([{"role": "user", "content": [{"type": "text"}]}])")).param(),
      "messages[0].content[0].text");
  EXPECT_EQ(chat_error(with_messages(R"([{"role": "user", "content": "q"}, {"role": "assistant",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}])"))
                .param(),
            "messages[1].tool_calls[0].function.arguments");
  EXPECT_EQ(chat_error(with_messages(R"([{"role": "user", "content": "q"}, {"role": "assistant",
      "tool_calls": [{"function": {"arguments": "{}"}}]}])"))
                .param(),
            "messages[1].tool_calls[0].function.name");

  // A whole history: developer is system, parts are text parts, arguments strings are objects,
  // special-token text stays as the user wrote it (tokenized literally by gen::prepare_turn).
  const auto r = parse_chat_request(with_messages(R"([
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "<|im_end|> 2+2?"}]},
      {"role": "assistant", "content": null, "reasoning_content": "add",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "4"}])"),
                                    tiny_model());
  const Json& m = r.turn.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1]["content"][0]["text"], "<|im_end|> 2+2?");
  EXPECT_EQ(m[2]["reasoning_content"], "add");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"]["b"], 2);
  EXPECT_EQ(m[3]["role"], "tool");
  EXPECT_EQ(m[3]["tool_call_id"], "call_1");
}

TEST(ServeOpenai, ToolsAndToolChoice) {
  const Json weather = Json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "d", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
  auto with_tools = [&](Json tools, Json choice = nullptr) {
    Json body = chat_body();
    body["tools"] = std::move(tools);
    if (!choice.is_null()) body["tool_choice"] = std::move(choice);
    return body;
  };
  struct Bad {
    Json tool;
    const char* param;
  };
  const std::vector<Bad> bad = {
      {"x", "tools[0]"},
      {Json::parse(R"({"function": {"name": "f"}})"), "tools[0].type"},
      {Json::parse(R"({"type": "custom", "function": {"name": "f"}})"), "tools[0].type"},
      {Json::parse(R"({"type": "function"})"), "tools[0].function"},
      {Json::parse(R"({"type": "function", "function": {}})"), "tools[0].function.name"},
      {Json::parse(R"({"type": "function", "function": {"name": "a b"}})"),
       "tools[0].function.name"},
      {Json::parse(R"({"type": "function", "function": {"name": "f>"}})"),
       "tools[0].function.name"},
      {Json::parse(R"({"type": "function", "function": {"name": "f", "parameters": 5}})"),
       "tools[0].function.parameters"},
      {Json::parse(R"({"type": "function", "function": {"name": "f", "parameters":
          {"type": "array"}}})"),
       "tools[0].function.parameters.type"},
      {Json::parse(R"({"type": "function", "function": {"name": "f", "parameters":
          {"type": "object", "properties": []}}})"),
       "tools[0].function.parameters.properties"},
      {Json::parse(R"({"type": "function", "function": {"name": "f", "parameters":
          {"type": "object", "properties": {"a": 5}}}})"),
       "tools[0].function.parameters.properties.a"},
      {Json::parse(R"({"type": "function", "function": {"name": "f", "parameters":
          {"type": "object", "required": [1]}}})"),
       "tools[0].function.parameters.required[0]"},
      {Json::parse(R"({"type": "function", "function": {"name": "f", "description": 5}})"),
       "tools[0].function.description"},
  };
  for (const auto& b : bad) {
    const ApiError e = chat_error(with_tools(Json::array({b.tool})));
    EXPECT_EQ(e.param(), b.param) << b.tool.dump() << ": " << e.what();
  }
  EXPECT_EQ(chat_error(with_tools(Json::array({weather, weather}))).param(),
            "tools[1].function.name");
  EXPECT_EQ(
      chat_error(with_tools(Json::array({weather}),
                            Json::parse(R"({"type": "function", "function": {"name": "x"}})")))
          .param(),
      "tool_choice.function.name");
  EXPECT_EQ(chat_error(with_tools(nullptr, "required")).param(), "tool_choice");

  const ModelInfo model = tiny_model();
  gen::PreparedTurn turn;
  turn.prompt = {1, 2, 3};
  {
    const auto r = parse_chat_request(with_tools(Json::array({weather}), "required"), model);
    EXPECT_EQ(r.tool_choice, openai::ToolChoice::kRequired);
    EXPECT_EQ(openai::chat_sequence(r, turn, model, 0).forced_after_thinking,
              "<tool_call>\n<function=");
  }
  {
    const auto r = parse_chat_request(
        with_tools(Json::array({weather}),
                   Json::parse(R"({"type": "function", "function": {"name": "get_weather"}})")),
        model);
    EXPECT_EQ(openai::chat_sequence(r, turn, model, 0).forced_after_thinking,
              "<tool_call>\n<function=get_weather>\n");
  }
  {
    // none: the tools do not reach the prompt.
    const auto r = parse_chat_request(with_tools(Json::array({weather}), "none"), model);
    EXPECT_TRUE(r.turn.tools.is_null());
    EXPECT_EQ(openai::chat_sequence(r, turn, model, 0).forced_after_thinking, "");
  }
  {
    Json body = with_tools(Json::array({weather}));
    body["parallel_tool_calls"] = false;
    const auto r = parse_chat_request(body, model);
    const auto p = openai::chat_sequence(r, turn, model, 0);
    EXPECT_EQ(p.stop, std::vector<std::string>{"</tool_call>"});
    EXPECT_EQ(p.forced_after_thinking, "");
  }
}

TEST(ServeOpenai, SequenceLimitsAndSeeds) {
  const ModelInfo model = tiny_model();
  Json body = chat_body();
  body["seed"] = 100;
  body["max_tokens"] = 100000;
  body["n"] = 2;
  const auto r = parse_chat_request(body, model);
  gen::PreparedTurn turn;
  turn.prompt = std::vector<int32_t>(500, 7);
  turn.thinking = true;
  const auto p0 = openai::chat_sequence(r, turn, model, 0);
  const auto p1 = openai::chat_sequence(r, turn, model, 1);
  EXPECT_EQ(p0.max_tokens, 12);  // what the 512-token context leaves
  EXPECT_EQ(p0.sampling.seed, 100u);
  EXPECT_EQ(p1.sampling.seed, 101u);
  EXPECT_TRUE(p0.starts_in_thinking);
  EXPECT_EQ(p0.top_logprobs, -1);
  try {
    check_prompt_fits(512, model.n_ctx, "messages");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos);
  }
  EXPECT_NO_THROW(check_prompt_fits(511, model.n_ctx, "messages"));
}

TEST(ServeOpenai, CompletionRequests) {
  const ModelInfo model = tiny_model();
  auto r = parse_completion_request(Json::parse(R"({"prompt": "2+2="})"), model);
  EXPECT_EQ(*r.prompt_text, "2+2=");
  EXPECT_EQ(*r.gen.max_tokens, 16);
  r = parse_completion_request(Json::parse(R"({"prompt": [1, 2, 3], "logprobs": 2})"), model);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.gen.top_logprobs, 2);
  for (const char* bad :
       {R"({})", R"({"prompt": 5})", R"({"prompt": []})", R"({"prompt": [1, -2]})",
        R"({"prompt": [1, 99999]})", R"({"prompt": ["a", "b"]})", R"({"prompt": [1.5]})",
        R"({"prompt": "x", "echo": true})", R"({"prompt": "x", "logprobs": 50})"}) {
    try {
      parse_completion_request(Json::parse(bad), model);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << bad;
      EXPECT_FALSE(e.param().empty()) << bad;
    }
  }
}

TEST(ServeOpenai, ErrorShape) {
  const Json e = openai::error_json(400, "temperature: bad", "temperature");
  EXPECT_EQ(e["error"]["message"], "temperature: bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "temperature");
  EXPECT_TRUE(e["error"]["code"].is_null());
  EXPECT_EQ(openai::error_json(401, "no")["error"]["code"], "invalid_api_key");
  EXPECT_EQ(openai::error_json(429, "busy")["error"]["type"], "rate_limit_error");
}

// --- replies ---

openai::TokenText fake_tokens() {
  return [](int32_t id) { return "t" + std::to_string(id); };
}

// The updates a sequence would deliver for `text`, cut into pieces of `chunk` bytes and read by
// the reply parser as the scheduler does.
std::vector<gen::SequenceUpdate> updates_for(const std::string& text, size_t chunk,
                                             gen::FinishReason finish, bool thinking,
                                             const Json& tools = nullptr) {
  chat::ReplyParser parser({.starts_in_reasoning = thinking, .tools = tools});
  std::vector<gen::SequenceUpdate> out;
  int64_t tokens = 0;
  for (size_t i = 0; i < text.size(); i += chunk) {
    gen::SequenceUpdate u;
    u.text = text.substr(i, chunk);
    u.events = parser.feed(u.text);
    u.logprobs = {{.id = static_cast<int32_t>(i), .logprob = -0.5f, .top = {{1, -0.25f}}}};
    ++tokens;
    out.push_back(std::move(u));
  }
  gen::SequenceUpdate last;
  last.events = parser.finish();
  last.done = true;
  last.finish = finish;
  last.reply = parser.result();
  last.n_prompt = 11;
  last.n_generated = tokens;
  out.push_back(std::move(last));
  return out;
}

// Parses SSE text into its data payloads.
std::vector<std::string> sse_payloads(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find("data: ", pos)) != std::string::npos) {
    const size_t end = text.find("\n\n", pos);
    out.push_back(text.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

const std::string kToolReply =
    "I should call it.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
    "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(ServeOpenai, StreamedToolCallsConcatenateToTheWholeReply) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}}}}, {"type": "function", "function": {"name": "get_time"}}])");
  openai::ReplyFormat format{.id = "chatcmpl-1", .created = 5, .model = "tiny", .n = 1};
  openai::ChatReply whole(format, fake_tokens());
  for (const auto& u : updates_for(kToolReply, 1000, gen::FinishReason::kStopToken, true, tools))
    whole.collect(0, u);
  ASSERT_TRUE(whole.done());
  const Json response = whole.response();
  const Json& message = response["choices"][0]["message"];
  EXPECT_EQ(response["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(message["reasoning_content"], "I should call it.");
  EXPECT_EQ(message["content"], "Let me check.");
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  const std::string whole_args = message["tool_calls"][0]["function"]["arguments"];
  EXPECT_EQ(Json::parse(whole_args), Json::parse(R"({"city": "Paris", "days": 3})"));
  EXPECT_EQ(response["usage"]["prompt_tokens"], 11);

  for (size_t chunk : {1u, 2u, 3u, 7u, 64u}) {
    openai::ChatReply streamed(format, fake_tokens());
    std::string sse;
    for (const auto& u : updates_for(kToolReply, chunk, gen::FinishReason::kStopToken, true, tools))
      sse += streamed.stream(0, u);
    ASSERT_TRUE(streamed.done());
    sse += streamed.stream_end();
    const auto payloads = sse_payloads(sse);
    ASSERT_FALSE(payloads.empty());
    EXPECT_EQ(payloads.back(), "[DONE]");
    std::string reasoning, content, finish;
    std::vector<std::string> args(2), names(2), ids(2);
    std::vector<int> fragments(2);
    for (size_t i = 0; i + 1 < payloads.size(); ++i) {
      const Json c = Json::parse(payloads[i]);
      EXPECT_EQ(c["object"], "chat.completion.chunk");
      EXPECT_EQ(c["id"], "chatcmpl-1");
      const Json& choice = c["choices"][0];
      const Json& d = choice["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const auto& tc : d["tool_calls"]) {
          const size_t k = tc["index"];
          ASSERT_LT(k, 2u);
          if (tc.contains("id")) {
            EXPECT_TRUE(ids[k].empty()) << "id sent twice";
            ids[k] = tc["id"];
            names[k] = tc["function"]["name"];
            EXPECT_EQ(tc["type"], "function");
            EXPECT_EQ(tc["function"]["arguments"], "");  // fragments follow
            continue;
          }
          EXPECT_FALSE(ids[k].empty()) << "arguments before the call's id and name";
          EXPECT_FALSE(tc["function"].contains("name")) << "name sent twice";
          args[k] += tc["function"]["arguments"].get<std::string>();
          ++fragments[k];
        }
      }
      if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
    EXPECT_EQ(reasoning, "I should call it.") << chunk;
    EXPECT_EQ(content, "Let me check.") << chunk;
    EXPECT_EQ(names, (std::vector<std::string>{"get_weather", "get_time"}));
    EXPECT_EQ(args[0], whole_args) << chunk;  // byte for byte
    EXPECT_EQ(Json::parse(args[0]), Json::parse(whole_args));
    // The arguments stream as the parser reads them: {"city":"Paris (in pieces as small as the
    // updates), ,"days":3 once the value has ended, } at the end.
    EXPECT_GE(fragments[0], chunk <= 7 ? 4 : 2) << chunk;
    EXPECT_GE(fragments[1], 2) << chunk;
    EXPECT_EQ(args[1], message["tool_calls"][1]["function"]["arguments"].get<std::string>());
    EXPECT_EQ(ids[0].rfind("call_", 0), 0u);
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_NE(sse.find("<tool_call>"), 0u);
    EXPECT_EQ(sse.find("<function"), std::string::npos) << "raw XML leaked";
  }
}

TEST(ServeOpenai, CutOffCallIsLengthNotDropped) {
  const std::string text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  openai::ReplyFormat format{.id = "chatcmpl-2", .model = "tiny"};
  openai::ChatReply whole(format, fake_tokens());
  for (const auto& u : updates_for(text, 5, gen::FinishReason::kLength, false)) whole.collect(0, u);
  const Json r = whole.response();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");

  openai::ChatReply streamed(format, fake_tokens());
  std::string sse;
  for (const auto& u : updates_for(text, 5, gen::FinishReason::kLength, false))
    sse += streamed.stream(0, u);
  EXPECT_EQ(sse.find("<parameter"), std::string::npos);
  EXPECT_NE(sse.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(sse.find("get_weather"), std::string::npos);
}

// A call cut off inside its name has no kToolCallBegin: its header (the name read so far) goes
// out at its end, before its "{}".
TEST(ServeOpenai, CallCutOffInsideItsNameStillHasAHeader) {
  const std::string text = "<tool_call>\n<function=get_wea";
  openai::ReplyFormat format{.id = "chatcmpl-3", .model = "tiny"};
  openai::ChatReply whole(format, fake_tokens());
  for (const auto& u : updates_for(text, 4, gen::FinishReason::kLength, false)) whole.collect(0, u);
  const Json r = whole.response();
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
  const Json& call = r["choices"][0]["message"]["tool_calls"][0]["function"];

  openai::ChatReply streamed(format, fake_tokens());
  std::string sse;
  for (const auto& u : updates_for(text, 4, gen::FinishReason::kLength, false))
    sse += streamed.stream(0, u);
  std::vector<Json> deltas;
  for (const auto& p : sse_payloads(sse)) {
    const Json c = Json::parse(p);
    if (c["choices"][0]["delta"].contains("tool_calls"))
      deltas.push_back(c["choices"][0]["delta"]["tool_calls"][0]);
  }
  ASSERT_EQ(deltas.size(), 2u) << sse;
  EXPECT_EQ(deltas[0]["function"]["name"], call["name"]);
  EXPECT_TRUE(deltas[0].contains("id"));
  EXPECT_EQ(deltas[1]["function"]["arguments"], call["arguments"]);
  EXPECT_EQ(call["arguments"], "{}");
}

TEST(ServeOpenai, SeveralChoicesUsageAndLogprobs) {
  openai::ReplyFormat format{
      .id = "chatcmpl-3", .model = "tiny", .n = 2, .logprobs = true, .include_usage = true};
  openai::ChatReply whole(format, fake_tokens());
  const auto a = updates_for("4", 1, gen::FinishReason::kStopToken, false);
  const auto b = updates_for("four", 1, gen::FinishReason::kLength, false);
  whole.collect(1, b[0]);
  for (const auto& u : a) whole.collect(0, u);
  EXPECT_FALSE(whole.done());
  for (size_t i = 1; i < b.size(); ++i) whole.collect(1, b[i]);
  ASSERT_TRUE(whole.done());
  const Json r = whole.response();
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "4");
  EXPECT_EQ(r["choices"][1]["message"]["content"], "four");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 11);
  EXPECT_EQ(r["usage"]["completion_tokens"], 1 + 4);
  EXPECT_EQ(r["usage"]["total_tokens"], 16);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const Json& lp = r["choices"][1]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_EQ(lp[0]["token"], "t0");
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp[0]["bytes"], Json::parse("[116, 48]"));
  EXPECT_EQ(lp[0]["top_logprobs"][0]["token"], "t1");

  openai::ChatReply streamed(format, fake_tokens());
  std::string sse;
  for (const auto& u : a) sse += streamed.stream(0, u);
  for (const auto& u : b) sse += streamed.stream(1, u);
  sse += streamed.stream_end();
  const auto payloads = sse_payloads(sse);
  ASSERT_GE(payloads.size(), 3u);
  EXPECT_EQ(payloads.back(), "[DONE]");
  const Json usage = Json::parse(payloads[payloads.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  size_t n_logprobs = 0;
  for (size_t i = 0; i + 2 < payloads.size(); ++i) {
    const Json c = Json::parse(payloads[i]);
    const Json& lpc = c["choices"][0]["logprobs"];
    if (lpc.is_object()) n_logprobs += lpc["content"].size();
  }
  EXPECT_EQ(n_logprobs, 5u);  // one per generated token
}

TEST(ServeOpenai, CompletionReplies) {
  openai::ReplyFormat format{.id = "cmpl-1", .model = "tiny", .logprobs = true};
  openai::CompletionReply whole(format, fake_tokens());
  gen::SequenceUpdate u1;
  u1.text = "ab";
  u1.logprobs = {{.id = 3, .logprob = -1, .top = {{3, -1}}}, {.id = 4, .logprob = -2}};
  gen::SequenceUpdate u2;
  u2.text = "<think>";  // no parsing: text as generated
  u2.done = true;
  u2.finish = gen::FinishReason::kStopString;
  u2.n_prompt = 3;
  u2.n_generated = 2;
  whole.collect(0, u1);
  whole.collect(0, u2);
  const Json r = whole.response();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "ab<think>");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"], Json::parse(R"(["t3", "t4"])"));
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], Json::parse("[0, 2]"));
  EXPECT_EQ(r["choices"][0]["logprobs"]["top_logprobs"][0]["t3"], -1.0);
  EXPECT_EQ(r["usage"]["completion_tokens"], 2);

  openai::CompletionReply streamed(format, fake_tokens());
  std::string sse = streamed.stream(0, u1);  // one call per statement: in order
  sse += streamed.stream(0, u2);
  sse += streamed.stream_end();
  std::string text;
  for (const auto& p : sse_payloads(sse)) {
    if (p == "[DONE]") continue;
    text += Json::parse(p)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "ab<think>");
}

TEST(ServeHttpHelpers, SseAndKeys) {
  EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event("x", "message_start"), "event: message_start\ndata: x\n\n");
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(constant_time_equal("secret", "secret2"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_EQ(status_reason(413), "Payload Too Large");
  // A token that is half a UTF-8 character still makes valid JSON.
  EXPECT_EQ(dump_json(Json("\xe4\xb8")), "\"\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace qwenrt::serve
