// libFuzzer target for the server's request readers (src/serve): any body either becomes a
// request or an ApiError (400 naming a field); nothing else may escape, and an accepted chat
// request must turn into sequences. The same bytes, read as a generated reply, go through the
// streamed and the whole OpenAI reply: the streamed tool-call argument fragments must concatenate
// to the whole reply's arguments. The Anthropic and Responses readers get the same bodies, and the
// streamed Anthropic reply's input_json_delta fragments must concatenate to the whole reply's tool
// inputs. Build with -DQWENRT_FUZZ=ON (clang); see fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chat/parse.h"
#include "serve/anthropic.h"
#include "serve/fields.h"
#include "serve/openai.h"
#include "serve/responses.h"

namespace {

using qwenrt::serve::ApiError;
using qwenrt::serve::Json;
namespace openai = qwenrt::serve::openai;

qwenrt::serve::ModelInfo model() {
  qwenrt::serve::ModelInfo m;
  m.name = "fuzz";
  m.n_ctx = 4096;
  m.n_vocab = 3072;
  return m;
}

void read_requests(std::string_view body) {
  Json json;
  try {
    json = qwenrt::serve::parse_json_body(body);
  } catch (const ApiError& e) {
    if (e.status() != 400 || std::string(e.what()).empty()) std::abort();
    return;
  }
  try {
    const auto r = openai::parse_chat_request(json, model());
    if (r.turn.messages.empty() || r.gen.n < 1) std::abort();
    qwenrt::gen::PreparedTurn turn;
    turn.prompt = {1, 2, 3};
    for (int i = 0; i < r.gen.n; ++i) {
      const auto p = openai::chat_sequence(r, turn, model(), i);
      if (p.max_tokens < 1 || p.max_tokens > 4096) std::abort();
    }
  } catch (const ApiError& e) {
    if (e.status() != 400 || std::string(e.what()).empty()) std::abort();
  }
  // The other dialects read into the same chat request: never empty messages, a sequence that fits.
  for (int dialect = 0; dialect < 3; ++dialect) {
    try {
      const auto r = dialect == 0 ? qwenrt::serve::anthropic::parse_messages_request(json, model())
                     : dialect == 1
                         ? qwenrt::serve::anthropic::parse_count_tokens_request(json, model())
                         : qwenrt::serve::responses::parse_request(json, model());
      if (r.turn.messages.empty()) std::abort();
      qwenrt::gen::PreparedTurn turn;
      turn.prompt = {1, 2, 3};
      const auto p = openai::chat_sequence(r, turn, model(), 0);
      if (p.max_tokens < 1 || p.max_tokens > 4096) std::abort();
    } catch (const ApiError& e) {
      if (e.status() != 400 || std::string(e.what()).empty()) std::abort();
    }
  }
  try {
    const auto r = openai::parse_completion_request(json, model());
    if (!r.prompt_text && r.prompt_ids.empty()) std::abort();
  } catch (const ApiError& e) {
    if (e.status() != 400 || std::string(e.what()).empty()) std::abort();
  }
}

// Streamed tool-call arguments, concatenated per call index, from the SSE text.
void collect_arguments(const std::string& sse, std::vector<std::string>& args) {
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (payload == "[DONE]") continue;
    const Json chunk = Json::parse(payload);
    for (const auto& c : chunk["choices"]) {
      if (!c["delta"].contains("tool_calls")) continue;
      for (const auto& tc : c["delta"]["tool_calls"]) {
        const size_t k = tc["index"];
        if (args.size() <= k) args.resize(k + 1);
        args[k] += tc["function"]["arguments"].get<std::string>();
      }
    }
  }
}

void replay_reply(std::string_view text, size_t chunk) {
  const openai::ReplyFormat format{.id = "chatcmpl-fuzz", .model = "fuzz"};
  auto token_text = [](int32_t id) { return std::to_string(id); };
  openai::ChatReply whole(format, token_text), streamed(format, token_text);
  qwenrt::chat::ReplyParser parser({.starts_in_reasoning = (chunk & 1) != 0, .tools = nullptr});
  std::string sse;
  for (size_t i = 0; i < text.size(); i += chunk) {
    qwenrt::gen::SequenceUpdate u;
    u.text = std::string(text.substr(i, chunk));
    u.events = parser.feed(u.text);
    whole.collect(0, u);
    sse += streamed.stream(0, u);
  }
  qwenrt::gen::SequenceUpdate last;
  last.events = parser.finish();
  last.done = true;
  last.finish = qwenrt::gen::FinishReason::kLength;
  last.reply = parser.result();
  whole.collect(0, last);
  sse += streamed.stream(0, last);
  if (!whole.done() || !streamed.done()) std::abort();
  const Json response = whole.response();
  std::vector<std::string> args;
  collect_arguments(sse, args);
  const Json& message = response["choices"][0]["message"];
  const size_t n_calls = message.contains("tool_calls") ? message["tool_calls"].size() : 0;
  if (args.size() != n_calls) std::abort();
  for (size_t k = 0; k < n_calls; ++k)
    if (args[k] != message["tool_calls"][k]["function"]["arguments"].get<std::string>())
      std::abort();
}

// The Anthropic reply: each tool_use block's input_json_delta fragments, joined, are its input's
// JSON in the whole reply (blocks in the same order).
void replay_anthropic(std::string_view text, size_t chunk) {
  namespace anthropic = qwenrt::serve::anthropic;
  const anthropic::ReplyFormat format{.id = "msg_fuzz", .model = "fuzz"};
  auto token_text = [](int32_t id) { return std::to_string(id); };
  anthropic::MessageReply whole(format, token_text), streamed(format, token_text);
  qwenrt::chat::ReplyParser parser({.starts_in_reasoning = (chunk & 1) != 0, .tools = nullptr});
  std::string sse;
  for (size_t i = 0; i < text.size(); i += chunk) {
    qwenrt::gen::SequenceUpdate u;
    u.text = std::string(text.substr(i, chunk));
    u.events = parser.feed(u.text);
    whole.collect(0, u);
    sse += streamed.stream(0, u);
  }
  qwenrt::gen::SequenceUpdate last;
  last.events = parser.finish();
  last.done = true;
  last.finish = qwenrt::gen::FinishReason::kLength;
  last.reply = parser.result();
  whole.collect(0, last);
  sse += streamed.stream(0, last);
  sse += streamed.stream_end();  // after: the done update decides it
  std::vector<std::string> inputs;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const Json event = Json::parse(sse.substr(pos + 6, end - pos - 6));
    pos = end + 2;
    if (event["type"] == "content_block_start" && event["content_block"]["type"] == "tool_use")
      inputs.emplace_back();
    if (event["type"] == "content_block_delta" && event["delta"]["type"] == "input_json_delta")
      inputs.back() += event["delta"]["partial_json"].get<std::string>();
  }
  std::vector<std::string> expected;
  const Json response = whole.response();  // a named copy: the loop must not outlive it
  for (const auto& block : response["content"])
    if (block["type"] == "tool_use") expected.push_back(qwenrt::serve::dump_json(block["input"]));
  if (inputs != expected) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  read_requests(input);
  if (size > 0) replay_reply(input.substr(1), 1 + data[0] % 16);
  if (size > 0) replay_anthropic(input.substr(1), 1 + data[0] % 16);
  return 0;
}
