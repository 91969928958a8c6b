#include "serve/anthropic.h"

#include <algorithm>
#include <limits>
#include <set>

#include "serve/http.h"

namespace qwenrt::serve::anthropic {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string block_type(const Json& block, const std::string& path) {
  require_object(block, path);
  return required_string(block, "type", path);
}

// Text blocks only ({"type": "text", "text"}), as system and tool_result content carry them;
// their texts joined by newlines.
std::string read_text_blocks(const Json& value, const std::string& path) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array())
    bad_field(path, "expected a string or an array of text blocks, got {}", json_type_name(value));
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string p = index_path(path, i);
    const std::string type = block_type(value[i], p);
    if (type != "text")
      bad_field(field_path(p, "type"), "blocks of type '{}' are not supported here (text only)",
                type);
    if (i > 0) text += "\n";
    text += required_string(value[i], "text", p);
  }
  return text;
}

// One Anthropic message as OpenAI-style messages (chat/render.h): a user message's tool_result
// blocks become tool messages (before its text), an assistant message's thinking, text and tool_use
// blocks become reasoning_content, content and tool_calls.
void read_message(const Json& m, const std::string& path, Json& out) {
  require_object(m, path);
  const std::string role = required_string(m, "role", path);
  if (role != "user" && role != "assistant")
    bad_field(field_path(path, "role"),
              "unknown role '{}' (expected user or assistant; system is a top-level field)", role);
  const std::string cp = field_path(path, "content");
  const Json& content = required(m, "content", path);
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array())
    bad_field(cp, "expected a string or an array of content blocks, got {}",
              json_type_name(content));
  std::string text, thinking;
  Json calls = Json::array();
  bool had_results = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bp = index_path(cp, i);
    const Json& b = content[i];
    const std::string type = block_type(b, bp);
    if (type == "text") {
      text += required_string(b, "text", bp);
    } else if (type == "thinking" && role == "assistant") {
      thinking += required_string(b, "thinking", bp);
      opt_string(b, "signature", bp);
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Encrypted by another server: nothing to render.
    } else if (type == "tool_use" && role == "assistant") {
      const std::string id = required_string(b, "id", bp);
      const std::string name = required_string(b, "name", bp);
      const Json& input = required(b, "input", bp);
      require_object(input, field_path(bp, "input"));
      calls.push_back(
          {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", input}}}});
    } else if (type == "tool_result" && role == "user") {
      const std::string id = required_string(b, "tool_use_id", bp);
      std::string result;
      if (b.contains("content") && !b["content"].is_null())
        result = read_text_blocks(b["content"], field_path(bp, "content"));
      // The template has no error flag: the model reads it in the result's text.
      if (opt_bool(b, "is_error", bp).value_or(false)) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
      had_results = true;
    } else {
      bad_field(field_path(bp, "type"), "blocks of type '{}' are not supported in {} messages",
                type, role);
    }
  }
  if (role == "user") {
    // A message of tool results only adds no user turn; otherwise its text follows the results.
    if (!had_results || !text.empty()) out.push_back({{"role", "user"}, {"content", text}});
    return;
  }
  Json msg = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out.push_back(std::move(msg));
}

Json read_tools(const Json& body, std::set<std::string>& names) {
  if (!body.contains("tools") || body["tools"].is_null()) return nullptr;
  const Json& tools = body["tools"];
  if (!tools.is_array()) bad_field("tools", "expected an array, got {}", json_type_name(tools));
  if (tools.empty()) return nullptr;
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = index_path("tools", i);
    const Json& t = tools[i];
    require_object(t, p);
    // Server tools (web_search_..., bash_..., text_editor_...) run at Anthropic: not here.
    if (auto type = opt_string(t, "type", p); type && *type != "custom")
      bad_field(field_path(p, "type"), "only custom tools are supported, got '{}'", *type);
    const std::string name = required_string(t, "name", p);
    check_tool_name(name, field_path(p, "name"));
    if (!names.insert(name).second) bad_field(field_path(p, "name"), "'{}' is defined twice", name);
    const auto description = opt_string(t, "description", p);
    const Json& schema = required(t, "input_schema", p);
    check_tool_schema(schema, field_path(p, "input_schema"));
    Json fn = {{"name", name}};
    if (description) fn["description"] = *description;
    fn["parameters"] = schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

openai::ChatRequest parse(const Json& body, const ModelInfo& model, bool count_tokens) {
  openai::ChatRequest r;
  auto& g = r.gen;
  required_string(body, "model", "");  // any name: one model is served
  if (!count_tokens) {
    required(body, "max_tokens", "");
    g.max_tokens = opt_integer(body, "max_tokens", 1, kInt64Max);
    if (auto v = opt_number(body, "temperature", 0, 1))
      g.sampling.temperature = static_cast<float>(*v);
    if (auto v = opt_number(body, "top_p", 0, 1)) {
      if (*v <= 0) bad_field("top_p", "must be greater than 0");
      g.sampling.top_p = static_cast<float>(*v);
    }
    if (auto v = opt_integer(body, "top_k", 0, model.n_vocab > 0 ? model.n_vocab : kInt64Max))
      g.sampling.top_k = static_cast<int>(*v);
    if (body.contains("stop_sequences"))
      g.stop = read_stop(body["stop_sequences"], "stop_sequences");
    g.stream = opt_bool(body, "stream").value_or(false);
    if (body.contains("metadata") && !body["metadata"].is_null())
      require_object(body["metadata"], "metadata");  // user_id: nothing to do with it here
  }

  Json messages = Json::array();
  if (body.contains("system") && !body["system"].is_null())
    messages.push_back(
        {{"role", "system"}, {"content", read_text_blocks(body["system"], "system")}});
  const Json& in = required(body, "messages", "");
  if (!in.is_array()) bad_field("messages", "expected an array, got {}", json_type_name(in));
  if (in.empty()) bad_field("messages", "must not be empty");
  for (size_t i = 0; i < in.size(); ++i) read_message(in[i], index_path("messages", i), messages);
  r.turn.messages = std::move(messages);

  std::set<std::string> names;
  r.turn.tools = read_tools(body, names);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    require_object(tc, "tool_choice");
    const std::string type = required_string(tc, "type", "tool_choice");
    if (type == "auto") {
      r.tool_choice = openai::ToolChoice::kAuto;
    } else if (type == "none") {
      r.tool_choice = openai::ToolChoice::kNone;
    } else if (type == "any") {
      r.tool_choice = openai::ToolChoice::kRequired;
    } else if (type == "tool") {
      r.tool_name = required_string(tc, "name", "tool_choice");
      if (!names.count(r.tool_name))
        bad_field("tool_choice.name", "no tool named '{}' in tools", r.tool_name);
      r.tool_choice = openai::ToolChoice::kNamed;
    } else {
      bad_field("tool_choice.type", "expected auto, any, tool or none, got '{}'", type);
    }
    if ((type == "any" || type == "tool") && r.turn.tools.is_null())
      bad_field("tool_choice", "'{}' needs tools", type);
    r.parallel_tool_calls =
        !opt_bool(tc, "disable_parallel_tool_use", "tool_choice").value_or(false);
  }
  if (r.tool_choice == openai::ToolChoice::kNone) r.turn.tools = nullptr;

  // Thinking is off unless asked for: a client that sends no `thinking` asked for no extended
  // thinking and sized max_tokens for the answer alone (see README: the thinking default).
  r.turn.render = chat::RenderOptions{};
  r.turn.render.enable_thinking = false;
  if (body.contains("thinking") && !body["thinking"].is_null()) {
    const Json& t = body["thinking"];
    require_object(t, "thinking");
    const std::string type = required_string(t, "type", "thinking");
    if (type == "enabled") {
      r.turn.render.enable_thinking = true;
      required(t, "budget_tokens", "thinking");
      r.thinking_budget = static_cast<int>(*opt_integer(
          t, "budget_tokens", 1, model.n_ctx > 0 ? model.n_ctx : kInt64Max, "thinking"));
    } else if (type == "adaptive") {
      r.turn.render.enable_thinking = true;  // the model decides how long: no budget
    } else if (type != "disabled") {
      bad_field("thinking.type", "expected enabled, adaptive or disabled, got '{}'", type);
    }
  }
  r.turn.render.add_generation_prompt = true;
  return r;
}

std::string event(const char* name, const Json& data) {
  return sse_event(dump_json(data), name);
}

}  // namespace

openai::ChatRequest parse_messages_request(const Json& body, const ModelInfo& model) {
  return parse(body, model, false);
}

openai::ChatRequest parse_count_tokens_request(const Json& body, const ModelInfo& model) {
  return parse(body, model, true);
}

std::string error_type(int status) {
  switch (status) {
    case 400:
    case 405:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    case 504:
      return "timeout_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

Json error_json(int status, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", error_type(status)}, {"message", message}}}};
}

std::string stop_reason(gen::FinishReason reason, bool made_tool_calls) {
  if (reason == gen::FinishReason::kLength) return "max_tokens";
  if (made_tool_calls) return "tool_use";
  if (reason == gen::FinishReason::kStopString) return "stop_sequence";
  return "end_turn";
}

MessageReply::MessageReply(ReplyFormat format, openai::TokenText token_text)
    : format_(std::move(format)), token_text_(std::move(token_text)) {
  usage_.prompt = format_.n_prompt;
}

Json MessageReply::error_body(int status, const std::string& message) const {
  return error_json(status, message);
}

std::string MessageReply::stream_error(int status, const std::string& message) {
  failed_ = true;
  return event("error", error_json(status, message));
}

void MessageReply::finish(const gen::SequenceUpdate& u) {
  done_ = true;
  last_ = u;
  usage_.prompt = u.n_prompt;
  usage_.cached = u.n_cached;
  usage_.completion = u.n_generated;
  if (u.finish == gen::FinishReason::kError)
    error_ = u.error.empty() ? "generation failed" : u.error;
  stop_reason_ = stop_reason(u.finish, !u.reply.tool_calls.empty());
  if (*stop_reason_ == "stop_sequence") {
    // The scheduler does not say which stop string ended the text: the earliest one found in the
    // generated tokens' text is the one that did.
    std::string text;
    for (int32_t id : tokens_) text += token_text_(id);
    size_t best = std::string::npos;
    for (const auto& s : format_.stop) {
      const size_t at = text.find(s);
      if (at < best) {
        best = at;
        stop_sequence_ = s;
      }
    }
    // Only an internal stop (one tool call, "</tool_call>") matched: the turn simply ended.
    if (stop_sequence_.is_null()) stop_reason_ = "end_turn";
  }
}

std::string MessageReply::open_block(Block kind, Json content_block) {
  block_ = kind;
  ++index_;
  return event("content_block_start", {{"type", "content_block_start"},
                                       {"index", index_},
                                       {"content_block", std::move(content_block)}});
}

std::string MessageReply::close_block() {
  if (block_ == Block::kNone) return {};
  block_ = Block::kNone;
  return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string MessageReply::stream(int, const gen::SequenceUpdate& u) {
  if (done_) return {};
  std::string out;
  if (!started_) {
    started_ = true;
    Json usage = {{"input_tokens", format_.n_prompt},
                  {"output_tokens", 0},
                  {"cache_creation_input_tokens", 0},
                  {"cache_read_input_tokens", 0}};
    out += event("message_start", {{"type", "message_start"},
                                   {"message",
                                    {{"id", format_.id},
                                     {"type", "message"},
                                     {"role", "assistant"},
                                     {"model", format_.model},
                                     {"content", Json::array()},
                                     {"stop_reason", nullptr},
                                     {"stop_sequence", nullptr},
                                     {"usage", usage}}}});
  }
  tokens_.insert(tokens_.end(), u.tokens.begin(), u.tokens.end());
  auto delta = [&](Json d) {
    out += event("content_block_delta",
                 {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  };
  for (const auto& e : events_.next(u.events)) {
    using K = chat::ReplyEvent::Kind;
    switch (e.kind) {
      case K::kReasoning:
        if (block_ != Block::kThinking) {
          out += close_block();
          out += open_block(Block::kThinking,
                            {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
        }
        delta({{"type", "thinking_delta"}, {"thinking", e.text}});
        break;
      case K::kContent:
        if (block_ != Block::kText) {
          out += close_block();
          out += open_block(Block::kText, {{"type", "text"}, {"text", ""}});
        }
        delta({{"type", "text_delta"}, {"text", e.text}});
        break;
      case K::kToolCallBegin:
        out += close_block();
        out += open_block(Block::kToolUse, {{"type", "tool_use"},
                                            {"id", random_id("toolu_")},
                                            {"name", e.call.name},
                                            {"input", Json::object()}});
        break;
      case K::kToolCallArgs:
        delta({{"type", "input_json_delta"}, {"partial_json", e.text}});
        break;
      case K::kToolCall:
        out += close_block();
        break;
    }
  }
  if (u.done) {
    finish(u);
    if (u.finish == gen::FinishReason::kError)
      out += stream_error(500, error_);
    else
      out += close_block();
  }
  return out;
}

std::string MessageReply::stream_end() const {
  if (failed_) return {};
  std::string out = event(
      "message_delta",
      {{"type", "message_delta"},
       {"delta",
        {{"stop_reason", stop_reason_.value_or("end_turn")}, {"stop_sequence", stop_sequence_}}},
       // Anthropic counts cache reads apart: input_tokens are the prompt tokens prefilled.
       {"usage",
        {{"input_tokens", usage_.prompt - usage_.cached},
         {"output_tokens", usage_.completion},
         {"cache_creation_input_tokens", 0},
         {"cache_read_input_tokens", usage_.cached}}}});
  out += event("message_stop", {{"type", "message_stop"}});
  return out;
}

void MessageReply::collect(int, const gen::SequenceUpdate& u) {
  if (done_) return;
  tokens_.insert(tokens_.end(), u.tokens.begin(), u.tokens.end());
  if (u.done) finish(u);
}

Json MessageReply::response() const {
  const auto& reply = last_.reply;
  Json content = Json::array();
  if (!reply.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", reply.reasoning}, {"signature", ""}});
  if (!reply.content.empty() || (reply.reasoning.empty() && reply.tool_calls.empty()))
    content.push_back({{"type", "text"}, {"text", reply.content}});
  for (const auto& call : reply.tool_calls)
    content.push_back({{"type", "tool_use"},
                       {"id", random_id("toolu_")},
                       {"name", call.name},
                       {"input", call.arguments}});
  return {{"id", format_.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", format_.model},
          {"content", std::move(content)},
          {"stop_reason", stop_reason_.value_or("end_turn")},
          {"stop_sequence", stop_sequence_},
          {"usage",
           {{"input_tokens", usage_.prompt - usage_.cached},
            {"output_tokens", usage_.completion},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", usage_.cached}}}};
}

}  // namespace qwenrt::serve::anthropic
