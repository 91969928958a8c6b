#include "serve/openai.h"

#include <algorithm>
#include <limits>
#include <set>

#include "ops/types.h"
#include "serve/http.h"

namespace qwenrt::serve::openai {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int kMaxChoices = 16;

// Tool names are written into the prompt as <function=NAME>: keep to OpenAI's alphabet.
bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

void require_object(const Json& v, const std::string& path) {
  if (!v.is_object()) bad_field(path, "expected an object, got {}", json_type_name(v));
}

// Sampling settings and the limits both endpoints read.
Generation read_generation(const Json& body, const ModelInfo& model, bool chat) {
  Generation g;
  auto& s = g.sampling;
  if (auto v = opt_number(body, "temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = opt_number(body, "top_p", 0, 1)) {
    if (*v <= 0) bad_field("top_p", "must be greater than 0");
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = opt_integer(body, "top_k", -1, model.n_vocab > 0 ? model.n_vocab : kInt64Max))
    s.top_k = static_cast<int>(std::max<int64_t>(*v, 0));  // -1 (vLLM's "off") is 0 here
  if (auto v = opt_number(body, "min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = opt_number(body, "presence_penalty", -2, 2))
    s.presence_penalty = static_cast<float>(*v);
  if (auto v = opt_number(body, "frequency_penalty", -2, 2))
    s.frequency_penalty = static_cast<float>(*v);
  if (auto v = opt_number(body, "repetition_penalty", 0, 10)) {
    if (*v <= 0) bad_field("repetition_penalty", "must be greater than 0");
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = opt_integer(body, "seed", kInt64Min, kInt64Max)) s.seed = static_cast<uint64_t>(*v);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const Json& bias = body["logit_bias"];
    require_object(bias, "logit_bias");
    for (const auto& [key, value] : bias.items()) {
      const std::string p = "logit_bias." + key;
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || (model.n_vocab > 0 && id >= model.n_vocab))
        bad_field(p, "expected a token id in [0, {})", model.n_vocab);
      if (!value.is_number()) bad_field(p, "expected a number, got {}", json_type_name(value));
      const double b = value.get<double>();
      if (!std::isfinite(b) || b < -100 || b > 100) bad_field(p, "out of range [-100, 100]");
      s.logit_bias[static_cast<int32_t>(id)] = static_cast<float>(b);
    }
  }
  // max_completion_tokens is the newer name; it wins when both are given.
  g.max_tokens = opt_integer(body, "max_tokens", 1, kInt64Max);
  if (auto v = opt_integer(body, "max_completion_tokens", 1, kInt64Max)) g.max_tokens = v;
  if (body.contains("stop")) g.stop = read_stop(body["stop"], "stop");
  if (auto v = opt_integer(body, "n", 1, kMaxChoices)) g.n = static_cast<int>(*v);
  if (auto v = opt_integer(body, "best_of", 1, kMaxChoices); v && *v != g.n)
    bad_field("best_of", "only best_of == n is supported");
  g.stream = opt_bool(body, "stream").value_or(false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    require_object(body["stream_options"], "stream_options");
    g.include_usage =
        opt_bool(body["stream_options"], "include_usage", "stream_options").value_or(false);
  }
  if (chat) {
    const bool logprobs = opt_bool(body, "logprobs").value_or(false);
    const auto top = opt_integer(body, "top_logprobs", 0, ops::kMaxTopLogprobs);
    if (top && !logprobs) bad_field("top_logprobs", "needs logprobs: true");
    if (logprobs) g.top_logprobs = static_cast<int>(top.value_or(0));
  } else {
    // The legacy endpoint's logprobs is the number of alternatives (OpenAI allows up to 5).
    if (auto v = opt_integer(body, "logprobs", 0, ops::kMaxTopLogprobs))
      g.top_logprobs = static_cast<int>(*v);
  }
  opt_string(body, "model");  // any name: one model is served; only its type is checked
  return g;
}

// A message's content: a string, or an array of text parts (normalised to
// {"type": "text", "text": ...}); null only where `nullable`.
Json read_content(const Json& message, const std::string& path, bool nullable) {
  const std::string p = field_path(path, "content");
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    if (!nullable) bad_field(p, "required for this role");
    return nullptr;
  }
  if (it->is_string()) return *it;
  if (!it->is_array())
    bad_field(p, "expected a string or an array of content parts, got {}", json_type_name(*it));
  Json parts = Json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& part = (*it)[i];
    const std::string pp = index_path(p, i);
    require_object(part, pp);
    const auto type = opt_string(part, "type", pp);
    if (!type) bad_field(field_path(pp, "type"), "required");
    if (*type != "text")
      bad_field(field_path(pp, "type"), "content parts of type '{}' are not supported (text only)",
                *type);
    const auto text = opt_string(part, "text", pp);
    if (!text) bad_field(field_path(pp, "text"), "required");
    parts.push_back({{"type", "text"}, {"text", *text}});
  }
  return parts;
}

Json read_tool_calls(const Json& calls, const std::string& path) {
  if (!calls.is_array()) bad_field(path, "expected an array, got {}", json_type_name(calls));
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string p = index_path(path, i);
    const Json& call = calls[i];
    require_object(call, p);
    if (auto type = opt_string(call, "type", p); type && *type != "function")
      bad_field(field_path(p, "type"), "expected 'function', got '{}'", *type);
    const auto id = opt_string(call, "id", p);
    const std::string fp = field_path(p, "function");
    if (!call.contains("function")) bad_field(fp, "required");
    const Json& fn = call["function"];
    require_object(fn, fp);
    const auto name = opt_string(fn, "name", fp);
    if (!name || name->empty()) bad_field(field_path(fp, "name"), "required");
    Json arguments = Json::object();
    const std::string ap = field_path(fp, "arguments");
    if (fn.contains("arguments") && !fn["arguments"].is_null()) {
      const Json& a = fn["arguments"];
      if (a.is_string()) {
        try {
          arguments = Json::parse(a.get_ref<const std::string&>());
        } catch (const Json::parse_error&) {
          bad_field(ap, "not valid JSON");
        }
      } else {
        arguments = a;
      }
      if (!arguments.is_object()) bad_field(ap, "expected a JSON object");
    }
    Json c = {{"type", "function"}, {"function", {{"name", *name}, {"arguments", arguments}}}};
    if (id) c["id"] = *id;
    out.push_back(std::move(c));
  }
  return out;
}

Json read_messages(const Json& body) {
  if (!body.contains("messages")) bad_field("messages", "required");
  const Json& messages = body["messages"];
  if (!messages.is_array())
    bad_field("messages", "expected an array, got {}", json_type_name(messages));
  if (messages.empty()) bad_field("messages", "must not be empty");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string p = index_path("messages", i);
    const Json& m = messages[i];
    require_object(m, p);
    const auto role = opt_string(m, "role", p);
    if (!role) bad_field(field_path(p, "role"), "required");
    Json msg = Json::object();
    if (*role == "system" || *role == "developer" || *role == "user") {
      msg["role"] = *role == "developer" ? "system" : *role;
      msg["content"] = read_content(m, p, false);
    } else if (*role == "assistant") {
      msg["role"] = "assistant";
      msg["content"] = read_content(m, p, true);
      if (auto r = opt_string(m, "reasoning_content", p)) msg["reasoning_content"] = *r;
      if (m.contains("tool_calls") && !m["tool_calls"].is_null())
        msg["tool_calls"] = read_tool_calls(m["tool_calls"], field_path(p, "tool_calls"));
      if (msg["content"].is_null() && !msg.contains("tool_calls")) msg["content"] = "";
    } else if (*role == "tool") {
      msg["role"] = "tool";
      msg["content"] = read_content(m, p, false);
      if (auto id = opt_string(m, "tool_call_id", p)) msg["tool_call_id"] = *id;
    } else {
      bad_field(field_path(p, "role"),
                "unknown role '{}' (expected system, developer, user, assistant or tool)", *role);
    }
    if (auto name = opt_string(m, "name", p)) msg["name"] = *name;
    out.push_back(std::move(msg));
  }
  return out;
}

// Tool definitions, checked; returned as given (the template writes them with tojson).
Json read_tools(const Json& body, std::set<std::string>& names) {
  if (!body.contains("tools") || body["tools"].is_null()) return nullptr;
  const Json& tools = body["tools"];
  if (!tools.is_array()) bad_field("tools", "expected an array, got {}", json_type_name(tools));
  if (tools.empty()) return nullptr;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = index_path("tools", i);
    const Json& t = tools[i];
    require_object(t, p);
    const auto type = opt_string(t, "type", p);
    if (!type) bad_field(field_path(p, "type"), "required");
    if (*type != "function")
      bad_field(field_path(p, "type"), "only 'function' tools are supported, got '{}'", *type);
    const std::string fp = field_path(p, "function");
    if (!t.contains("function")) bad_field(fp, "required");
    const Json& fn = t["function"];
    require_object(fn, fp);
    const auto name = opt_string(fn, "name", fp);
    if (!name) bad_field(field_path(fp, "name"), "required");
    if (!valid_tool_name(*name))
      bad_field(field_path(fp, "name"), "'{}' is not a valid name (1 to 64 of a-z A-Z 0-9 _ - .)",
                *name);
    if (!names.insert(*name).second)
      bad_field(field_path(fp, "name"), "'{}' is defined twice", *name);
    opt_string(fn, "description", fp);
    opt_bool(fn, "strict", fp);
    if (fn.contains("parameters") && !fn["parameters"].is_null()) {
      const std::string sp = field_path(fp, "parameters");
      const Json& schema = fn["parameters"];
      require_object(schema, sp);
      if (auto st = opt_string(schema, "type", sp); st && *st != "object")
        bad_field(field_path(sp, "type"), "expected 'object', got '{}'", *st);
      if (schema.contains("properties") && !schema["properties"].is_null()) {
        const std::string pp = field_path(sp, "properties");
        require_object(schema["properties"], pp);
        for (const auto& [key, prop] : schema["properties"].items())
          require_object(prop, field_path(pp, key));
      }
      if (schema.contains("required") && !schema["required"].is_null()) {
        const std::string rp = field_path(sp, "required");
        const Json& req = schema["required"];
        if (!req.is_array()) bad_field(rp, "expected an array, got {}", json_type_name(req));
        for (size_t k = 0; k < req.size(); ++k)
          if (!req[k].is_string()) bad_field(index_path(rp, k), "expected a string");
      }
    }
  }
  return tools;
}

int64_t room_after(size_t n_prompt, const ModelInfo& model) {
  return std::max<int64_t>(model.n_ctx - static_cast<int64_t>(n_prompt), 1);
}

}  // namespace

ChatRequest parse_chat_request(const Json& body, const ModelInfo& model) {
  ChatRequest r;
  r.gen = read_generation(body, model, true);
  r.turn.messages = read_messages(body);
  std::set<std::string> names;
  r.turn.tools = read_tools(body, names);

  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      const auto& s = tc.get_ref<const std::string&>();
      if (s == "auto")
        r.tool_choice = ToolChoice::kAuto;
      else if (s == "none")
        r.tool_choice = ToolChoice::kNone;
      else if (s == "required")
        r.tool_choice = ToolChoice::kRequired;
      else
        bad_field("tool_choice", "expected 'auto', 'none', 'required' or an object, got '{}'", s);
    } else if (tc.is_object()) {
      if (auto type = opt_string(tc, "type", "tool_choice"); type && *type != "function")
        bad_field("tool_choice.type", "expected 'function', got '{}'", *type);
      if (!tc.contains("function")) bad_field("tool_choice.function", "required");
      require_object(tc["function"], "tool_choice.function");
      const auto name = opt_string(tc["function"], "name", "tool_choice.function");
      if (!name) bad_field("tool_choice.function.name", "required");
      if (!names.count(*name))
        bad_field("tool_choice.function.name", "no tool named '{}' in tools", *name);
      r.tool_choice = ToolChoice::kNamed;
      r.tool_name = *name;
    } else {
      bad_field("tool_choice", "expected a string or an object, got {}", json_type_name(tc));
    }
    if (r.tool_choice == ToolChoice::kRequired && r.turn.tools.is_null())
      bad_field("tool_choice", "'required' needs tools");
  }
  // tool_choice none: the model is not told about the tools at all.
  if (r.tool_choice == ToolChoice::kNone) r.turn.tools = nullptr;
  r.parallel_tool_calls = opt_bool(body, "parallel_tool_calls").value_or(true);

  if (body.contains("response_format") && !body["response_format"].is_null()) {
    require_object(body["response_format"], "response_format");
    const auto type = opt_string(body["response_format"], "type", "response_format");
    if (type && *type != "text")
      bad_field("response_format.type", "'{}' is not supported (only 'text')", *type);
  }

  // Thinking: reasoning_effort (OpenAI's knob) first, chat_template_kwargs (the template's
  // variables, read strictly) over it.
  r.turn.render = chat::RenderOptions{};
  if (auto effort = opt_string(body, "reasoning_effort")) {
    if (*effort == "none" || *effort == "minimal")
      r.turn.render.enable_thinking = false;
    else if (*effort == "low" || *effort == "medium")
      r.turn.render.reasoning_effort = *effort;
    else if (*effort == "high" || *effort == "xhigh")
      r.turn.render.reasoning_effort = "xhigh";
    else
      bad_field("reasoning_effort", "expected none, minimal, low, medium, high or xhigh, got '{}'",
                *effort);
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    const Json& kw = body["chat_template_kwargs"];
    require_object(kw, "chat_template_kwargs");
    chat::RenderOptions ro;
    try {
      ro = chat::render_options_from_json(kw);
    } catch (const Error& e) {
      bad_field("chat_template_kwargs", "{}", e.what());
    }
    if (kw.contains("enable_thinking") && !kw["enable_thinking"].is_null())
      r.turn.render.enable_thinking = ro.enable_thinking;
    if (ro.preserve_thinking) r.turn.render.preserve_thinking = ro.preserve_thinking;
    if (ro.reasoning_effort) {
      const auto& e = *ro.reasoning_effort;
      if (e != "xhigh" && e != "medium" && e != "low")
        bad_field("chat_template_kwargs.reasoning_effort",
                  "expected xhigh, medium or low, got '{}'", e);
      r.turn.render.reasoning_effort = e;
    }
  }
  r.turn.render.add_generation_prompt = true;
  if (auto b = opt_integer(body, "thinking_budget", 0, model.n_ctx > 0 ? model.n_ctx : kInt64Max))
    r.thinking_budget = static_cast<int>(*b);
  return r;
}

CompletionRequest parse_completion_request(const Json& body, const ModelInfo& model) {
  CompletionRequest r;
  r.gen = read_generation(body, model, false);
  if (!r.gen.max_tokens) r.gen.max_tokens = 16;  // the legacy endpoint's default
  if (!body.contains("prompt") || body["prompt"].is_null()) bad_field("prompt", "required");
  const Json& p = body["prompt"];
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array()) {
    if (p.empty()) bad_field("prompt", "must not be empty");
    if (p.size() == 1 && p[0].is_string()) {
      r.prompt_text = p[0].get<std::string>();
    } else {
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string ip = index_path("prompt", i);
        if (p[i].is_string())
          bad_field("prompt", "several prompts in one request are not supported");
        if (!p[i].is_number_integer())
          bad_field(ip, "expected a token id, got {}", json_type_name(p[i]));
        const int64_t id = p[i].get<int64_t>();
        if (id < 0 || (model.n_vocab > 0 && id >= model.n_vocab))
          bad_field(ip, "token id {} is out of range [0, {})", id, model.n_vocab);
        r.prompt_ids.push_back(static_cast<int32_t>(id));
      }
    }
  } else {
    bad_field("prompt", "expected a string or an array of token ids, got {}", json_type_name(p));
  }
  if (opt_bool(body, "echo").value_or(false)) bad_field("echo", "not supported");
  if (auto s = opt_string(body, "suffix"); s && !s->empty()) bad_field("suffix", "not supported");
  return r;
}

gen::SequenceParams chat_sequence(const ChatRequest& request, const gen::PreparedTurn& turn,
                                  const ModelInfo& model, int index) {
  gen::SequenceParams p;
  p.prompt = turn.prompt;
  const int64_t room = room_after(turn.prompt.size(), model);
  p.max_tokens = static_cast<int>(std::min(request.gen.max_tokens.value_or(room), room));
  p.stop = request.gen.stop;
  p.starts_in_thinking = turn.thinking;
  p.thinking_budget = request.thinking_budget;
  auto sampling = request.gen.sampling;
  if (sampling.seed) sampling.seed = *sampling.seed + static_cast<uint64_t>(index);
  p.sampling = sample::resolve(sampling, model.checkpoint, turn.thinking);
  p.top_logprobs = request.gen.top_logprobs;
  p.parse = turn.parse;
  const bool tools = !request.turn.tools.is_null();
  if (tools && request.tool_choice == ToolChoice::kRequired)
    p.forced_after_thinking = "<tool_call>\n<function=";
  else if (tools && request.tool_choice == ToolChoice::kNamed)
    p.forced_after_thinking = "<tool_call>\n<function=" + request.tool_name + ">\n";
  // One call only: generation stops when the first call closes (the parser takes a call whose
  // </function> was read as whole).
  if (tools && !request.parallel_tool_calls) p.stop.push_back("</tool_call>");
  return p;
}

gen::SequenceParams completion_sequence(const CompletionRequest& request,
                                        std::vector<int32_t> prompt, const ModelInfo& model,
                                        int index) {
  gen::SequenceParams p;
  const int64_t room = room_after(prompt.size(), model);
  p.prompt = std::move(prompt);
  p.max_tokens = static_cast<int>(std::min(request.gen.max_tokens.value_or(room), room));
  p.stop = request.gen.stop;
  auto sampling = request.gen.sampling;
  if (sampling.seed) sampling.seed = *sampling.seed + static_cast<uint64_t>(index);
  p.sampling = sample::resolve(sampling, model.checkpoint, /*thinking=*/false);
  p.top_logprobs = request.gen.top_logprobs;
  return p;
}

Json error_json(int status, const std::string& message, const std::string& param,
                const std::string& code) {
  std::string type = "invalid_request_error";
  std::string c = code;
  if (status == 401) {
    if (c.empty()) c = "invalid_api_key";
  } else if (status == 429) {
    type = "rate_limit_error";
    if (c.empty()) c = "rate_limit_exceeded";
  } else if (status >= 500) {
    type = "server_error";
  }
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", c.empty() ? Json(nullptr) : Json(c)}}}};
}

Json model_json(const ModelInfo& model, int64_t created) {
  return {{"id", model.name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "qwenrt"},
          {"meta", {{"n_ctx", model.n_ctx}, {"n_vocab", model.n_vocab}}},
          {"qwenrt", model.defaults.is_null() ? Json::object() : model.defaults}};
}

Json models_json(const ModelInfo& model, int64_t created) {
  return {{"object", "list"}, {"data", Json::array({model_json(model, created)})}};
}

std::string finish_reason(gen::FinishReason reason, bool made_tool_calls) {
  switch (reason) {
    case gen::FinishReason::kStopToken:
    case gen::FinishReason::kStopString:
      return made_tool_calls ? "tool_calls" : "stop";
    case gen::FinishReason::kLength:
      return "length";
    case gen::FinishReason::kCancelled:
      return "cancelled";
    case gen::FinishReason::kError:
      return "error";
  }
  return "stop";
}

Json Usage::to_json() const {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

namespace {
Json byte_list(const std::string& s) {
  Json bytes = Json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}
std::string joined(const std::vector<std::optional<std::string>>& reasons) {
  std::string out;
  for (const auto& r : reasons) out += (out.empty() ? "" : ",") + r.value_or("?");
  return out;
}
}  // namespace

// --- chat ---

ChatReply::ChatReply(ReplyFormat format, TokenText token_text)
    : format_(std::move(format)), token_text_(std::move(token_text)), choices_(format_.n) {}

bool ChatReply::done() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.done; });
}

std::string ChatReply::finish_reasons() const {
  std::vector<std::optional<std::string>> r;
  for (const auto& c : choices_) r.push_back(c.finish);
  return joined(r);
}

Json ChatReply::logprob_items(const std::vector<gen::TokenLogprob>& items) const {
  Json out = Json::array();
  for (const auto& t : items) {
    const std::string text = token_text_(t.id);
    Json top = Json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string tt = token_text_(id);
      top.push_back({{"token", tt}, {"logprob", lp}, {"bytes", byte_list(tt)}});
    }
    out.push_back({{"token", text},
                   {"logprob", t.logprob},
                   {"bytes", byte_list(text)},
                   {"top_logprobs", top}});
  }
  return out;
}

const std::string& ChatReply::call_id(Choice& c, size_t index) {
  while (c.call_ids.size() <= index) c.call_ids.push_back(random_id("call_"));
  return c.call_ids[index];
}

void ChatReply::count(const gen::SequenceUpdate& u) {
  if (!u.done) return;
  usage_.prompt = u.n_prompt;  // the same prompt for every choice
  usage_.cached = u.n_cached;
  usage_.completion += u.n_generated;
  if (u.finish == gen::FinishReason::kError && error_.empty())
    error_ = u.error.empty() ? "generation failed" : u.error;
}

Json ChatReply::chunk(int choice, Json delta, const Json& logprobs, const Json& finish) const {
  Json c = {{"index", choice},
            {"delta", std::move(delta)},
            {"logprobs", logprobs},
            {"finish_reason", finish}};
  return {{"id", format_.id},
          {"object", "chat.completion.chunk"},
          {"created", format_.created},
          {"model", format_.model},
          {"system_fingerprint", nullptr},
          {"choices", Json::array({std::move(c)})}};
}

std::string ChatReply::stream(int choice, const gen::SequenceUpdate& u) {
  Choice& c = choices_.at(choice);
  if (c.done) return {};
  std::string out;
  auto emit = [&](Json delta, const Json& logprobs = nullptr, const Json& finish = nullptr) {
    out += sse_event(dump_json(chunk(choice, std::move(delta), logprobs, finish)));
  };
  if (!c.role_sent) {
    c.role_sent = true;
    emit({{"role", "assistant"}, {"content", ""}});
  }
  for (const auto& e : c.events.next(u.events)) {
    using K = chat::ReplyEvent::Kind;
    switch (e.kind) {
      case K::kReasoning:
        emit({{"reasoning_content", e.text}});
        break;
      case K::kContent:
        emit({{"content", e.text}});
        break;
      case K::kToolCallBegin:
        // The call's id and name, once; its arguments follow as fragments.
        if (format_.parallel_tool_calls || e.tool_index == 0)
          emit({{"tool_calls",
                 Json::array({{{"index", e.tool_index},
                               {"id", call_id(c, e.tool_index)},
                               {"type", "function"},
                               {"function", {{"name", e.call.name}, {"arguments", ""}}}}})}});
        break;
      case K::kToolCallArgs:
        if (format_.parallel_tool_calls || e.tool_index == 0)
          emit({{"tool_calls",
                 Json::array({{{"index", e.tool_index}, {"function", {{"arguments", e.text}}}}})}});
        break;
      case K::kToolCall:  // its header and arguments have gone out
        break;
    }
  }
  if (!u.logprobs.empty()) emit(Json::object(), {{"content", logprob_items(u.logprobs)}});
  count(u);
  if (u.done) {
    c.done = true;
    const bool made_calls = !u.reply.tool_calls.empty() || !c.call_ids.empty();
    c.finish = finish_reason(u.finish, made_calls);
    if (u.finish == gen::FinishReason::kError) {
      out += sse_event(dump_json(error_json(500, error_.empty() ? u.error : error_)));
    } else {
      emit(Json::object(), nullptr, *c.finish);
    }
  }
  return out;
}

std::string ChatReply::stream_end() const {
  std::string out;
  if (format_.include_usage) {
    Json u = {{"id", format_.id},
              {"object", "chat.completion.chunk"},
              {"created", format_.created},
              {"model", format_.model},
              {"system_fingerprint", nullptr},
              {"choices", Json::array()},
              {"usage", usage_.to_json()}};
    out += sse_event(dump_json(u));
  }
  out += sse_event("[DONE]");
  return out;
}

void ChatReply::collect(int choice, const gen::SequenceUpdate& u) {
  Choice& c = choices_.at(choice);
  if (c.done) return;
  if (format_.logprobs)
    for (auto& item : logprob_items(u.logprobs)) c.logprobs.push_back(std::move(item));
  count(u);
  if (u.done) {
    c.done = true;
    c.last = u;
    c.finish = finish_reason(u.finish, !u.reply.tool_calls.empty());
  }
}

Json ChatReply::response() const {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const auto& reply = c.last.reply;
    Json message = {{"role", "assistant"}};
    Json calls = Json::array();
    for (size_t k = 0; k < reply.tool_calls.size(); ++k) {
      if (!format_.parallel_tool_calls && k > 0) break;
      const auto& call = reply.tool_calls[k];
      calls.push_back(
          {{"id", random_id("call_")},
           {"type", "function"},
           {"function", {{"name", call.name}, {"arguments", dump_json(call.arguments)}}}});
    }
    message["content"] =
        calls.empty() || !reply.content.empty() ? Json(reply.content) : Json(nullptr);
    if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
    if (!calls.empty()) message["tool_calls"] = std::move(calls);
    choices.push_back(
        {{"index", i},
         {"message", std::move(message)},
         {"logprobs", format_.logprobs ? Json{{"content", c.logprobs}} : Json(nullptr)},
         {"finish_reason", c.finish.value_or("stop")}});
  }
  return {
      {"id", format_.id},         {"object", "chat.completion"},   {"created", format_.created},
      {"model", format_.model},   {"system_fingerprint", nullptr}, {"choices", std::move(choices)},
      {"usage", usage_.to_json()}};
}

// --- completions ---

CompletionReply::CompletionReply(ReplyFormat format, TokenText token_text)
    : format_(std::move(format)), token_text_(std::move(token_text)), choices_(format_.n) {}

bool CompletionReply::done() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.done; });
}

std::string CompletionReply::finish_reasons() const {
  std::vector<std::optional<std::string>> r;
  for (const auto& c : choices_) r.push_back(c.finish);
  return joined(r);
}

void CompletionReply::count(const gen::SequenceUpdate& u) {
  if (!u.done) return;
  usage_.prompt = u.n_prompt;
  usage_.cached = u.n_cached;
  usage_.completion += u.n_generated;
  if (u.finish == gen::FinishReason::kError && error_.empty())
    error_ = u.error.empty() ? "generation failed" : u.error;
}

// Legacy logprobs: parallel arrays; text_offset is each token's byte offset in the choice's text.
void CompletionReply::add_logprobs(Choice& c, const std::vector<gen::TokenLogprob>& items,
                                   Json* out) {
  for (const auto& t : items) {
    const std::string text = token_text_(t.id);
    Json top = Json::object();
    for (const auto& [id, lp] : t.top) top[token_text_(id)] = lp;
    c.tokens.push_back(text);
    c.token_logprobs.push_back(t.logprob);
    c.top_logprobs.push_back(top);
    c.text_offset.push_back(c.offset);
    if (out) {
      (*out)["tokens"].push_back(text);
      (*out)["token_logprobs"].push_back(t.logprob);
      (*out)["top_logprobs"].push_back(top);
      (*out)["text_offset"].push_back(c.offset);
    }
    c.offset += static_cast<int64_t>(text.size());
  }
}

Json CompletionReply::chunk(int choice, const std::string& text, const Json& logprobs,
                            const Json& finish) const {
  return {{"id", format_.id},
          {"object", "text_completion"},
          {"created", format_.created},
          {"model", format_.model},
          {"system_fingerprint", nullptr},
          {"choices", Json::array({{{"index", choice},
                                    {"text", text},
                                    {"logprobs", logprobs},
                                    {"finish_reason", finish}}})}};
}

std::string CompletionReply::stream(int choice, const gen::SequenceUpdate& u) {
  Choice& c = choices_.at(choice);
  if (c.done) return {};
  std::string out;
  Json lp = nullptr;
  if (format_.logprobs && !u.logprobs.empty()) {
    lp = {{"tokens", Json::array()},
          {"token_logprobs", Json::array()},
          {"top_logprobs", Json::array()},
          {"text_offset", Json::array()}};
    add_logprobs(c, u.logprobs, &lp);
  }
  if (!u.text.empty() || !lp.is_null())
    out += sse_event(dump_json(chunk(choice, u.text, lp, nullptr)));
  c.text += u.text;
  count(u);
  if (u.done) {
    c.done = true;
    c.finish = finish_reason(u.finish, false);
    if (u.finish == gen::FinishReason::kError)
      out += sse_event(dump_json(error_json(500, error_)));
    else
      out += sse_event(dump_json(chunk(choice, "", nullptr, *c.finish)));
  }
  return out;
}

std::string CompletionReply::stream_end() const {
  std::string out;
  if (format_.include_usage) {
    Json u = {{"id", format_.id},       {"object", "text_completion"}, {"created", format_.created},
              {"model", format_.model}, {"choices", Json::array()},    {"usage", usage_.to_json()}};
    out += sse_event(dump_json(u));
  }
  out += sse_event("[DONE]");
  return out;
}

void CompletionReply::collect(int choice, const gen::SequenceUpdate& u) {
  Choice& c = choices_.at(choice);
  if (c.done) return;
  if (format_.logprobs) add_logprobs(c, u.logprobs, nullptr);
  c.text += u.text;
  count(u);
  if (u.done) {
    c.done = true;
    c.finish = finish_reason(u.finish, false);
  }
}

Json CompletionReply::response() const {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    Json lp = nullptr;
    if (format_.logprobs)
      lp = {{"tokens", c.tokens},
            {"token_logprobs", c.token_logprobs},
            {"top_logprobs", c.top_logprobs},
            {"text_offset", c.text_offset}};
    choices.push_back({{"index", i},
                       {"text", c.text},
                       {"logprobs", std::move(lp)},
                       {"finish_reason", c.finish.value_or("stop")}});
  }
  return {
      {"id", format_.id},         {"object", "text_completion"},   {"created", format_.created},
      {"model", format_.model},   {"system_fingerprint", nullptr}, {"choices", std::move(choices)},
      {"usage", usage_.to_json()}};
}

}  // namespace qwenrt::serve::openai
