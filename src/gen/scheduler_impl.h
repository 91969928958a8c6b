// The scheduler's insides, shared by its two files: scheduler.cpp (admission, the step, taking
// tokens, the prefix cache) and speculate.cpp (drafting and checking drafts). Nothing else
// includes this.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gen/scheduler.h"

namespace qwenrt::gen {

using Clock = std::chrono::steady_clock;

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
  // The cost model's verdict for this sequence (options.draft.pause_when_slower): its last
  // decision was a plain step (so too before its first decision), and the decode steps in a row
  // it chose plain (a probe of one draft every kProbeSteps refreshes the acceptance that keeps
  // it plain).
  bool cost_paused = false;
  int plain_steps = 0;
  // MTP drafting (DraftKind::kMtp): the trunk position of the next MTP row to feed (row p pairs
  // the trunk's hidden state at p with the token at p + 1); the draft the last fed row made (for
  // the position after the token to feed) and that row's output hidden state, the chain's input.
  bool mtp = false;
  int64_t mtp_next = 0;
  std::optional<int32_t> mtp_first;
  std::vector<float> mtp_hidden;
  int64_t mtp_base = 0;  // the MTP track's length before this step's chain
  // While drafting is paused: the trunk's hidden states of positions mtp_next, mtp_next + 1, ...
  // not yet fed (feed_mtp holds them back and feeds them in one step later).
  std::vector<float> mtp_held;
  // Under the cost model the MTP block runs for a reply only from its first chosen draft on
  // (feed_mtp): until then only the last kMtpHeldRows rows are held, so a reply that never
  // drafts costs no MTP forward.
  bool mtp_started = false;
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

struct Scheduler::Impl {
  Impl(engine::Engine& engine_, const tokenizer::Tokenizer& tokenizer_, SchedulerOptions options_);
  ~Impl();
  // The cost model's measurements from / to options.draft.costs_file (a warning, never an error:
  // they only save exploring).
  void load_costs();
  void save_costs() const;

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
  int32_t token_at(const Sequence& seq, int64_t position) const {
    const auto np = static_cast<int64_t>(seq.params.prompt.size());
    return position < np ? seq.params.prompt[position] : seq.generated[position - np];
  }
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

  // Speculative decoding (speculate.cpp).
  // The drafts the sequence's next decode step checks (into seq.drafts; an MTP chain gets its
  // first draft there and the rest from chain_mtp_drafts); their count. `other_rows`: the rows
  // the step holds beside the sequence's own token so far (the cost model's b).
  int32_t make_drafts(Sequence& seq, int64_t other_rows);
  // Extends every sequence's MTP drafts to its depth: one MTP forward per drafted position for
  // all of them at once, each row the previous draft and the MTP block's own output hidden state;
  // then drops those rows from the MTP track.
  void chain_mtp_drafts();
  // After a step: feeds the MTP block the rows of every position the trunk now holds (the trunk's
  // hidden state at p and the token at p + 1), and takes the first draft of the next step from
  // the last of them. While a decoding sequence's drafting is paused its rows are held back
  // (Sequence::mtp_held, up to kMtpHeldRows) and fed together when drafting resumes: a paused
  // drafter then costs one MTP step per kMtpHeldRows tokens, not one per token. Under the cost
  // model a sequence's rows are not fed at all before its first chosen draft, prompt included:
  // only its last kMtpHeldRows rows are held, and the MTP track starts with them.
  void feed_mtp();
  // Feeds a finishing sequence's held rows, so a reply snapshot holds the whole MTP track.
  void flush_mtp_held(Sequence& seq);
  // After a check: takes the sampled tokens while they equal the drafts, then rolls the slot
  // back to what was accepted. `first` indexes the check's first sampled token.
  void check_drafts(Sequence& seq, const Entry& e, size_t first);

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
  // Whether and how deep drafting pays on this engine (options.draft.pause_when_slower).
  DraftCostModel draft_cost;
  static constexpr int kProbeSteps = 128;
  static constexpr int64_t kMtpHeldRows = 64;
};

}  // namespace qwenrt::gen
