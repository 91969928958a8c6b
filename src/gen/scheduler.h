// Continuous batching: many sequences advanced together, one Engine::step_sample per iteration.
//
// A sequence is one request's life: its prompt (token ids), sampling settings, stop rules, thinking
// budget, streaming detokeniser (whole UTF-8 characters, text that could still become a stop
// string held back) and, for chat requests, the reply parser (reasoning / content / tool calls).
// The scheduler admits queued sequences while engine slots are free, builds each step's batch
// (decode rows of running sequences first, then prompt chunks up to the step's token budget),
// samples on the backend, and hands every sequence its update after the step. `run` / `chat` are
// the one-sequence case; the server runs it with many.
//
// Threads: submit, cancel, shutdown and stats may be called from any thread; step and run from one
// thread (the scheduler's). Sinks are called on the scheduler's thread and must not block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/parse.h"
#include "core/error.h"
#include "engine/engine.h"
#include "gen/draft.h"
#include "gen/generator.h"
#include "gen/prefix_cache.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::gen {

// What one sequence asks for. The prompt is already rendered and tokenized (gen/turn.h for chat).
struct SequenceParams {
  std::vector<int32_t> prompt;         // non-empty, shorter than the context
  int max_tokens = 512;                // generated tokens, forced ones included
  std::vector<std::string> stop;       // stop strings; the text stops before the first one
  bool starts_in_thinking = false;     // the prompt ends inside an open <think>
  std::optional<int> thinking_budget;  // tokens allowed inside <think> before it is closed
  // Text forced (tokenized, fed without sampling, in one step) as soon as the reply is outside the
  // think block: right after </think> (or its forced close), or first when the reply does not
  // start in one. The model continues after it (tool_choice required / named:
  // "<tool_call>\n<function=NAME>\n").
  std::string forced_after_thinking;
  sample::SamplingParams sampling;
  // -1: no log-probabilities; 0..ops::kMaxTopLogprobs: each generated token's log-probability and
  // this many most likely alternatives.
  int top_logprobs = -1;
  // Set: the generated text is also read by a chat::ReplyParser with these options.
  std::optional<chat::ReplyParserOptions> parse;
  // Draft when the scheduler drafts (SchedulerOptions::draft); the output is the same either way.
  bool draft = true;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;                        // of the raw logits (ops::SampledToken)
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};

// Handed to a sequence's sink after each step that gave it a token (a prompt chunk that does not
// end the prompt gives none), and once more (done) at its end. The done update is the last one and
// may carry text, events and tokens of its own (the step that ended it, held-back text flushed).
struct SequenceUpdate {
  uint64_t id = 0;
  std::string text;                      // newly final text (stop strings never appear)
  std::vector<chat::ReplyEvent> events;  // what the reply parser completed (parse set)
  // The tokens generated since the last update (top_logprobs >= 0), one entry per token of
  // `tokens`. A forced token (thinking budget, forced_after_thinking) was not sampled: its entry
  // has logprob 0 and no alternatives.
  std::vector<TokenLogprob> logprobs;
  std::vector<int32_t> tokens;  // the ids generated since the last update (forced included)
  bool done = false;
  // Set when done:
  FinishReason finish = FinishReason::kLength;
  std::string error;            // finish == kError: what went wrong
  chat::ParsedReply reply;      // the whole parsed reply (parse set)
  int64_t n_prompt = 0;         // prompt tokens
  int64_t n_cached = 0;         // prompt tokens restored from the prefix cache, not prefilled
  int64_t n_generated = 0;      // generated tokens (forced included, stop token excluded)
  int64_t n_drafted = 0;        // drafted tokens checked (speculative decoding)
  int64_t n_accepted = 0;       // of those, accepted
  int64_t n_checks = 0;         // steps that checked drafts
  double queue_seconds = 0;     // submit to admission
  double prompt_seconds = 0;    // admission to the first generated token
  double generate_seconds = 0;  // first generated token to the end
};
using Sink = std::function<void(SequenceUpdate&&)>;

struct SchedulerOptions {
  int max_queue = 256;  // sequences waiting for a slot; submit beyond that throws QueueFull
  // Token budget of one step: decode rows first (every running sequence's, even beyond the
  // budget), then prompt chunks in admission order up to it.
  int step_tokens = 512;
  // The prefix cache (gen/prefix_cache.h): a sequence resumes from the longest cached prefix of
  // its prompt. Snapshots are taken where the prompt's last message starts (<|im_start|>: where
  // the next turn's history diverges when the template rewrites the reply; a prompt without one:
  // at its end),
  // where its second message starts (the end of a system prompt other conversations share),
  // every cache.snapshot_every_pages KV pages inside long prompts, and at the end of each reply.
  // A prompt chunk ends at each of those positions (a snapshot is taken between steps).
  bool prefix_cache = false;
  PrefixCacheOptions cache;
  // Speculative decoding (gen/draft.h): a decoding sequence's drafts are extra rows of its span
  // in the step; the engine needs verify_rows >= draft.max_tokens + 1. Besides each sequence's
  // depth controller, the scheduler times decode-only steps: when steps with checks cost more per
  // generated token than steps without, drafting pauses for 256 steps, then is measured again.
  // Timing decides only whether to draft, never what is generated.
  DraftOptions draft;
};

struct SchedulerStats {
  int running = 0;
  int queued = 0;
  int64_t kv_pages_in_use = 0;  // held by running sequences (trunk and MTP tracks)
  int64_t kv_pages_cached = 0;  // held only by the prefix cache
  uint64_t submitted = 0, finished = 0, cancelled = 0;  // finished: every end, cancelled included
  uint64_t prompt_tokens = 0, generated_tokens = 0;     // totals since start (prefilled prompt)
  uint64_t drafted_tokens = 0, accepted_tokens = 0;     // speculative decoding, since start
  PrefixCacheStats cache;                               // zeros with the cache off
};

// submit() when the queue is full (the server answers 429).
class QueueFull : public Error {
 public:
  using Error::Error;
};
// submit() after shutdown() (the server answers 503).
class ShuttingDown : public Error {
 public:
  using Error::Error;
};

class Scheduler {
 public:
  // The engine's slots are the sequences that can run at once.
  Scheduler(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
            SchedulerOptions options = {});
  // Sequences still queued or running get no done update; their slots are emptied.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates (empty prompt, prompt too long for the context, empty stop string, top_logprobs out
  // of range: Error naming the problem) and queues; returns the sequence's id. QueueFull,
  // ShuttingDown as above.
  uint64_t submit(SequenceParams params, Sink sink);
  // The sequence ends with FinishReason::kCancelled before or at the next step, its slot freed;
  // unknown or finished ids are ignored.
  void cancel(uint64_t id);
  // One iteration on the calling thread: admit, one engine step over all running sequences,
  // deliver updates. Returns false when nothing was running or queued (nothing was done).
  bool step();
  // Steps until shutdown() (and, with drain, until the running and queued sequences end); sleeps
  // while idle.
  void run();
  // Stops accepting; drain: run() returns when everything submitted has finished; otherwise
  // everything still running or queued is cancelled.
  void shutdown(bool drain);
  SchedulerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qwenrt::gen
