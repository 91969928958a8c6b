// The official Qwen3.5 template as C++. Each step below names the template construct it stands
// for; the Python string operations it uses (split, lstrip('\n'), |trim) are reproduced exactly,
// because a prompt that differs by one newline from what the model was trained on still "works"
// and is quietly worse.
//
// Qwen3.8 (no official template exists in this repository; SPEC.md gives three differences and
// no text). What is implemented, and why:
//   - Reasoning effort: with thinking on, an instruction opens the system turn; "xhigh" is the
//     default, "medium" has no instruction, anything else is an error. The two sentences below are
//     those that public re-implementations of the released Qwen3.8-27B template carry verbatim
//     (they agree with each other; see tools/chat/README.md). The instruction is followed by
//     "\n\n" and then the tools block or the system text; with neither it is the whole turn.
//   - preserve_thinking defaults to true (SPEC.md).
//   - A system message that trims to nothing makes no system turn (SPEC.md).
//   - Those same sources say 3.8 reads reasoning only from `reasoning_content` (a "<think>" inside
//     content stays content) and writes non-string tool arguments as JSON ("true", not "True").
//     Both are followed here. Everything else is the 3.5 template.
#include "chat/render.h"

#include <vector>

#include "core/error.h"

namespace qwenrt::chat {
namespace {

constexpr std::string_view kToolsPreamble =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsRules =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
    "specified\n- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
    "question like normal with your current knowledge and do not tell the user about function "
    "calls\n</IMPORTANT>";
constexpr std::string_view kEffortXhigh =
    "Reasoning effort is set to xhigh. Please think carefully through the task, validate key "
    "assumptions, consider plausible alternatives, and prioritize correctness, consistency, and "
    "clarity in the final answer.";
constexpr std::string_view kEffortLow =
    "Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the "
    "conclusion without unnecessary elaboration.";

// transformers drops keys whose value is None before rendering, so null and absent are the same.
const Json* field(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}
bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}
std::string_view lstrip_newlines(std::string_view text) {
  while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
  return text;
}
std::string_view rstrip_newlines(std::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return text;
}

struct Message {
  std::string role;
  std::string content;  // render_content(message.content), untrimmed
  const Json* json = nullptr;
};

// The template's render_content macro. Images and video are known to the template but qwenrt
// serves text only, so they are refused rather than turned into pad tokens nothing will fill.
std::string render_content(const Json& message, size_t index, const std::string& role) {
  const Json* content = field(message, "content");
  if (content == nullptr) return "";
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) {
    fail("chat: message {} ({}): content must be a string, a list of parts or null, got {}", index,
         role, content->type_name());
  }
  std::string text;
  for (size_t part_index = 0; part_index < content->size(); ++part_index) {
    const Json& part = (*content)[part_index];
    if (!part.is_object()) {
      fail("chat: message {} ({}): content part {} must be an object, got {}", index, role,
           part_index, part.type_name());
    }
    const Json* type = field(part, "type");
    const bool typed = type != nullptr && type->is_string();
    if (part.contains("image") || part.contains("image_url") || (typed && *type == "image") ||
        part.contains("video") || (typed && *type == "video")) {
      fail("chat: message {} ({}): content part {} is an image or video; qwenrt serves text only",
           index, role, part_index);
    }
    if (!part.contains("text")) {
      fail(
          "chat: message {} ({}): content part {} has unknown type {} (only text parts are "
          "supported)",
          index, role, part_index, typed ? type->get<std::string>() : std::string("(none)"));
    }
    const Json& part_text = part["text"];
    if (!part_text.is_string()) {
      fail("chat: message {} ({}): content part {}: text must be a string, got {}", index, role,
           part_index, part_text.type_name());
    }
    text += part_text.get<std::string>();
  }
  return text;
}

class Renderer {
 public:
  Renderer(Dialect dialect, const Json& tools, const RenderOptions& options)
      : dialect_(dialect), tools_(tools), options_(options) {}

  std::string run(const Json& messages) {
    read_messages(messages);
    const std::string effort = effort_instruction();
    write_system_turn(effort);
    const size_t last_query = last_query_index();
    for (size_t i = 0; i < messages_.size(); ++i) {
      const Message& message = messages_[i];
      if (message.role == "user") {
        out_ += "<|im_start|>user\n";
        out_ += py_strip(message.content);
        out_ += "<|im_end|>\n";
      } else if (message.role == "assistant") {
        write_assistant(i, last_query);
      } else if (message.role == "tool") {
        write_tool_response(i);
      }
      // role "system" is only allowed at index 0 (checked in read_messages) and was written above.
    }
    if (options_.add_generation_prompt) {
      out_ += "<|im_start|>assistant\n";
      out_ += options_.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
    }
    return std::move(out_);
  }

 private:
  void read_messages(const Json& messages) {
    if (!messages.is_array()) fail("chat: messages must be a list, got {}", messages.type_name());
    if (messages.empty()) fail("chat: no messages to render");
    for (size_t i = 0; i < messages.size(); ++i) {
      const Json& json = messages[i];
      if (!json.is_object())
        fail("chat: message {} must be an object, got {}", i, json.type_name());
      const Json* role = field(json, "role");
      if (role == nullptr || !role->is_string()) fail("chat: message {} has no role", i);
      Message message{.role = role->get<std::string>(), .json = &json};
      if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
          message.role != "tool") {
        fail("chat: message {}: unknown role '{}' (expected system, user, assistant or tool)", i,
             message.role);
      }
      if (message.role == "system" && i != 0) {
        fail("chat: message {}: a system message must be the first message", i);
      }
      message.content = render_content(json, i, message.role);
      messages_.push_back(std::move(message));
    }
    if (!tools_.is_null() && !tools_.is_array()) {
      fail("chat: tools must be a list of tool definitions, got {}", tools_.type_name());
    }
  }

  bool preserve_thinking() const {
    switch (dialect_) {
      case Dialect::kQwen35:
        return false;
      case Dialect::kQwen36:
        return options_.preserve_thinking.value_or(false);
      case Dialect::kQwen38:
        return options_.preserve_thinking.value_or(true);
    }
    return false;
  }

  std::string effort_instruction() const {
    if (dialect_ != Dialect::kQwen38) return "";
    // Checked even when thinking is off, so a bad request fails the same way in both modes.
    const std::string effort = options_.reasoning_effort.value_or("xhigh");
    if (effort != "xhigh" && effort != "medium" && effort != "low") {
      fail("chat: unknown reasoning_effort '{}' (Qwen3.8 supports xhigh (default), medium, low)",
           effort);
    }
    if (!options_.enable_thinking || effort == "medium") return "";
    return std::string(effort == "xhigh" ? kEffortXhigh : kEffortLow);
  }

  // The block before the loop: tools (with the system text appended) or the system message.
  void write_system_turn(const std::string& effort) {
    const bool has_system = messages_[0].role == "system";
    const std::string_view system = has_system ? py_strip(messages_[0].content) : "";
    const bool has_tools = tools_.is_array() && !tools_.empty();
    if (has_tools) {
      out_ += "<|im_start|>system\n";
      if (!effort.empty()) out_ += effort + "\n\n";
      out_ += kToolsPreamble;
      for (const Json& tool : tools_) {
        out_ += "\n";
        out_ += py_json_dumps(tool);
      }
      out_ += "\n</tools>";
      out_ += kToolsRules;
      if (!system.empty()) {
        out_ += "\n\n";
        out_ += system;
      }
      out_ += "<|im_end|>\n";
      return;
    }
    if (dialect_ == Dialect::kQwen38) {
      if (system.empty() && effort.empty()) return;
      out_ += "<|im_start|>system\n";
      out_ += effort;
      if (!effort.empty() && !system.empty()) out_ += "\n\n";
      out_ += system;
      out_ += "<|im_end|>\n";
      return;
    }
    // 3.5/3.6 write the turn even when the system text is empty.
    if (has_system) {
      out_ += "<|im_start|>system\n";
      out_ += system;
      out_ += "<|im_end|>\n";
    }
  }

  // ns.last_query_index: the last user message that is not a wrapped tool response. Assistant
  // turns after it are the current answer's own steps and keep their reasoning.
  size_t last_query_index() const {
    for (size_t i = messages_.size(); i-- > 0;) {
      if (messages_[i].role != "user") continue;
      const std::string_view content = py_strip(messages_[i].content);
      if (!(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>"))) {
        return i;
      }
    }
    fail(
        "chat: no user query found in messages (the template needs at least one user message "
        "that is not a <tool_response>)");
  }

  void write_assistant(size_t index, size_t last_query) {
    const Message& message = messages_[index];
    std::string content(py_strip(message.content));
    std::string reasoning;
    // transformers copies `thinking` or `reasoning` into `reasoning_content` when that is absent.
    const Json* reasoning_field = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      if ((reasoning_field = field(*message.json, key)) != nullptr) break;
    }
    if (reasoning_field != nullptr) {
      if (!reasoning_field->is_string()) {
        fail("chat: message {} (assistant): reasoning_content must be a string, got {}", index,
             reasoning_field->type_name());
      }
      reasoning = reasoning_field->get<std::string>();
    } else if (dialect_ != Dialect::kQwen38 && content.find("</think>") != std::string::npos) {
      // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'), and the
      // content is what follows the last '</think>', lstrip('\n').
      const std::string_view text = content;
      std::string_view before = rstrip_newlines(text.substr(0, text.find("</think>")));
      const size_t open = before.rfind("<think>");
      if (open != std::string_view::npos) before = before.substr(open + 7);
      reasoning = std::string(lstrip_newlines(before));
      content = std::string(lstrip_newlines(text.substr(text.rfind("</think>") + 8)));
    }
    const std::string_view trimmed_reasoning = py_strip(reasoning);

    out_ += "<|im_start|>assistant\n";
    if (index > last_query || preserve_thinking()) {
      out_ += "<think>\n";
      out_ += trimmed_reasoning;
      out_ += "\n</think>\n\n";
    }
    out_ += content;

    const Json* calls = field(*message.json, "tool_calls");
    if (calls != nullptr) {
      if (!calls->is_array()) {
        fail("chat: message {} (assistant): tool_calls must be a list, got {}", index,
             calls->type_name());
      }
      for (size_t j = 0; j < calls->size(); ++j) write_tool_call(index, j, (*calls)[j], content);
    }
    out_ += "<|im_end|>\n";
  }

  void write_tool_call(size_t index, size_t call_index, const Json& call,
                       const std::string& content) {
    if (!call.is_object()) {
      fail("chat: message {} (assistant): tool call {} must be an object, got {}", index,
           call_index, call.type_name());
    }
    const Json* function = field(call, "function");
    const Json& fn = function != nullptr ? *function : call;
    if (!fn.is_object()) {
      fail("chat: message {} (assistant): tool call {}: function must be an object, got {}", index,
           call_index, fn.type_name());
    }
    const Json* name = field(fn, "name");
    if (name == nullptr || !name->is_string()) {
      fail("chat: message {} (assistant): tool call {} has no function name", index, call_index);
    }
    if (call_index > 0) {
      out_ += "\n";
    } else if (!py_strip(content).empty()) {
      out_ += "\n\n";
    }
    out_ += "<tool_call>\n<function=";
    out_ += name->get_ref<const std::string&>();
    out_ += ">\n";

    // The template iterates arguments|items, which needs a mapping. OpenAI clients send a JSON
    // string; it is read here (keeping key order) rather than refused.
    const Json* arguments = field(fn, "arguments");
    Json parsed;
    if (arguments != nullptr && arguments->is_string()) {
      const std::string& text = arguments->get_ref<const std::string&>();
      if (!py_strip(text).empty()) {
        parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_object()) {
          fail("chat: message {} (assistant): tool call {} ({}): arguments must be a JSON object",
               index, call_index, name->get<std::string>());
        }
      }
      arguments = parsed.is_object() ? &parsed : nullptr;
    }
    if (arguments != nullptr) {
      if (!arguments->is_object()) {
        fail(
            "chat: message {} (assistant): tool call {} ({}): arguments must be an object or a "
            "JSON string, got {}",
            index, call_index, name->get<std::string>(), arguments->type_name());
      }
      for (const auto& [key, value] : arguments->items()) {
        out_ += "<parameter=";
        out_ += key;
        out_ += ">\n";
        out_ += argument_text(value);
        out_ += "\n</parameter>\n";
      }
    }
    out_ += "</function>\n</tool_call>";
  }

  // 3.5/3.6: mappings and lists with tojson, everything else with |string (so True, None, 1.0).
  // 3.8: strings raw, everything else with tojson.
  std::string argument_text(const Json& value) const {
    if (value.is_string()) return value.get<std::string>();
    if (dialect_ == Dialect::kQwen38 || value.is_object() || value.is_array()) {
      return py_json_dumps(value);
    }
    return py_str(value);
  }

  // Consecutive tool messages share one user turn.
  void write_tool_response(size_t index) {
    // `loop.previtem and loop.previtem.role != "tool"`: the first message has no previtem, so a
    // tool message there opens no turn; the template does this, so it is kept.
    if (index > 0 && messages_[index - 1].role != "tool") out_ += "<|im_start|>user";
    out_ += "\n<tool_response>\n";
    out_ += py_strip(messages_[index].content);
    out_ += "\n</tool_response>";
    if (index + 1 == messages_.size() || messages_[index + 1].role != "tool")
      out_ += "<|im_end|>\n";
  }

  Dialect dialect_;
  const Json& tools_;
  const RenderOptions& options_;
  std::vector<Message> messages_;
  std::string out_;
};

}  // namespace

std::string render_chat(Dialect dialect, const Json& messages, const Json& tools,
                        const RenderOptions& options) {
  return Renderer(dialect, tools, options).run(messages);
}

RenderOptions render_options_from_json(const Json& options) {
  RenderOptions result;
  if (options.is_null()) return result;
  if (!options.is_object()) fail("chat: options must be an object, got {}", options.type_name());
  const auto flag = [&](const char* key) -> std::optional<bool> {
    const Json* value = field(options, key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean())
      fail("chat: option {} must be true or false, got {}", key, value->dump());
    return value->get<bool>();
  };
  result.add_generation_prompt =
      flag("add_generation_prompt").value_or(result.add_generation_prompt);
  result.enable_thinking = flag("enable_thinking").value_or(result.enable_thinking);
  result.preserve_thinking = flag("preserve_thinking");
  if (const Json* effort = field(options, "reasoning_effort"); effort != nullptr) {
    if (!effort->is_string()) {
      fail("chat: option reasoning_effort must be a string, got {}", effort->dump());
    }
    result.reasoning_effort = effort->get<std::string>();
  }
  return result;
}

const char* dialect_name(Dialect dialect) {
  switch (dialect) {
    case Dialect::kQwen35:
      return "qwen3.5";
    case Dialect::kQwen36:
      return "qwen3.6";
    case Dialect::kQwen38:
      return "qwen3.8";
  }
  return "?";
}

std::optional<Dialect> dialect_from_name(std::string_view name) {
  for (const Dialect dialect : {Dialect::kQwen35, Dialect::kQwen36, Dialect::kQwen38}) {
    if (name == dialect_name(dialect)) return dialect;
  }
  return std::nullopt;
}

Dialect dialect_for(model::Checkpoint checkpoint) {
  switch (checkpoint) {
    case model::Checkpoint::kQwen36_27B:
    case model::Checkpoint::kQwen36_35B_A3B:
      return Dialect::kQwen36;
    case model::Checkpoint::kQwen38_27B:
    case model::Checkpoint::kQwen38_FlashNext:
      return Dialect::kQwen38;
    case model::Checkpoint::kOther:
      return Dialect::kQwen35;
  }
  return Dialect::kQwen35;
}

}  // namespace qwenrt::chat
