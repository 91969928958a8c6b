// What `run` and `chat` share: model resolution, loading, one assistant turn (gen::prepare_turn,
// one sequence through gen::Scheduler, reasoning / content / tool calls streamed to the terminal)
// and the speed line.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "chat/parse.h"
#include "chat/render.h"
#include "cli/backend_options.h"
#include "cli/draft_options.h"
#include "cli/model_option.h"
#include "engine/engine.h"
#include "gen/scheduler.h"
#include "gen/turn.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::cli {

// Options both commands take.
struct TurnOptions {
  ModelOption model;   // neither -m nor --hf: the embedded default model
  std::string system;  // the system message; empty: none
  bool no_think = false;
  bool show_thinking = false;
  int max_tokens = 1024;
  std::optional<int> thinking_budget;
  std::vector<std::string> stop;
  sample::SamplingRequest sampling;
  int64_t n_ctx = 0;
  BackendOptions backend;
  DraftCliOptions draft;
};

void add_turn_options(CLI::App* sub, TurnOptions& opt);

// A load progress callback drawing a bar on stderr when it is a terminal (null otherwise).
std::function<void(uint64_t, uint64_t)> load_progress_bar();

// Error naming `what` and the offset of the first invalid byte unless `text` is valid UTF-8.
void require_utf8(std::string_view text, std::string_view what);

// The history a conversation starts from: the system message, if there is one (Error unless it
// is valid UTF-8).
chat::Json start_messages(const TurnOptions& opt);

class Session {
 public:
  // multi_turn: keep each turn's state in the prefix cache, so the next turn prefills only what
  // it adds (chat); a single turn (run) skips the snapshots.
  explicit Session(const TurnOptions& options, bool multi_turn = false);

  // Renders `messages` with the generation prompt, generates, streams to stdout and returns the
  // parsed reply. Prints prompt / generation speed to stderr.
  chat::ParsedReply reply(const chat::Json& messages, bool thinking,
                          const chat::Json& tools = nullptr);

  engine::Engine& engine() { return *engine_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  TurnOptions options_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  chat::Dialect dialect_;
  std::unique_ptr<gen::Scheduler> scheduler_;  // one sequence at a time
  int draft_depth_ = 0;                        // drafts a check at most (0: not drafting)
};

}  // namespace qwenrt::cli
