// One sequence generated to its end: prefill, then sample token by token until <|im_end|> or
// <|endoftext|>, a user stop string (never emitted), or max tokens; an optional thinking budget
// closes an open <think> block by forcing "\n</think>\n\n"; text streams out through a callback
// as whole UTF-8 characters, held back while it could still become a stop string. The loop itself
// is the Scheduler's (gen/scheduler.h) with one sequence; this is its blocking form.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::gen {

// kCancelled and kError end scheduler sequences only (cancel(), or a failed step).
enum class FinishReason { kStopToken, kStopString, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason reason);

struct GenerationOptions {
  int max_tokens = 512;                // generated tokens, forced ones included
  std::vector<std::string> stop;       // stop strings; the text stops before the first one
  bool starts_in_thinking = false;     // the prompt ends inside an open <think>
  std::optional<int> thinking_budget;  // tokens allowed inside <think> before it is closed
  sample::SamplingParams sampling;
  int prefill_chunk = 512;  // prompt tokens per step
};

struct GenerationResult {
  std::string text;             // everything emitted (stop string and stop token excluded)
  std::vector<int32_t> tokens;  // generated ids (forced ones included, stop token excluded)
  FinishReason finish = FinishReason::kLength;
  int64_t n_prompt = 0;
  double prompt_seconds = 0;    // prefill wall time
  double generate_seconds = 0;  // decode wall time
};

class Generator {
 public:
  Generator(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer);

  // `on_text` receives the text as it becomes final (may be null). The engine must be idle: the
  // sequence takes its first free slot (0), which is reset before the prompt.
  GenerationResult generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                            const std::function<void(const std::string&)>& on_text = nullptr);

 private:
  engine::Engine& engine_;
  const tokenizer::Tokenizer& tokenizer_;
};

}  // namespace qwenrt::gen
