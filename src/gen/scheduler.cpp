#include "gen/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include <unistd.h>

#include "core/log.h"
#include "gen/defaults.h"
#include "gen/scheduler_impl.h"

namespace qwenrt::gen {
namespace {

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

}  // namespace

Scheduler::Impl::Impl(engine::Engine& engine_, const tokenizer::Tokenizer& tokenizer_,
                      SchedulerOptions options_)
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
    load_costs();
  }
}

void Scheduler::Impl::load_costs() {
  const std::string& path = options.draft.costs_file;
  if (path.empty() || !options.draft.pause_when_slower) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) return;  // nothing measured yet
  std::ostringstream text;
  text << in.rdbuf();
  std::string why;
  if (draft_cost.restore(text.str(), options.draft.costs_key, &why)) {
    log(LogLevel::kInfo, "draft: step costs from {}", path);
  } else {
    log(LogLevel::kWarn, "draft: {} ignored ({}); it will be replaced", path, why);
  }
}

void Scheduler::Impl::save_costs() const {
  const std::string& path = options.draft.costs_file;
  if (path.empty() || !options.draft.pause_when_slower || !draft_cost.any_measured()) return;
  // Written beside the file (a name of this process's own: two processes ending at once write
  // two files) and renamed over it: a reader never sees half a file; the last writer wins.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = fmt::format("{}.{}.tmp", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << draft_cost.save(options.draft.costs_key);
    if (!out.flush()) {
      log(LogLevel::kWarn, "draft: could not write the step costs to {}", tmp);
      std::remove(tmp.c_str());
      return;
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    log(LogLevel::kWarn, "draft: could not write the step costs to {}: {}", path, ec.message());
    std::remove(tmp.c_str());
  }
}

Scheduler::Impl::~Impl() {
  save_costs();
  // Sequences still here get no done update (their sinks may be gone); their slots are emptied.
  for (auto& s : slots) {
    if (s) engine.states().reset(s->slot);
  }
  cache.reset();  // its snapshots go back to the state store before the store can go
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
  seq->cost_paused = options.draft.pause_when_slower;  // plain until the cost model chooses a draft
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
  seq.mtp_held.clear();
  seq.mtp_started = false;
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
  if (cache && completed && seq.slot >= 0) {
    if (seq.mtp_started) flush_mtp_held(seq);  // (one that never drafted has no MTP track to end)
    cache_reply(seq);
  }
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
  int64_t decode_rows = 0;  // the step's decode rows: fed tokens, then drafts as they are chosen
  for (Sequence* s : order) {
    if (!s->prefilling()) decode_rows += static_cast<int64_t>(s->feed.size());
  }
  for (Sequence* s : order) {
    s->drafts.clear();
    s->draft_depth = 0;
    if (s->prefilling() || s->feed.size() != 1) continue;
    const int32_t n = make_drafts(*s, decode_rows - 1);
    decode_rows += std::max<int64_t>(n, s->draft_depth);
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
    const bool logprobs = q.params.top_logprobs >= 0;
    if (e.n_drafts == 0) {
      rows.push_back(q.sampler.next_row(q.generated));
      rows.back().logprobs = logprobs;
      continue;
    }
    // The check's rows: row i's penalties count the drafts before it.
    q.draft_history.assign(q.generated.begin(), q.generated.end());
    q.draft_history.insert(q.draft_history.end(), q.drafts.begin(), q.drafts.begin() + e.n_drafts);
    q.rng_marks.clear();
    for (int32_t i = 0; i <= e.n_drafts; ++i) {
      q.rng_marks.push_back(q.sampler.rng_state());
      rows.push_back(q.sampler.next_row(std::span(q.draft_history).first(q.generated.size() + i)));
      rows.back().logprobs = logprobs;
    }
    q.rng_marks.push_back(q.sampler.rng_state());
  }

  Clock::time_point t_step = Clock::now();
  int64_t n_drafts = 0;
  for (const Entry& e : entries) n_drafts += e.n_drafts;
  double step_seconds = 0, mtp_seconds = 0;
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
      step_seconds = seconds_between(t_step, Clock::now());  // the step and its checks' rollbacks
      if (options.draft.kind == DraftKind::kMtp) {
        const auto t_mtp = Clock::now();
        try {
          feed_mtp();
        } catch (const std::exception& ex) {
          log(LogLevel::kWarn, "scheduler: an MTP step failed: {}", ex.what());
          for (const Entry& e : entries) {
            if (e.hidden_row >= 0 && e.seq->slot >= 0)
              finish(*e.seq, FinishReason::kError, ex.what());
          }
        }
        mtp_seconds = seconds_between(t_mtp, Clock::now());
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
  // Decode-only steps (a prompt chunk would swamp the comparison). The drafter's time: the MTP
  // chain before the step and the MTP rows after it (which draft the next step's first token).
  if (options.draft.kind != DraftKind::kNone && options.draft.pause_when_slower &&
      prompt_rows == 0 && batch.size() > 0 && step_seconds > 0) {
    draft_cost.record_step(static_cast<int64_t>(batch.size()), step_seconds);
    draft_cost.record_drafting(n_drafts, chain_seconds + mtp_seconds);
  }

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
