#include "cli/session.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/utf8.h"

namespace qwenrt::cli {

void add_turn_options(CLI::App* sub, TurnOptions& opt) {
  add_model_option(sub, opt.model, "Model (default: the embedded tiny chat model)");
  sub->add_option("-s,--system", opt.system, "A system message");
  sub->add_flag("--no-think", opt.no_think, "Answer without thinking (empty think block)");
  sub->add_flag("--show-thinking", opt.show_thinking, "Print the reasoning (dimmed on a terminal)");
  sub->add_option("-n,--max-tokens", opt.max_tokens, "Maximum tokens to generate")
      ->check(CLI::PositiveNumber);
  sub->add_option("--thinking-budget", opt.thinking_budget,
                  "Tokens of thinking before it is closed");
  sub->add_option("--stop", opt.stop, "Stop string (repeatable; not printed)");
  sub->add_option("--temp", opt.sampling.temperature, "Temperature (0 = greedy)");
  sub->add_option("--top-k", opt.sampling.top_k, "Top-k (0 = off)");
  sub->add_option("--top-p", opt.sampling.top_p, "Top-p");
  sub->add_option("--min-p", opt.sampling.min_p, "Min-p");
  sub->add_option("--presence-penalty", opt.sampling.presence_penalty, "Presence penalty");
  sub->add_option("--frequency-penalty", opt.sampling.frequency_penalty, "Frequency penalty");
  sub->add_option("--repeat-penalty", opt.sampling.repetition_penalty, "Repetition penalty");
  sub->add_option("--seed", opt.sampling.seed, "Random seed");
  sub->add_option("-c,--ctx-size", opt.n_ctx, "Context size in tokens (default: model's, capped)");
  add_backend_options(sub, opt.backend);
  add_draft_options(sub, opt.draft);
}

void require_utf8(std::string_view text, std::string_view what) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = tokenizer::utf8_sequence_length(text, pos);
    if (n == 0)
      fail("{} is not valid UTF-8 (byte {:#04x} at offset {})", what,
           static_cast<uint8_t>(text[pos]), pos);
    pos += n;
  }
}

chat::Json start_messages(const TurnOptions& opt) {
  require_utf8(opt.system, "the system message");
  chat::Json messages = chat::Json::array();
  if (!opt.system.empty()) messages.push_back({{"role", "system"}, {"content", opt.system}});
  return messages;
}

// A progress bar on stderr while a large model's weights are read (only on a terminal, and only
// for files big enough to take a while).
std::function<void(uint64_t, uint64_t)> load_progress_bar() {
  if (!isatty(STDERR_FILENO)) return nullptr;
  return [](uint64_t done, uint64_t total) {
    if (total < (512ull << 20)) return;
    const int width = 40, filled = static_cast<int>(width * done / std::max<uint64_t>(total, 1));
    fmt::print(stderr, "\rloading [{}{}] {:3d}% {:.1f}/{:.1f} GB{}", std::string(filled, '#'),
               std::string(width - filled, ' '), static_cast<int>(100 * done / total), done / 1e9,
               total / 1e9, done == total ? "\n" : "");
  };
}

Session::Session(const TurnOptions& options, bool multi_turn) : options_(options) {
  engine::EngineOptions eo;
  eo.n_ctx = options.n_ctx;
  apply(options.backend, eo);
  eo.on_load_progress = load_progress_bar();
  gen::SchedulerOptions so{.prefix_cache = multi_turn};
  const std::string path = resolve_model(options.model);
  apply(options.draft, path, eo, so);
  engine_ = engine::Engine::load(path, eo);
  if (so.draft.kind != gen::DraftKind::kNone) draft_depth_ = so.draft.max_tokens;
  tokenizer_ =
      std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(engine_->file()));
  dialect_ = chat::dialect_for(engine_->identity().checkpoint);
  scheduler_ = std::make_unique<gen::Scheduler>(*engine_, *tokenizer_, so);
  log(LogLevel::kInfo, "model {} ({}), chat dialect {}", engine_->identity().name,
      engine_->config().arch_name, chat::dialect_name(dialect_));
}

chat::ParsedReply Session::reply(const chat::Json& messages, bool thinking,
                                 const chat::Json& tools) {
  gen::ChatTurn turn{.messages = messages, .tools = tools};
  turn.render.enable_thinking = thinking;
  gen::PreparedTurn prepared = gen::prepare_turn(*tokenizer_, dialect_, turn);

  const bool tty = isatty(STDOUT_FILENO);
  bool in_reasoning = false;
  auto print = [&](const std::vector<chat::ReplyEvent>& events) {
    for (const auto& e : events) {
      if (e.kind == chat::ReplyEvent::Kind::kReasoning) {
        if (!options_.show_thinking && !tty) continue;
        if (!in_reasoning && tty) std::fputs("\x1b[2m", stdout);
        in_reasoning = true;
        std::fputs(e.text.c_str(), stdout);
      } else {
        if (in_reasoning) {
          std::fputs(tty ? "\x1b[0m\n\n" : "\n\n", stdout);
          in_reasoning = false;
        }
        if (e.kind == chat::ReplyEvent::Kind::kContent) {
          std::fputs(e.text.c_str(), stdout);
        } else if (e.kind == chat::ReplyEvent::Kind::kToolCall) {
          std::fputs(fmt::format("\n[tool call{}] {}({})\n", e.call.complete ? "" : " (cut off)",
                                 e.call.name, e.call.arguments.dump())
                         .c_str(),
                     stdout);
        }
      }
    }
    std::fflush(stdout);
  };
  // One sequence through the scheduler the server uses: the same loop, stop rules and parser.
  gen::SequenceUpdate last;
  bool done = false;
  scheduler_->submit({.prompt = std::move(prepared.prompt),
                      .max_tokens = options_.max_tokens,
                      .stop = options_.stop,
                      .starts_in_thinking = prepared.thinking,
                      .thinking_budget = options_.thinking_budget,
                      .sampling = sample::resolve(options_.sampling, engine_->identity().checkpoint,
                                                  prepared.thinking),
                      .parse = std::move(prepared.parse)},
                     [&](gen::SequenceUpdate&& u) {
                       print(u.events);
                       if (!u.done) return;
                       done = true;
                       last = std::move(u);
                     });
  while (!done && scheduler_->step()) {
  }
  if (last.finish == gen::FinishReason::kError) fail("generation failed: {}", last.error);
  if (in_reasoning && tty) std::fputs("\x1b[0m", stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  // Prompt speed over the tokens prefilled (those restored from the prefix cache cost none).
  const int64_t prefilled = last.n_prompt - last.n_cached;
  const std::string drafted =
      last.n_checks > 0
          ? fmt::format(" | drafted {}, accepted {} ({:.0f}%), {} checks of up to {}",
                        last.n_drafted, last.n_accepted, 100.0 * last.n_accepted / last.n_drafted,
                        last.n_checks, draft_depth_)
          : "";
  fmt::print(stderr,
             "[prompt {} tokens{}, {:.1f} tok/s | generated {} tokens, {:.1f} tok/s{} | {}]\n",
             last.n_prompt, last.n_cached > 0 ? fmt::format(" ({} cached)", last.n_cached) : "",
             prefilled / std::max(last.prompt_seconds, 1e-9), last.n_generated,
             last.n_generated / std::max(last.generate_seconds, 1e-9), drafted,
             gen::finish_reason_name(last.finish));
  return last.reply;
}

}  // namespace qwenrt::cli
