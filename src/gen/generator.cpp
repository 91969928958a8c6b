#include "gen/generator.h"

#include "core/error.h"
#include "gen/defaults.h"
#include "gen/scheduler.h"

namespace qwenrt::gen {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
      return "stop";
    case FinishReason::kStopString:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Generator::Generator(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer)
    : engine_(engine), tokenizer_(tokenizer) {
  if (stop_tokens(tokenizer).empty())
    fail("tokenizer has neither <|im_end|> nor <|endoftext|>: generation could not stop");
}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt,
                                     const GenerationOptions& options,
                                     const std::function<void(const std::string&)>& on_text) {
  Scheduler scheduler(engine_, tokenizer_, {.max_queue = 1, .step_tokens = options.prefill_chunk});
  SequenceParams params{.prompt = prompt,
                        .max_tokens = options.max_tokens,
                        .stop = options.stop,
                        .starts_in_thinking = options.starts_in_thinking,
                        .thinking_budget = options.thinking_budget,
                        .sampling = options.sampling};
  GenerationResult result;
  bool done = false;
  std::string error;
  scheduler.submit(std::move(params), [&](SequenceUpdate&& u) {
    result.tokens.insert(result.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (!u.text.empty()) {
      result.text += u.text;
      if (on_text) on_text(u.text);
    }
    if (!u.done) return;
    done = true;
    error = u.finish == FinishReason::kError ? u.error : "";
    result.finish = u.finish;
    result.n_prompt = u.n_prompt;
    result.prompt_seconds = u.prompt_seconds;
    result.generate_seconds = u.generate_seconds;
  });
  while (!done && scheduler.step()) {
  }
  if (!error.empty()) throw Error(error);
  return result;
}

}  // namespace qwenrt::gen
