#include "gen/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "gen/defaults.h"

namespace qwenrt::gen {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: that much
// must be held back because the next token may complete a stop string.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

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
  for (const auto& stop : stop_tokens(tokenizer)) stop_ids_.push_back(stop.second);
  if (stop_ids_.empty())
    fail("tokenizer has neither <|im_end|> nor <|endoftext|>: generation could not stop");
  think_end_ = tokenizer.token_id("</think>");
  if (think_end_) close_thinking_ = tokenizer.encode("\n</think>\n\n", true);
}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt,
                                     const GenerationOptions& options,
                                     const std::function<void(const std::string&)>& on_text) {
  for (const auto& s : options.stop) {
    if (s.empty()) fail("stop strings must not be empty");
  }
  if (prompt.empty()) fail("the prompt is empty");
  auto& states = engine_.states();
  const int64_t n_ctx = states.n_ctx();
  if (static_cast<int64_t>(prompt.size()) >= n_ctx) {
    fail("the prompt has {} tokens; the context holds {} (prompt + at least one generated token)",
         prompt.size(), n_ctx);
  }
  if (options.thinking_budget && !think_end_)
    fail("thinking budget set but the vocabulary has no </think>");
  states.reset(options.slot);
  sample::Sampler sampler(options.sampling);
  GenerationResult result;
  result.n_prompt = static_cast<int64_t>(prompt.size());

  // Prefill in chunks; the last one ends in the first sampled token (on the backend).
  const auto t_prompt = Clock::now();
  engine::Batch b;
  std::vector<ops::SampledToken> sampled;
  for (size_t i = 0; i < prompt.size(); i += options.prefill_chunk) {
    b.clear();
    const size_t end = std::min(prompt.size(), i + options.prefill_chunk);
    for (size_t j = i; j < end; ++j)
      b.add(options.slot, prompt[j], static_cast<int32_t>(j), j + 1 == prompt.size());
    if (end == prompt.size()) {
      const ops::SamplingRow row = sampler.next_row(result.tokens);
      engine_.step_sample(b, {&row, 1}, 0, sampled);
    } else {
      engine_.step_sample(b, {}, 0, sampled);
    }
  }
  result.prompt_seconds = seconds_since(t_prompt);

  const auto t_gen = Clock::now();
  tokenizer::StreamDecoder decoder(tokenizer_);
  std::string pending;  // decoded text not yet emitted (may hold a stop-string prefix)
  auto emit = [&](size_t n) {
    if (n == 0) return;
    const std::string out = pending.substr(0, n);
    pending.erase(0, n);
    result.text += out;
    if (on_text) on_text(out);
  };
  bool thinking = options.starts_in_thinking;
  int thinking_tokens = 0;
  std::vector<int32_t> forced;  // tokens to feed instead of sampling (closing a thought)
  int64_t position = static_cast<int64_t>(prompt.size());
  bool stopped = false;
  while (static_cast<int>(result.tokens.size()) < options.max_tokens) {
    int32_t token;
    if (!forced.empty()) {
      token = forced.front();
      forced.erase(forced.begin());
    } else {
      token = sampled.at(0).id;
    }
    if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
      result.finish = FinishReason::kStopToken;
      stopped = true;
      break;
    }
    result.tokens.push_back(token);
    if (thinking) {
      if (think_end_ && token == *think_end_) {
        thinking = false;
      } else if (++thinking_tokens == options.thinking_budget.value_or(-1) && forced.empty()) {
        forced = close_thinking_;
      }
    }
    pending += decoder.push(token);
    bool hit = false;
    for (const auto& s : options.stop) {
      if (size_t at = pending.find(s); at != std::string::npos) {
        pending.resize(at);
        hit = true;
      }
    }
    if (hit) {
      emit(pending.size());
      result.finish = FinishReason::kStopString;
      stopped = true;
      break;
    }
    emit(pending.size() - held_back(pending, options.stop));
    if (position + 1 >= n_ctx) break;  // the context is full: finish as length
    // A row whose next token is forced samples nothing (and draws nothing from the sampler).
    b.clear();
    b.add(options.slot, token, static_cast<int32_t>(position++), forced.empty());
    if (forced.empty()) {
      const ops::SamplingRow row = sampler.next_row(result.tokens);
      engine_.step_sample(b, {&row, 1}, 0, sampled);
    } else {
      engine_.step_sample(b, {}, 0, sampled);
    }
  }
  if (!stopped) result.finish = FinishReason::kLength;
  if (result.finish != FinishReason::kStopString) {
    pending += decoder.finish();
    emit(pending.size());
  }
  result.generate_seconds = seconds_since(t_gen);
  return result;
}

}  // namespace qwenrt::gen
