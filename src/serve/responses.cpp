#include "serve/responses.h"

#include <limits>
#include <set>

#include "serve/http.h"

namespace qwenrt::serve::responses {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// A string, or an array of parts of the given text types ({"type", "text"}), joined.
std::string read_text(const Json& value, const std::string& path,
                      std::initializer_list<const char*> types) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array())
    bad_field(path, "expected a string or an array of content parts, got {}",
              json_type_name(value));
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string p = index_path(path, i);
    require_object(value[i], p);
    const std::string type = required_string(value[i], "type", p);
    if (std::none_of(types.begin(), types.end(), [&](const char* t) { return type == t; }))
      bad_field(field_path(p, "type"), "content parts of type '{}' are not supported here", type);
    text += required_string(value[i], type == "refusal" ? "refusal" : "text", p);
  }
  return text;
}

Json read_input(const Json& body) {
  Json messages = Json::array();
  if (auto s = opt_string(body, "instructions"))
    messages.push_back({{"role", "system"}, {"content", *s}});
  const Json& input = required(body, "input", "");
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array())
    bad_field("input", "expected a string or an array of items, got {}", json_type_name(input));
  if (input.empty()) bad_field("input", "must not be empty");
  // Reasoning items belong to the assistant turn that follows them.
  std::string reasoning;
  auto assistant = [&](Json content) -> Json& {
    Json m = {{"role", "assistant"}, {"content", std::move(content)}};
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    reasoning.clear();
    messages.push_back(std::move(m));
    return messages.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string p = index_path("input", i);
    const Json& item = input[i];
    require_object(item, p);
    std::string type = opt_string(item, "type", p).value_or("");
    if (type.empty()) {
      if (!item.contains("role")) bad_field(field_path(p, "type"), "required");
      type = "message";
    }
    if (type == "message") {
      const std::string role = required_string(item, "role", p);
      const std::string cp = field_path(p, "content");
      if (role == "assistant") {
        assistant(read_text(required(item, "content", p), cp, {"output_text", "refusal"}));
      } else if (role == "user" || role == "system" || role == "developer") {
        messages.push_back({{"role", role == "developer" ? "system" : role},
                            {"content", read_text(required(item, "content", p), cp,
                                                  {"input_text", "output_text"})}});
      } else {
        bad_field(field_path(p, "role"),
                  "unknown role '{}' (expected user, system, developer or assistant)", role);
      }
    } else if (type == "function_call") {
      const std::string call_id = required_string(item, "call_id", p);
      const std::string name = required_string(item, "name", p);
      const std::string text = required_string(item, "arguments", p);
      Json arguments;
      try {
        arguments = Json::parse(text);
      } catch (const Json::exception&) {
        bad_field(field_path(p, "arguments"), "not valid JSON");
      }
      if (!arguments.is_object()) bad_field(field_path(p, "arguments"), "expected a JSON object");
      Json call = {{"id", call_id},
                   {"type", "function"},
                   {"function", {{"name", name}, {"arguments", std::move(arguments)}}}};
      // Calls right after an assistant message (or each other) are that turn's calls.
      Json* turn = !messages.empty() && messages.back()["role"] == "assistant" && reasoning.empty()
                       ? &messages.back()
                       : &assistant("");
      (*turn)["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string call_id = required_string(item, "call_id", p);
      const std::string output =
          read_text(required(item, "output", p), field_path(p, "output"), {"input_text"});
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
    } else if (type == "reasoning") {
      // The reasoning's own text when given, its summary otherwise.
      std::string text;
      for (const char* key : {"content", "summary"}) {
        if (!item.contains(key) || item[key].is_null()) continue;
        const std::string kp = field_path(p, key);
        if (!item[key].is_array())
          bad_field(kp, "expected an array, got {}", json_type_name(item[key]));
        text = read_text(item[key], kp,
                         {std::string_view(key) == "content" ? "reasoning_text" : "summary_text"});
        if (!text.empty()) break;
      }
      reasoning += text;
    } else if (type == "item_reference") {
      bad_field(field_path(p, "type"),
                "item_reference is not supported: this server stores nothing between requests");
    } else {
      bad_field(field_path(p, "type"), "input items of type '{}' are not supported", type);
    }
  }
  return messages;
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
    const std::string type = required_string(t, "type", p);
    if (type != "function")
      bad_field(field_path(p, "type"), "only 'function' tools are supported, got '{}'", type);
    const std::string name = required_string(t, "name", p);
    check_tool_name(name, field_path(p, "name"));
    if (!names.insert(name).second) bad_field(field_path(p, "name"), "'{}' is defined twice", name);
    const auto description = opt_string(t, "description", p);
    opt_bool(t, "strict", p);
    Json fn = {{"name", name}};
    if (description) fn["description"] = *description;
    if (t.contains("parameters") && !t["parameters"].is_null()) {
      check_tool_schema(t["parameters"], field_path(p, "parameters"));
      fn["parameters"] = t["parameters"];
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

}  // namespace

openai::ChatRequest parse_request(const Json& body, const ModelInfo& model) {
  openai::ChatRequest r;
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null())
    bad_field("previous_response_id",
              "not supported: this server is stateless (send the whole conversation as input)");
  if (body.contains("conversation") && !body["conversation"].is_null())
    bad_field("conversation", "not supported: this server is stateless");
  opt_bool(body, "store");  // nothing is stored, whatever it says
  opt_string(body, "model");
  auto& g = r.gen;
  g.max_tokens = opt_integer(body, "max_output_tokens", 1, kInt64Max);
  if (auto v = opt_number(body, "temperature", 0, 2))
    g.sampling.temperature = static_cast<float>(*v);
  if (auto v = opt_number(body, "top_p", 0, 1)) {
    if (*v <= 0) bad_field("top_p", "must be greater than 0");
    g.sampling.top_p = static_cast<float>(*v);
  }
  g.stream = opt_bool(body, "stream").value_or(false);
  if (body.contains("metadata") && !body["metadata"].is_null())
    require_object(body["metadata"], "metadata");
  if (body.contains("text") && !body["text"].is_null()) {
    require_object(body["text"], "text");
    if (body["text"].contains("format") && !body["text"]["format"].is_null()) {
      require_object(body["text"]["format"], "text.format");
      const auto type = opt_string(body["text"]["format"], "type", "text.format");
      if (type && *type != "text")
        bad_field("text.format.type", "'{}' is not supported (only 'text')", *type);
    }
  }
  r.turn.messages = read_input(body);
  std::set<std::string> names;
  r.turn.tools = read_tools(body, names);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      const auto& s = tc.get_ref<const std::string&>();
      if (s == "auto")
        r.tool_choice = openai::ToolChoice::kAuto;
      else if (s == "none")
        r.tool_choice = openai::ToolChoice::kNone;
      else if (s == "required")
        r.tool_choice = openai::ToolChoice::kRequired;
      else
        bad_field("tool_choice", "expected 'auto', 'none', 'required' or an object, got '{}'", s);
    } else if (tc.is_object()) {
      const std::string type = required_string(tc, "type", "tool_choice");
      if (type != "function") bad_field("tool_choice.type", "expected 'function', got '{}'", type);
      r.tool_name = required_string(tc, "name", "tool_choice");
      if (!names.count(r.tool_name))
        bad_field("tool_choice.name", "no tool named '{}' in tools", r.tool_name);
      r.tool_choice = openai::ToolChoice::kNamed;
    } else {
      bad_field("tool_choice", "expected a string or an object, got {}", json_type_name(tc));
    }
    if (r.tool_choice == openai::ToolChoice::kRequired && r.turn.tools.is_null())
      bad_field("tool_choice", "'required' needs tools");
  }
  if (r.tool_choice == openai::ToolChoice::kNone) r.turn.tools = nullptr;
  r.parallel_tool_calls = opt_bool(body, "parallel_tool_calls").value_or(true);

  // Thinking follows the model card's default (on) unless reasoning.effort turns it down, as
  // chat completions' reasoning_effort does.
  r.turn.render = chat::RenderOptions{};
  if (body.contains("reasoning") && !body["reasoning"].is_null()) {
    require_object(body["reasoning"], "reasoning");
    opt_string(body["reasoning"], "summary", "reasoning");
    if (auto effort = opt_string(body["reasoning"], "effort", "reasoning")) {
      if (*effort == "none" || *effort == "minimal")
        r.turn.render.enable_thinking = false;
      else if (*effort == "low" || *effort == "medium")
        r.turn.render.reasoning_effort = *effort;
      else if (*effort == "high" || *effort == "xhigh")
        r.turn.render.reasoning_effort = "xhigh";
      else
        bad_field("reasoning.effort",
                  "expected none, minimal, low, medium, high or xhigh, got '{}'", *effort);
    }
  }
  r.turn.render.add_generation_prompt = true;
  (void)model;
  return r;
}

void echo_request(const Json& body, ReplyFormat& f) {
  auto get = [&](const char* key) {
    return body.contains(key) && !body[key].is_null() ? body[key] : Json(nullptr);
  };
  f.instructions = get("instructions");
  f.tools = body.contains("tools") && body["tools"].is_array() ? body["tools"] : Json::array();
  f.tool_choice = body.contains("tool_choice") && !body["tool_choice"].is_null()
                      ? body["tool_choice"]
                      : Json("auto");
  f.temperature = get("temperature");
  f.top_p = get("top_p");
  f.max_output_tokens = get("max_output_tokens");
  f.reasoning = get("reasoning");
  f.parallel_tool_calls = !body.contains("parallel_tool_calls") ||
                          !body["parallel_tool_calls"].is_boolean() ||
                          body["parallel_tool_calls"].get<bool>();
}

ResponseReply::ResponseReply(ReplyFormat format, openai::TokenText token_text)
    : format_(std::move(format)), token_text_(std::move(token_text)) {
  usage_.prompt = format_.n_prompt;
  in_reasoning_ = format_.thinking;
}

std::string ResponseReply::finish_reasons() const {
  if (!done_) return "?";
  return last_.finish == gen::FinishReason::kLength ? "incomplete" : "completed";
}

Json ResponseReply::usage_json() const {
  return {{"input_tokens", usage_.prompt},
          {"input_tokens_details", {{"cached_tokens", usage_.cached}, {"cache_write_tokens", 0}}},
          {"output_tokens", usage_.completion},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
          {"total_tokens", usage_.prompt + usage_.completion}};
}

Json ResponseReply::snapshot(const std::string& status, const Json& output) const {
  Json r = {{"id", format_.id},
            {"object", "response"},
            {"created_at", format_.created},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", format_.instructions},
            {"max_output_tokens", format_.max_output_tokens},
            {"model", format_.model},
            {"output", output},
            {"parallel_tool_calls", format_.parallel_tool_calls},
            {"previous_response_id", nullptr},
            {"reasoning", format_.reasoning},
            {"store", false},
            {"temperature", format_.temperature},
            {"text", {{"format", {{"type", "text"}}}}},
            {"tool_choice", format_.tool_choice},
            {"tools", format_.tools},
            {"top_p", format_.top_p},
            {"truncation", "disabled"},
            {"usage", nullptr},
            {"metadata", Json::object()}};
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (status != "in_progress") r["usage"] = usage_json();
  return r;
}

void ResponseReply::count(const gen::SequenceUpdate& u) {
  // Tokens of updates that gave reasoning only, from a reply that started in the think block.
  if (in_reasoning_) {
    reasoning_tokens_ += static_cast<int64_t>(u.tokens.size());
    for (const auto& e : u.events)
      if (e.kind != chat::ReplyEvent::Kind::kReasoning) in_reasoning_ = false;
  }
  if (!u.done) return;
  done_ = true;
  last_ = u;
  usage_.prompt = u.n_prompt;
  usage_.cached = u.n_cached;
  usage_.completion = u.n_generated;
  reasoning_tokens_ = std::min(reasoning_tokens_, u.n_generated);
  if (u.finish == gen::FinishReason::kError)
    error_ = u.error.empty() ? "generation failed" : u.error;
}

std::string ResponseReply::emit(const std::string& type, Json fields) {
  Json e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [k, v] : fields.items()) e[k] = v;
  return sse_event(dump_json(e), type);
}

std::string ResponseReply::open_item(Item kind, const chat::ReplyEvent* call) {
  std::string out = close_item();
  item_ = kind;
  const size_t index = streamed_.size();
  Json part;
  switch (kind) {
    case Item::kReasoning:
      open_ = {{"id", random_id("rs_")},
               {"type", "reasoning"},
               {"summary", Json::array()},
               {"content", Json::array()},
               {"status", "in_progress"}};
      part = {{"type", "reasoning_text"}, {"text", ""}};
      break;
    case Item::kMessage:
      open_ = {{"id", random_id("msg_")},
               {"type", "message"},
               {"role", "assistant"},
               {"status", "in_progress"},
               {"content", Json::array()}};
      part = {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}};
      break;
    case Item::kCall:
      open_ = {
          {"id", random_id("fc_")},  {"type", "function_call"}, {"call_id", random_id("call_")},
          {"name", call->call.name}, {"arguments", ""},         {"status", "in_progress"}};
      break;
    case Item::kNone:
      return out;
  }
  out += emit("response.output_item.added", {{"output_index", index}, {"item", open_}});
  if (!part.is_null()) {
    out += emit(
        "response.content_part.added",
        {{"item_id", open_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    open_["content"].push_back(std::move(part));
  }
  return out;
}

std::string ResponseReply::close_item() {
  if (item_ == Item::kNone) return {};
  std::string out;
  const size_t index = streamed_.size();
  const Json id = open_["id"];
  // A reply cut off by max_output_tokens leaves its last item incomplete.
  const bool cut = done_ && last_.finish == gen::FinishReason::kLength;
  open_["status"] = cut ? "incomplete" : "completed";
  if (item_ == Item::kCall) {
    out += emit("response.function_call_arguments.done",
                {{"item_id", id}, {"output_index", index}, {"arguments", open_["arguments"]}});
  } else {
    const Json& part = open_["content"][0];
    const bool reasoning = item_ == Item::kReasoning;
    Json done = {
        {"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", part["text"]}};
    if (!reasoning) done["logprobs"] = Json::array();
    out += emit(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                std::move(done));
    out += emit("response.content_part.done",
                {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  }
  out += emit("response.output_item.done", {{"output_index", index}, {"item", open_}});
  streamed_.push_back(std::move(open_));
  open_ = nullptr;
  item_ = Item::kNone;
  return out;
}

std::string ResponseReply::stream(int, const gen::SequenceUpdate& u) {
  if (done_) return {};
  std::string out;
  if (!started_) {
    started_ = true;
    out += emit("response.created", {{"response", snapshot("in_progress", Json::array())}});
    out += emit("response.in_progress", {{"response", snapshot("in_progress", Json::array())}});
  }
  count(u);  // first: an item the done update closes knows the reply's end
  auto text_delta = [&](const char* type, const std::string& text) {
    Json& part = open_["content"][0];
    part["text"] = part["text"].get<std::string>() + text;
    Json d = {{"item_id", open_["id"]},
              {"output_index", streamed_.size()},
              {"content_index", 0},
              {"delta", text}};
    if (item_ == Item::kMessage) d["logprobs"] = Json::array();
    out += emit(type, std::move(d));
  };
  for (const auto& e : events_.next(u.events)) {
    using K = chat::ReplyEvent::Kind;
    // Only the first call is written when parallel calls are off (as in response()).
    const bool dropped = e.tool_index > 0 && !format_.parallel_tool_calls;
    switch (e.kind) {
      case K::kReasoning:
        if (item_ != Item::kReasoning) out += open_item(Item::kReasoning, nullptr);
        text_delta("response.reasoning_text.delta", e.text);
        break;
      case K::kContent:
        if (item_ != Item::kMessage) out += open_item(Item::kMessage, nullptr);
        text_delta("response.output_text.delta", e.text);
        break;
      case K::kToolCallBegin:
        if (!dropped) out += open_item(Item::kCall, &e);
        break;
      case K::kToolCallArgs:
        if (dropped) break;
        open_["arguments"] = open_["arguments"].get<std::string>() + e.text;
        out +=
            emit("response.function_call_arguments.delta",
                 {{"item_id", open_["id"]}, {"output_index", streamed_.size()}, {"delta", e.text}});
        break;
      case K::kToolCall:
        if (!dropped) out += close_item();
        break;
    }
  }
  if (u.done) {
    if (u.finish == gen::FinishReason::kError)
      out += stream_error(500, error_);
    else
      out += close_item();
  }
  return out;
}

std::string ResponseReply::stream_error(int status, const std::string& message) {
  failed_ = true;
  return emit("error", {{"code", status >= 500 ? "server_error" : "invalid_request"},
                        {"message", message},
                        {"param", nullptr}});
}

std::string ResponseReply::stream_end() {
  if (failed_) return {};
  const bool cut = last_.finish == gen::FinishReason::kLength;
  const std::string status = cut ? "incomplete" : "completed";
  return emit(cut ? "response.incomplete" : "response.completed",
              {{"response", snapshot(status, streamed_)}});
}

void ResponseReply::collect(int, const gen::SequenceUpdate& u) {
  if (done_) return;
  count(u);
}

Json ResponseReply::response() const {
  const auto& reply = last_.reply;
  Json output = Json::array();
  if (!reply.reasoning.empty())
    output.push_back(
        {{"id", random_id("rs_")},
         {"type", "reasoning"},
         {"summary", Json::array()},
         {"content", Json::array({{{"type", "reasoning_text"}, {"text", reply.reasoning}}})},
         {"status", "completed"}});
  if (!reply.content.empty() || reply.tool_calls.empty())
    output.push_back({{"id", random_id("msg_")},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"status", "completed"},
                      {"content", Json::array({{{"type", "output_text"},
                                                {"text", reply.content},
                                                {"annotations", Json::array()}}})}});
  for (size_t k = 0; k < reply.tool_calls.size(); ++k) {
    if (!format_.parallel_tool_calls && k > 0) break;
    const auto& call = reply.tool_calls[k];
    output.push_back({{"id", random_id("fc_")},
                      {"type", "function_call"},
                      {"call_id", random_id("call_")},
                      {"name", call.name},
                      {"arguments", dump_json(call.arguments)},
                      {"status", "completed"}});
  }
  const bool cut = last_.finish == gen::FinishReason::kLength;
  if (cut && !output.empty()) output.back()["status"] = "incomplete";
  return snapshot(cut ? "incomplete" : "completed", output);
}

}  // namespace qwenrt::serve::responses
