// Chat rendering: OpenAI-style messages to the prompt text a Qwen3.5/3.6/3.8 checkpoint was trained
// on.
//
// This is the logic of the official Qwen3.5 chat template
// (shared/fixtures/qwen3.5-chat-template.jinja) written as C++, byte for byte what HF transformers'
// apply_chat_template(tokenize=False) returns for it, plus the two later dialects (SPEC.md
// "Tokenizer and chat"):
//   Qwen3.5: the template as shipped.
//   Qwen3.6: adds `preserve_thinking` (default false): when true, every past assistant turn keeps
//            its <think> block, not only those after the last user query.
//   Qwen3.8: `preserve_thinking` defaults to true; a reasoning-effort instruction opens the system
//            turn while thinking is on; an empty system message makes no system turn. See
//            render.cpp for the exact 3.8 text and where it comes from.
// Input shapes are the template's (and OpenAI's): a message is {role, content, reasoning_content?,
// tool_calls?}; content is a string, null or a list of {"type": "text", "text": ...} parts; a tool
// call is {"function": {"name", "arguments"}} or {"name", "arguments"}, arguments an object or a
// JSON string holding one. `thinking` and `reasoning` are read as `reasoning_content`, and keys
// whose value is null count as absent, as transformers does before it renders.
// Anything the template would reject, or that qwenrt cannot serve (images, video), is a
// qwenrt::Error naming the message index and the problem.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "chat/pytext.h"
#include "model/identity.h"

namespace qwenrt::chat {

enum class Dialect { kQwen35, kQwen36, kQwen38 };

struct RenderOptions {
  // End with "<|im_start|>assistant\n" and the opening of the reply's think block.
  bool add_generation_prompt = true;
  // false: the generation prompt holds an empty, closed think block ("<think>\n\n</think>\n\n"),
  // and Qwen3.8 adds no reasoning-effort instruction.
  bool enable_thinking = true;
  // Keep the reasoning of assistant turns before the last user query. Unset: the dialect's default
  // (3.6 false, 3.8 true). Qwen3.5's template has no such switch and ignores it.
  std::optional<bool> preserve_thinking;
  // Qwen3.8 only: "xhigh" (the default when unset), "medium" or "low"; anything else is an error.
  // Ignored by 3.5 and 3.6, as their templates ignore it.
  std::optional<std::string> reasoning_effort;
};

// messages: a non-empty array; tools: null or an array of tool definitions (written with tojson,
// keys in the order given). Throws qwenrt::Error on input the template rejects.
std::string render_chat(Dialect dialect, const Json& messages, const Json& tools,
                        const RenderOptions& options);

// Options from a chat_template_kwargs-style object ({"add_generation_prompt": true,
// "enable_thinking": false, "preserve_thinking": true, "reasoning_effort": "low"}); a key that is
// absent or null keeps its default, other keys are ignored (as the template ignores variables it
// does not read); a value of the wrong type is an error naming the key.
RenderOptions render_options_from_json(const Json& options);

const char* dialect_name(Dialect dialect);                        // "qwen3.5", "qwen3.6", "qwen3.8"
std::optional<Dialect> dialect_from_name(std::string_view name);  // inverse of dialect_name
// The dialect a checkpoint's template speaks; unknown checkpoints get the Qwen3.5 template.
Dialect dialect_for(model::Checkpoint checkpoint);

}  // namespace qwenrt::chat
