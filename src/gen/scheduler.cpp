#include "gen/scheduler.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "core/log.h"
#include "gen/defaults.h"

namespace qwenrt::gen {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
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

// One request's life from submit to its done update.
struct Sequence {
  Sequence(uint64_t id_, SequenceParams params_, Sink sink_, const tokenizer::Tokenizer& tokenizer)
      : id(id_),
        params(std::move(params_)),
        sink(std::move(sink_)),
        sampler(params.sampling),
        thinking(params.starts_in_thinking),
        decoder(tokenizer) {
    if (params.parse) parser.emplace(*params.parse);
  }

  bool prefilling() const { return n_prompt_fed < params.prompt.size(); }

  uint64_t id;
  SequenceParams params;
  Sink sink;
  sample::Sampler sampler;
  std::vector<int32_t> forced_after_thinking;  // params.forced_after_thinking as tokens
  int slot = -1;
  size_t n_prompt_fed = 0;  // prompt tokens the engine holds
  int64_t n_cached = 0;     // of those, restored from the prefix cache
  // Prompt positions where a snapshot goes into the prefix cache (ascending, after n_cached);
  // a prompt chunk ends at each.
  std::vector<int64_t> points;
  size_t next_point = 0;
  int64_t position = 0;  // where the next fed token goes
  // Decoding: the accepted tokens the next step feeds; a run of forced tokens goes in at once
  // (one step, its last row sampling), not a step per token.
  std::vector<int32_t> feed;
  std::deque<int32_t> forced;      // tokens to accept without sampling (moved to feed at once)
  std::vector<int32_t> generated;  // forced included, stop token excluded (the penalties' history)
  bool thinking;
  int thinking_tokens = 0;
  tokenizer::StreamDecoder decoder;
  std::string pending;  // decoded text not yet emitted (may hold a stop-string prefix)
  std::optional<chat::ReplyParser> parser;
  SequenceUpdate update;  // what the current step produced
  Clock::time_point t_submit, t_admit, t_first;
  bool has_first = false;
  // Speculative decoding: the drafts of the step being built, the penalties' history with them
  // (row i of the check counts drafts[0..i)), the generator before each of the check's draws.
  DraftController controller;
  std::vector<int32_t> drafts;
  std::vector<int32_t> draft_history;
  std::vector<uint64_t> rng_marks;
  int64_t n_drafted = 0, n_accepted = 0, n_checks = 0;
  bool checking = false;  // the slot still holds every row of the check being taken
  int draft_depth = 0;    // the drafts the step being built wants
  // MTP drafting (DraftKind::kMtp): the trunk position of the next MTP row to feed (row p pairs
  // the trunk's hidden state at p with the token at p + 1); the draft the last fed row made (for
  // the position after the token to feed) and that row's output hidden state, the chain's input.
  bool mtp = false;
  int64_t mtp_next = 0;
  std::optional<int32_t> mtp_first;
  std::vector<float> mtp_hidden;
  int64_t mtp_base = 0;       // the MTP track's length before this step's chain
  bool snapshot_due = false;  // a prompt snapshot waits for the step's MTP rows
};

// A sequence's part of the step being built.
struct Entry {
  Sequence* seq;
  bool samples;     // its last row wants a sampled token
  bool gets_token;  // the step ends its input (a decode row or the prompt's last chunk)
  int32_t n_rows;
  int32_t n_drafts = 0;        // of those rows, drafts (each samples, as does the row before them)
  int64_t first_position = 0;  // of its first row
  int64_t hidden_row = -1;     // its first row's in the step's hidden states (-1: none asked)
};

}  // namespace

struct Scheduler::Impl {
  Impl(engine::Engine& engine_, const tokenizer::Tokenizer& tokenizer_, SchedulerOptions options_)
      : engine(engine_), tokenizer(tokenizer_), options(options_) {
    if (options.step_tokens < 1)
      fail("scheduler: step_tokens must be >= 1, got {}", options.step_tokens);
    if (options.max_queue < 0) fail("scheduler: max_queue must be >= 0, got {}", options.max_queue);
    for (const auto& stop : stop_tokens(tokenizer)) stop_ids.push_back(stop.second);
    if (stop_ids.empty())
      fail("tokenizer has neither <|im_end|> nor <|endoftext|>: generation could not stop");
    think_end = tokenizer.token_id("</think>");
    if (think_end) close_thinking = tokenizer.encode("\n</think>\n\n", true);
    const int n_slots = engine.states().n_slots();
    slots.resize(n_slots);
    im_start = tokenizer.token_id("<|im_start|>");
    if (options.prefix_cache) cache.emplace(engine.states(), options.cache);
    if (options.draft.kind != DraftKind::kNone) {
      const int rows = engine.states().history_rows() + 1;
      if (options.draft.max_tokens < 1 || options.draft.max_tokens + 1 > rows) {
        fail("scheduler: {} drafts per check need the engine's verify_rows >= {} (it has {})",
             options.draft.max_tokens, options.draft.max_tokens + 1, rows);
      }
      if (options.draft.ngram_min < 1 || options.draft.ngram_max < options.draft.ngram_min) {
        fail("scheduler: n-gram sizes {}..{} are not a range of positive sizes",
             options.draft.ngram_min, options.draft.ngram_max);
      }
      if (options.draft.kind == DraftKind::kMtp && !engine.has_mtp()) {
        fail("MTP drafting needs the model's MTP block (nextn layers); {} has none",
             engine.file().path());
      }
    }
  }

  ~Impl() {
    // Sequences still here get no done update (their sinks may be gone); their slots are emptied.
    for (auto& s : slots) {
      if (s) engine.states().reset(s->slot);
    }
    cache.reset();  // its snapshots go back to the state store before the store can go
  }

  std::unique_ptr<Sequence> make_sequence(SequenceParams params, Sink sink);
  // Admits, cancels, runs one engine step and finishes what ended; fills `out` with the updates
  // to deliver (outside the lock).
  bool iterate(std::vector<std::pair<Sink*, SequenceUpdate>>& out);
  void admit(Sequence& seq);
  // Whether `seq` should wait for a running sequence whose prompt shares a longer prefix with it
  // to reach a snapshot point (then it resumes from there instead of prefilling it too).
  bool worth_waiting(const Sequence& seq) const;
  void cache_reply(Sequence& seq);
  void cache_tokens(Sequence& seq, std::span<const int32_t> tokens);
  void take(Sequence& seq, int32_t token, const ops::SampledToken* sampled);
  // The drafts the sequence's next decode step checks (into seq.drafts; an MTP chain gets its
  // first draft there and the rest from chain_mtp_drafts); their count.
  int32_t make_drafts(Sequence& seq);
  // Extends every sequence's MTP drafts to its depth: one MTP forward per drafted position for
  // all of them at once, each row the previous draft and the MTP block's own output hidden state;
  // then drops those rows from the MTP track.
  void chain_mtp_drafts();
  // After a step: feeds the MTP block the rows of every position the trunk now holds (the trunk's
  // hidden state at p and the token at p + 1), and takes the first draft of the next step from
  // the last of them.
  void feed_mtp();
  int32_t token_at(const Sequence& seq, int64_t position) const {
    const auto np = static_cast<int64_t>(seq.params.prompt.size());
    return position < np ? seq.params.prompt[position] : seq.generated[position - np];
  }
  // After a check: takes the sampled tokens while they equal the drafts, then rolls the slot
  // back to what was accepted. `first` indexes the check's first sampled token.
  void check_drafts(Sequence& seq, const Entry& e, size_t first);
  void accept(Sequence& seq, int32_t token, const ops::SampledToken* sampled);
  void emit(Sequence& seq, size_t n);
  void finish(Sequence& seq, FinishReason reason, std::string error = {});
  void release(Sequence& seq);
  int64_t kv_pages() const {
    return engine.states().pages_held_by_slots(state::Track::kTrunk) +
           engine.states().pages_held_by_slots(state::Track::kMtp);
  }
  int64_t kv_pages_cached() const {
    return engine.states().pages_in_use(state::Track::kTrunk) +
           engine.states().pages_in_use(state::Track::kMtp) - kv_pages();
  }

  engine::Engine& engine;
  const tokenizer::Tokenizer& tokenizer;
  SchedulerOptions options;
  std::vector<int32_t> stop_ids;
  std::optional<int32_t> think_end;
  std::vector<int32_t> close_thinking;  // "\n</think>\n\n" as tokens
  std::optional<int32_t> im_start;
  std::optional<PrefixCache> cache;

  // Guarded by mutex: the queue, cancel requests, the flags and the counters.
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> queue;
  std::unordered_set<uint64_t> cancel_requests;
  bool shutting_down = false, drain = false;
  uint64_t next_id = 1;
  SchedulerStats stats;

  // The scheduler thread's own (running ones are also counted in stats.running under the lock).
  std::vector<std::unique_ptr<Sequence>> slots;  // by engine slot; null = free
  std::vector<Sequence*> order;                  // running sequences in admission order
  std::vector<std::unique_ptr<Sequence>> ended;  // finished this step, delivered after it
  engine::Batch batch;
  std::vector<Entry> entries;
  std::vector<ops::SamplingRow> rows;
  std::vector<ops::SampledToken> sampled;
  std::vector<float> hidden;  // the step's hidden states of the MTP drafters' rows
  engine::MtpBatch mtp_batch;
  std::vector<int32_t> mtp_drafts;
  std::vector<float> mtp_out;  // the MTP rows' output hidden states
  std::vector<Sequence*> mtp_rows_of;
  // Whether checks pay on this engine: seconds per generated token of decode-only steps with and
  // without checks (moving averages). When checks cost more per token than plain steps, drafting
  // pauses for kCostPauseSteps steps, then is measured again.
  struct DraftCost {
    double plain = 0, check = 0;
    int n_plain = 0, n_check = 0;
    int paused = 0;
  } draft_cost;
  static constexpr int kCostSamples = 4;
  static constexpr int kCostPauseSteps = 256;
  void record_step_cost(bool checked, double seconds, uint64_t tokens);
};

void Scheduler::Impl::record_step_cost(bool checked, double seconds, uint64_t tokens) {
  if (tokens == 0) return;
  DraftCost& c = draft_cost;
  const double per_token = seconds / static_cast<double>(tokens);
  double& avg = checked ? c.check : c.plain;
  int& n = checked ? c.n_check : c.n_plain;
  avg = n == 0 ? per_token : 0.8 * avg + 0.2 * per_token;
  ++n;
  if (c.n_check >= kCostSamples && c.n_plain >= kCostSamples && c.check > c.plain) {
    c.paused = kCostPauseSteps;
    c.n_check = 0;  // measured afresh after the pause
  }
}

std::unique_ptr<Sequence> Scheduler::Impl::make_sequence(SequenceParams params, Sink sink) {
  const auto& p = params;
  if (p.prompt.empty()) fail("the prompt is empty");
  const int64_t n_ctx = engine.states().n_ctx();
  if (static_cast<int64_t>(p.prompt.size()) >= n_ctx) {
    fail("the prompt has {} tokens; the context holds {} (prompt + at least one generated token)",
         p.prompt.size(), n_ctx);
  }
  const int32_t n_vocab = engine.config().n_vocab;
  for (size_t i = 0; i < p.prompt.size(); ++i) {
    if (p.prompt[i] < 0 || p.prompt[i] >= n_vocab)
      fail("prompt token {}: id {} is outside the vocabulary of {}", i, p.prompt[i], n_vocab);
  }
  if (p.max_tokens < 1) fail("max_tokens must be at least 1, got {}", p.max_tokens);
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) fail("stop string {} is empty (stop strings must not be empty)", i);
  }
  if (p.top_logprobs < -1 || p.top_logprobs > ops::kMaxTopLogprobs) {
    fail("top_logprobs must be in [0, {}] (or -1 for none), got {}", ops::kMaxTopLogprobs,
         p.top_logprobs);
  }
  for (const auto& [id, bias] : p.sampling.logit_bias) {
    if (id < 0 || id >= n_vocab)
      fail("logit_bias: token id {} is outside the vocabulary of {}", id, n_vocab);
  }
  if (p.thinking_budget && !think_end)
    fail("thinking budget set but the vocabulary has no </think>");
  if (p.thinking_budget && *p.thinking_budget < 0)
    fail("thinking budget must be >= 0, got {}", *p.thinking_budget);
  auto seq = std::make_unique<Sequence>(0, std::move(params), std::move(sink), tokenizer);
  if (options.draft.kind != DraftKind::kNone && seq->params.draft)
    seq->controller = DraftController(options.draft.max_tokens);
  seq->mtp = options.draft.kind == DraftKind::kMtp && seq->params.draft;
  if (!seq->params.forced_after_thinking.empty())
    seq->forced_after_thinking = tokenizer.encode(seq->params.forced_after_thinking, true);
  return seq;
}

void Scheduler::Impl::admit(Sequence& seq) {
  engine.states().reset(seq.slot);
  seq.t_admit = Clock::now();
  seq.position = 0;
  if (cache) {
    const auto& prompt = seq.params.prompt;
    const int64_t n = cache->restore_longest(seq.slot, prompt);
    seq.n_prompt_fed = static_cast<size_t>(n);
    seq.position = n;
    seq.n_cached = n;
    const auto size = static_cast<int64_t>(prompt.size());
    const int64_t every = int64_t{options.cache.snapshot_every_pages} * engine.states().page_size();
    bool ends_in_message = false;
    for (int64_t p = every; every > 0 && p < size; p += every) seq.points.push_back(p);
    if (im_start) {
      // Where the last message starts (the generation prompt), and where the second one does:
      // the end of a system prompt (and tools) other conversations share.
      const auto last = std::find(prompt.rbegin(), prompt.rend(), *im_start);
      if (last != prompt.rend()) {
        seq.points.push_back(prompt.rend() - last - 1);
        ends_in_message = true;
      }
      const auto first = std::find(prompt.begin(), prompt.end(), *im_start);
      if (first != prompt.end()) {
        const auto second = std::find(first + 1, prompt.end(), *im_start);
        if (second != prompt.end()) seq.points.push_back(second - prompt.begin());
      }
    }
    // The prompt's end only when it is not the generation prompt after a message: that one is a
    // few tokens past the last <|im_start|>, and a snapshot there would hold a page of its own.
    if (!ends_in_message) seq.points.push_back(size);
    std::sort(seq.points.begin(), seq.points.end());
    seq.points.erase(std::unique(seq.points.begin(), seq.points.end()), seq.points.end());
    seq.points.erase(seq.points.begin(), std::upper_bound(seq.points.begin(), seq.points.end(), n));
  }
  // The MTP rows go on from the restored prefix (its snapshot has the MTP rows that were fed when
  // it was taken; one missing there, the reply's last, only makes drafts a little worse).
  seq.mtp_next = seq.position;
  seq.mtp_first.reset();
  // What the reply starts with when it starts outside a think block, or when a zero budget
  // closes the block at once.
  if (!seq.thinking) {
    seq.forced.assign(seq.forced_after_thinking.begin(), seq.forced_after_thinking.end());
  } else if (seq.params.thinking_budget && *seq.params.thinking_budget == 0) {
    seq.forced.assign(close_thinking.begin(), close_thinking.end());
  }
}

bool Scheduler::Impl::worth_waiting(const Sequence& seq) const {
  const auto& prompt = seq.params.prompt;
  const int64_t have = cache->longest(prompt);
  for (const Sequence* r : order) {
    if (!r->prefilling()) continue;
    const auto& other = r->params.prompt;
    const auto common = static_cast<int64_t>(
        std::mismatch(prompt.begin(), prompt.end(), other.begin(), other.end()).first -
        prompt.begin());
    const int64_t usable = std::min<int64_t>(common, static_cast<int64_t>(prompt.size()) - 1);
    // r's last snapshot point within the shared prefix, not reached yet.
    for (auto p = r->points.rbegin(); p != r->points.rend(); ++p) {
      if (*p > usable) continue;
      if (*p > static_cast<int64_t>(r->n_prompt_fed) && *p >= have + engine.states().page_size())
        return true;
      break;
    }
  }
  return false;
}

// The reply's end into the prefix cache: the slot holds the prompt and the generated tokens fed
// so far (the last accepted one is not fed yet).
void Scheduler::Impl::cache_reply(Sequence& seq) {
  const auto n_prompt = static_cast<int64_t>(seq.params.prompt.size());
  const int64_t n_fed =
      std::min<int64_t>(seq.position - n_prompt, static_cast<int64_t>(seq.generated.size()));
  if (n_fed <= 0 || seq.prefilling()) return;
  std::vector<int32_t> tokens(seq.params.prompt);
  tokens.insert(tokens.end(), seq.generated.begin(), seq.generated.begin() + n_fed);
  cache_tokens(seq, tokens);
}

// A failed snapshot (out of memory) costs the cache an entry, never the sequence.
void Scheduler::Impl::cache_tokens(Sequence& seq, std::span<const int32_t> tokens) {
  try {
    cache->insert(seq.slot, tokens);
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, "prefix cache: {} tokens of sequence {} not cached: {}", tokens.size(),
        seq.id, e.what());
  }
}

void Scheduler::Impl::emit(Sequence& seq, size_t n) {
  if (n == 0) return;
  std::string out = seq.pending.substr(0, n);
  seq.pending.erase(0, n);
  if (seq.parser) {
    for (auto& e : seq.parser->feed(out)) seq.update.events.push_back(std::move(e));
  }
  seq.update.text += out;
}

// The token the sequence produced (sampled, or forced when `sampled` is null), then every forced
// token that follows it.
void Scheduler::Impl::take(Sequence& seq, int32_t token, const ops::SampledToken* sampled) {
  accept(seq, token, sampled);
  while (!seq.update.done && !seq.forced.empty()) {
    const int32_t next = seq.forced.front();
    seq.forced.pop_front();
    accept(seq, next, nullptr);
  }
}

// One token: the generation semantics gen::Generator had (stop tokens and strings, thinking,
// max tokens, the context).
void Scheduler::Impl::accept(Sequence& seq, int32_t token, const ops::SampledToken* sampled) {
  if (!seq.has_first) {
    seq.has_first = true;
    seq.t_first = Clock::now();
  }
  if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
    finish(seq, FinishReason::kStopToken);
    return;
  }
  seq.generated.push_back(token);
  seq.update.tokens.push_back(token);
  if (seq.params.top_logprobs >= 0) {
    TokenLogprob lp{.id = token};
    if (sampled) {
      lp.logprob = sampled->logprob;
      const int n = std::min(seq.params.top_logprobs, sampled->n_top);
      for (int i = 0; i < n; ++i)
        lp.top.emplace_back(sampled->top_ids[i], sampled->top_logprobs[i]);
    }
    seq.update.logprobs.push_back(std::move(lp));
  }
  if (seq.thinking) {
    if (think_end && token == *think_end) {
      seq.thinking = false;
      seq.forced.insert(seq.forced.end(), seq.forced_after_thinking.begin(),
                        seq.forced_after_thinking.end());
    } else if (++seq.thinking_tokens == seq.params.thinking_budget.value_or(-1) &&
               seq.forced.empty()) {
      seq.forced.assign(close_thinking.begin(), close_thinking.end());
    }
  }
  seq.pending += seq.decoder.push(token);
  bool hit = false;
  for (const auto& s : seq.params.stop) {
    if (size_t at = seq.pending.find(s); at != std::string::npos) {
      seq.pending.resize(at);
      hit = true;
    }
  }
  if (hit) {
    emit(seq, seq.pending.size());
    finish(seq, FinishReason::kStopString);
    return;
  }
  emit(seq, seq.pending.size() - held_back(seq.pending, seq.params.stop));
  // Where this token would be fed; the context full (prompt + generated = n_ctx) is length too.
  const int64_t at = seq.position + static_cast<int64_t>(seq.feed.size());
  if (static_cast<int>(seq.generated.size()) >= seq.params.max_tokens ||
      at + 1 >= engine.states().n_ctx()) {
    finish(seq, FinishReason::kLength);
    return;
  }
  seq.feed.push_back(token);
}

int32_t Scheduler::Impl::make_drafts(Sequence& seq) {
  seq.drafts.clear();
  if (!seq.forced.empty() || draft_cost.paused > 0) return 0;
  int depth = seq.controller.depth();
  // Room: the drafts and the token after them must fit max_tokens and the context.
  const int64_t left_tokens = seq.params.max_tokens - static_cast<int64_t>(seq.generated.size());
  const int64_t left_ctx = engine.states().n_ctx() - (seq.position + 1) - 1;
  depth = static_cast<int>(std::min<int64_t>({depth, left_tokens - 1, left_ctx}));
  if (depth <= 0) return 0;
  // A draft may not run into a thinking budget's forced close (the close replaces what follows).
  if (seq.thinking && seq.params.thinking_budget) {
    depth = std::min(depth, *seq.params.thinking_budget - seq.thinking_tokens - 1);
    if (depth <= 0) return 0;
  }
  const DraftOptions& o = options.draft;
  if (o.kind == DraftKind::kMtp) {
    if (seq.mtp_first) {
      seq.drafts.push_back(*seq.mtp_first);
      seq.draft_depth = depth;
    }
    return static_cast<int32_t>(seq.drafts.size());
  }
  draft_ngram(seq.params.prompt, seq.generated, o.ngram_min, o.ngram_max, depth, seq.drafts);
  return static_cast<int32_t>(seq.drafts.size());
}

void Scheduler::Impl::chain_mtp_drafts() {
  const int64_t e = engine.config().n_embd;
  for (Sequence* s : order) s->mtp_base = engine.states().n_mtp_tokens(s->slot);
  try {
    for (size_t j = 1;; ++j) {  // each chained row drafts the (j + 1)-th token
      mtp_batch.clear();
      mtp_rows_of.clear();
      for (Sequence* s : order) {
        if (s->drafts.size() != j || s->draft_depth <= static_cast<int>(j)) continue;
        mtp_batch.add(s->slot, s->drafts.back(),
                      static_cast<int32_t>(engine.states().n_mtp_tokens(s->slot)), s->mtp_hidden,
                      true);
        mtp_rows_of.push_back(s);
      }
      if (mtp_rows_of.empty()) break;
      engine.mtp_draft(mtp_batch, mtp_drafts, mtp_out);
      for (size_t i = 0; i < mtp_rows_of.size(); ++i) {
        mtp_rows_of[i]->drafts.push_back(mtp_drafts[i]);
        mtp_rows_of[i]->mtp_hidden.assign(mtp_out.begin() + i * e, mtp_out.begin() + (i + 1) * e);
      }
    }
  } catch (const std::exception& ex) {  // drafts are optional: this step runs plain
    log(LogLevel::kWarn, "scheduler: an MTP draft step failed: {}", ex.what());
    for (Sequence* s : order) s->drafts.clear();
  }
  // Those rows paired drafts with the MTP block's own states: the positions the check accepts
  // are fed again from the trunk's hidden states after the step (feed_mtp).
  for (Sequence* s : order) {
    if (engine.states().n_mtp_tokens(s->slot) > s->mtp_base)
      engine.truncate_mtp(s->slot, s->mtp_base);
  }
}

void Scheduler::Impl::feed_mtp() {
  const int64_t e = engine.config().n_embd;
  mtp_batch.clear();
  mtp_rows_of.clear();
  for (const Entry& en : entries) {
    Sequence& s = *en.seq;
    if (en.hidden_row < 0 || s.slot < 0) continue;  // not drafting with the MTP block, or ended
    s.mtp_first.reset();
    // Rows p < end: the trunk holds p (its hidden state came from this step) and the token at
    // p + 1 is known (the one to feed next, for the last).
    const int64_t text = static_cast<int64_t>(s.params.prompt.size() + s.generated.size());
    const int64_t end = std::min(engine.states().n_tokens(s.slot), text - 1);
    if (s.mtp_next < en.first_position) s.mtp_next = en.first_position;  // (not after admit)
    if (s.mtp_next >= end) continue;
    // The next step may draft: the last row's logits give its first draft.
    const bool first = !s.prefilling() && s.feed.size() == 1 && s.forced.empty() &&
                       draft_cost.paused == 0 && s.controller.drafts_next();
    auto position = static_cast<int32_t>(engine.states().n_mtp_tokens(s.slot));
    for (int64_t p = s.mtp_next; p < end; ++p) {
      const float* h = hidden.data() + (en.hidden_row + p - en.first_position) * e;
      mtp_batch.add(s.slot, token_at(s, p + 1), position++, std::span(h, e), first && p + 1 == end);
    }
    s.mtp_next = end;
    if (first) mtp_rows_of.push_back(&s);
  }
  if (mtp_batch.size() == 0) return;
  engine.mtp_draft(mtp_batch, mtp_drafts, mtp_out);
  for (size_t i = 0; i < mtp_rows_of.size(); ++i) {
    mtp_rows_of[i]->mtp_first = mtp_drafts[i];
    mtp_rows_of[i]->mtp_hidden.assign(mtp_out.begin() + i * e, mtp_out.begin() + (i + 1) * e);
  }
}

void Scheduler::Impl::check_drafts(Sequence& seq, const Entry& e, size_t first) {
  seq.checking = true;
  seq.feed.clear();
  seq.position += 1;  // the fed token
  int used = 0, accepted = 0;
  for (int32_t i = 0; i <= e.n_drafts; ++i) {
    const ops::SampledToken& t = sampled.at(first + i);
    ++used;
    take(seq, t.id, &t);
    if (seq.update.done) break;
    // The next row fed drafts[i]: it holds only if that is the token taken, with nothing forced
    // after it.
    if (i == e.n_drafts || seq.drafts[i] != t.id || seq.feed.size() != 1) break;
    seq.feed.clear();
    seq.position += 1;
    ++accepted;
  }
  ++seq.n_checks;
  seq.n_drafted += e.n_drafts;
  seq.n_accepted += accepted;
  seq.controller.record(e.n_drafts, accepted);
  seq.sampler.set_rng_state(seq.rng_marks.at(used));
  if (seq.checking) {  // (finish rolled back already when a token ended the sequence)
    engine.rollback(seq.slot, seq.position);
    seq.checking = false;
  }
}

void Scheduler::Impl::finish(Sequence& seq, FinishReason reason, std::string error) {
  const auto now = Clock::now();
  if (seq.checking) {  // a check's token ended it: the slot keeps what was taken (prefix cache)
    engine.rollback(seq.slot, seq.position);
    seq.checking = false;
  }
  if (reason != FinishReason::kStopString) {
    seq.pending += seq.decoder.finish();
    emit(seq, seq.pending.size());
  }
  auto& u = seq.update;
  if (seq.parser) {
    for (auto& e : seq.parser->finish()) u.events.push_back(std::move(e));
    u.reply = seq.parser->result();
  }
  u.done = true;
  u.finish = reason;
  u.error = std::move(error);
  u.n_prompt = static_cast<int64_t>(seq.params.prompt.size());
  u.n_cached = seq.n_cached;
  u.n_generated = static_cast<int64_t>(seq.generated.size());
  u.n_drafted = seq.n_drafted;
  u.n_accepted = seq.n_accepted;
  u.n_checks = seq.n_checks;
  const bool completed = reason == FinishReason::kStopToken ||
                         reason == FinishReason::kStopString || reason == FinishReason::kLength;
  if (cache && completed && seq.slot >= 0) cache_reply(seq);
  if (seq.slot >= 0) {
    u.queue_seconds = seconds_between(seq.t_submit, seq.t_admit);
    u.prompt_seconds = seconds_between(seq.t_admit, seq.has_first ? seq.t_first : now);
    u.generate_seconds = seq.has_first ? seconds_between(seq.t_first, now) : 0.0;
  } else {
    u.queue_seconds = seconds_between(seq.t_submit, now);
  }
  release(seq);
}

// Frees the slot; the sequence moves to `ended` (its done update goes out after the step).
void Scheduler::Impl::release(Sequence& seq) {
  if (seq.slot < 0) return;  // never admitted: the caller moved it out of the queue
  engine.states().reset(seq.slot);
  order.erase(std::find(order.begin(), order.end(), &seq));
  ended.push_back(std::move(slots[seq.slot]));
  seq.slot = -1;
}

bool Scheduler::Impl::iterate(std::vector<std::pair<Sink*, SequenceUpdate>>& out) {
  std::vector<std::unique_ptr<Sequence>> cancelled_queued;
  std::vector<Sequence*> cancelled_running;
  {
    std::lock_guard lock(mutex);
    if (queue.empty() && order.empty()) {
      cancel_requests.clear();
      return false;
    }
    const bool cancel_all = shutting_down && !drain;
    for (auto it = queue.begin(); it != queue.end();) {
      if (cancel_all || cancel_requests.count((*it)->id)) {
        cancel_requests.erase((*it)->id);
        cancelled_queued.push_back(std::move(*it));
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
    for (Sequence* s : order) {
      if (cancel_all || cancel_requests.count(s->id)) {
        cancel_requests.erase(s->id);
        cancelled_running.push_back(s);
      }
    }
    cancel_requests.clear();  // the rest name sequences that have ended
    // Free slots take queued sequences in order; with the prefix cache, one that would prefill
    // what a running sequence is about to snapshot waits for it (and the next one goes first).
    auto next = queue.begin();
    for (int slot = 0; slot < static_cast<int>(slots.size()) && next != queue.end(); ++slot) {
      if (slots[slot]) continue;
      while (next != queue.end() && cache && worth_waiting(**next)) ++next;
      if (next == queue.end()) break;
      slots[slot] = std::move(*next);
      next = queue.erase(next);
      slots[slot]->slot = slot;
      order.push_back(slots[slot].get());
      admit(*slots[slot]);  // here: the next candidate's worth_waiting sees its snapshot points
    }
    stats.queued = static_cast<int>(queue.size());
    stats.running = static_cast<int>(order.size());
  }
  for (auto& s : cancelled_queued) {
    finish(*s, FinishReason::kCancelled);
    ended.push_back(std::move(s));
  }
  for (Sequence* s : cancelled_running) finish(*s, FinishReason::kCancelled);

  // The batch: decode rows of running sequences first, then prompt chunks up to the budget.
  batch.clear();
  entries.clear();
  rows.clear();
  int n_top = 0;
  uint64_t prompt_rows = 0;
  int64_t hidden_rows = 0;
  // The MTP drafter's rows asked for every row's hidden state (feed_mtp after the step).
  auto ask_hidden = [&](Sequence& s, Entry& e) {
    if (!s.mtp) return;
    batch.hidden_slots.push_back(s.slot);
    e.hidden_row = hidden_rows;
    hidden_rows += e.n_rows;
  };
  const auto t_chain = Clock::now();
  for (Sequence* s : order) {
    s->drafts.clear();
    s->draft_depth = 0;
    if (!s->prefilling() && s->feed.size() == 1) make_drafts(*s);
  }
  if (options.draft.kind == DraftKind::kMtp) chain_mtp_drafts();
  const double chain_seconds = seconds_between(t_chain, Clock::now());
  for (Sequence* s : order) {
    if (s->prefilling()) continue;
    const int32_t n = static_cast<int32_t>(s->feed.size());
    for (int32_t i = 0; i < n; ++i)
      batch.add(s->slot, s->feed[i], static_cast<int32_t>(s->position + i), i + 1 == n);
    const auto k = static_cast<int32_t>(s->drafts.size());
    for (int32_t i = 0; i < k; ++i)
      batch.add(s->slot, s->drafts[i], static_cast<int32_t>(s->position + n + i), true);
    if (k > 0) batch.keep_states.push_back(s->slot);
    entries.push_back({.seq = s,
                       .samples = true,
                       .gets_token = true,
                       .n_rows = n + k,
                       .n_drafts = k,
                       .first_position = s->position});
    ask_hidden(*s, entries.back());
  }
  for (Sequence* s : order) {
    const int64_t room = options.step_tokens - static_cast<int64_t>(batch.size());
    if (room <= 0) break;
    if (!s->prefilling()) continue;
    size_t n = std::min<size_t>(room, s->params.prompt.size() - s->n_prompt_fed);
    if (s->next_point < s->points.size())  // the chunk ends at the next snapshot point
      n = std::min<size_t>(n, s->points[s->next_point] - s->n_prompt_fed);
    const bool last = s->n_prompt_fed + n == s->params.prompt.size();
    const bool samples = last && s->forced.empty();
    for (size_t j = s->n_prompt_fed; j < s->n_prompt_fed + n; ++j) {
      batch.add(s->slot, s->params.prompt[j], static_cast<int32_t>(j),
                samples && j + 1 == s->params.prompt.size());
    }
    entries.push_back({.seq = s,
                       .samples = samples,
                       .gets_token = last,
                       .n_rows = static_cast<int32_t>(n),
                       .first_position = s->position});
    ask_hidden(*s, entries.back());
    prompt_rows += n;
  }
  // Sampling rows in batch order; their history spans stay valid until the step returns.
  for (const Entry& e : entries) {
    if (!e.samples) continue;
    Sequence& q = *e.seq;
    n_top = std::max(n_top, q.params.top_logprobs);
    if (e.n_drafts == 0) {
      rows.push_back(q.sampler.next_row(q.generated));
      continue;
    }
    // The check's rows: row i's penalties count the drafts before it.
    q.draft_history.assign(q.generated.begin(), q.generated.end());
    q.draft_history.insert(q.draft_history.end(), q.drafts.begin(), q.drafts.begin() + e.n_drafts);
    q.rng_marks.clear();
    for (int32_t i = 0; i <= e.n_drafts; ++i) {
      q.rng_marks.push_back(q.sampler.rng_state());
      rows.push_back(q.sampler.next_row(std::span(q.draft_history).first(q.generated.size() + i)));
    }
    q.rng_marks.push_back(q.sampler.rng_state());
  }

  Clock::time_point t_step = Clock::now();
  if (draft_cost.paused > 0) --draft_cost.paused;
  bool checked = false;
  for (const Entry& e : entries) checked = checked || e.n_drafts > 0;
  uint64_t generated_before = 0, drafted = 0, accepted = 0;
  for (const Entry& e : entries) {
    generated_before += e.seq->generated.size();
    drafted -= e.seq->n_drafted;
    accepted -= e.seq->n_accepted;
  }
  if (batch.size() > 0) {
    bool failed = false;
    std::string error;
    if (cache) {  // the pages this step may take (a new page per page of rows, one copied)
      const int64_t page = engine.states().page_size();
      int64_t pages = 0;
      for (const Entry& e : entries) pages += (e.n_rows + page - 1) / page + 1;
      cache->make_room(pages);
    }
    t_step = Clock::now();
    try {
      engine.step_sample(batch, rows, n_top, sampled, &hidden);
    } catch (const std::exception& ex) {
      failed = true;
      error = ex.what();
    }
    if (failed) {
      log(LogLevel::kWarn, "scheduler: a step of {} rows failed: {}", batch.size(), error);
      for (const Entry& e : entries) finish(*e.seq, FinishReason::kError, error);
      prompt_rows = 0;
    } else {
      size_t k = 0;
      for (const Entry& e : entries) {
        Sequence& s = *e.seq;
        if (s.prefilling()) {
          s.n_prompt_fed += e.n_rows;
          if (cache && s.next_point < s.points.size() &&
              static_cast<int64_t>(s.n_prompt_fed) == s.points[s.next_point]) {
            ++s.next_point;
            if (s.mtp) {
              s.snapshot_due = true;  // once the MTP block has the chunk's rows
            } else {
              cache_tokens(s, std::span(s.params.prompt).first(s.n_prompt_fed));
            }
          }
        } else {
          s.feed.clear();
        }
        if (e.n_drafts > 0) {
          check_drafts(s, e, k);
          k += e.n_drafts + 1;
          continue;
        }
        s.position += e.n_rows;
        if (!e.gets_token) continue;
        if (e.samples) {
          const ops::SampledToken& t = sampled.at(k++);
          take(s, t.id, &t);
        } else {  // the reply starts with forced tokens
          const int32_t token = s.forced.front();
          s.forced.pop_front();
          take(s, token, nullptr);
        }
      }
      if (options.draft.kind == DraftKind::kMtp) {
        try {
          feed_mtp();
        } catch (const std::exception& ex) {
          log(LogLevel::kWarn, "scheduler: an MTP step failed: {}", ex.what());
          for (const Entry& e : entries) {
            if (e.hidden_row >= 0 && e.seq->slot >= 0)
              finish(*e.seq, FinishReason::kError, ex.what());
          }
        }
        for (const Entry& e : entries) {
          Sequence& s = *e.seq;
          if (!s.snapshot_due) continue;
          s.snapshot_due = false;
          if (s.slot >= 0) cache_tokens(s, std::span(s.params.prompt).first(s.n_prompt_fed));
        }
      }
    }
  }
  uint64_t generated_after = 0;
  for (const Entry& e : entries) {
    generated_after += e.seq->generated.size();
    drafted += e.seq->n_drafted;
    accepted += e.seq->n_accepted;
  }
  // Decode-only steps (a prompt chunk would swamp the comparison).
  if (options.draft.kind != DraftKind::kNone && options.draft.pause_when_slower &&
      prompt_rows == 0 && batch.size() > 0)
    record_step_cost(checked, chain_seconds + seconds_between(t_step, Clock::now()),
                     generated_after - generated_before);

  {
    std::lock_guard lock(mutex);
    stats.running = static_cast<int>(order.size());
    stats.queued = static_cast<int>(queue.size());
    stats.kv_pages_in_use = kv_pages();
    stats.kv_pages_cached = kv_pages_cached();
    if (cache) stats.cache = cache->stats();
    stats.prompt_tokens += prompt_rows;
    stats.generated_tokens += generated_after - generated_before;
    stats.drafted_tokens += drafted;
    stats.accepted_tokens += accepted;
    for (const auto& s : ended) {
      ++stats.finished;
      if (s->update.finish == FinishReason::kCancelled) ++stats.cancelled;
    }
  }
  // Updates: every sequence that ended, and every one that got a token this step.
  for (auto& s : ended) out.emplace_back(&s->sink, std::move(s->update));
  for (Sequence* s : order) {
    auto& u = s->update;
    if (u.text.empty() && u.events.empty() && u.tokens.empty()) continue;
    out.emplace_back(&s->sink, std::move(u));
    s->update = SequenceUpdate{.id = s->id};
  }
  return true;
}

Scheduler::Scheduler(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
                     SchedulerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, options)) {}

Scheduler::~Scheduler() = default;

uint64_t Scheduler::submit(SequenceParams params, Sink sink) {
  auto seq = impl_->make_sequence(std::move(params), std::move(sink));
  std::lock_guard lock(impl_->mutex);
  if (impl_->shutting_down) throw ShuttingDown("the scheduler is shutting down");
  // max_queue sequences may wait beyond the free slots (queued ones take free slots only at the
  // next step: a burst at an idle server must not be refused while slots are free).
  const int free_slots = std::max(0, static_cast<int>(impl_->slots.size()) - impl_->stats.running);
  if (static_cast<int>(impl_->queue.size()) >= impl_->options.max_queue + free_slots) {
    throw QueueFull(fmt::format("the queue is full ({} sequences waiting)", impl_->queue.size()));
  }
  seq->id = impl_->next_id++;
  seq->update.id = seq->id;
  seq->t_submit = Clock::now();
  const uint64_t id = seq->id;
  impl_->queue.push_back(std::move(seq));
  ++impl_->stats.submitted;
  impl_->stats.queued = static_cast<int>(impl_->queue.size());
  impl_->wake.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard lock(impl_->mutex);
  if (id == 0 || id >= impl_->next_id) return;
  impl_->cancel_requests.insert(id);
  impl_->wake.notify_all();
}

bool Scheduler::step() {
  std::vector<std::pair<Sink*, SequenceUpdate>> out;
  const bool did = impl_->iterate(out);
  // Sinks run outside the lock (they may submit or cancel); the ended sequences that own some of
  // them live until every update is out.
  for (auto& [sink, update] : out) {
    if (!*sink) continue;
    try {
      (*sink)(std::move(update));
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, "scheduler: a sink threw: {}", e.what());
    }
  }
  impl_->ended.clear();
  return did;
}

void Scheduler::run() {
  auto& m = *impl_;
  for (;;) {
    {
      std::unique_lock lock(m.mutex);
      // order is this thread's own; stats.running mirrors it under the lock.
      m.wake.wait(lock, [&] { return m.shutting_down || !m.queue.empty() || m.stats.running > 0; });
      if (m.shutting_down && m.queue.empty() && m.stats.running == 0) return;
    }
    step();
  }
}

void Scheduler::shutdown(bool drain) {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->shutting_down) impl_->drain = drain;
  // A later shutdown(false) still cancels what a draining one would have waited for.
  if (!drain) impl_->drain = false;
  impl_->shutting_down = true;
  impl_->wake.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

}  // namespace qwenrt::gen
