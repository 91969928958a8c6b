// Drafting for speculative decoding: a drafter (n-gram lookup or the MTP block) proposes the next
// tokens of a sequence, the trunk checks them all in one step (the sequence's fed token and its
// drafts as rows of one span), and the sequence keeps the drafts up to the first the trunk would
// not have produced, plus the trunk's own token after them (Engine::rollback drops the rest).
//
// Exactness: drafts are deterministic (no random draw), so the speculative-sampling rule
// "accept draft d with probability min(1, p(d) / q(d)), else sample from norm(max(0, p - q))"
// has q one-hot at d: accept with probability p(d), else sample from p without d. Sampling the
// check's row with its own uniform number and accepting when the sampled token is d does exactly
// that, with the same number the plain loop would have used for that position. So drafting
// changes no output: greedy or sampled, with a seed, the tokens are those of plain decoding.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qwenrt::gen {

// kNgram: prompt lookup (draft_ngram). kMtp: the model's MTP block, one forward per drafted
// token; each draft is the argmax of its logits, so deterministic. The scheduler keeps the MTP
// block's KV in step with the trunk (every accepted position's row is fed from the trunk's hidden
// state at it) and drops the rows the chain fed beyond it (Engine::truncate_mtp).
enum class DraftKind { kNone, kNgram, kMtp };
const char* draft_kind_name(DraftKind kind);  // "none", "ngram", "mtp"

struct DraftOptions {
  DraftKind kind = DraftKind::kNone;
  int max_tokens = 4;  // drafts per check at most (the engine's verify_rows must be one more)
  // n-gram drafting: the longest suffix of the text that occurred before, from ngram_max tokens
  // down to ngram_min, proposes what followed its most recent earlier occurrence.
  int ngram_min = 2;
  int ngram_max = 4;
  // Draft only the depth the measured step costs and the sequence's acceptance say pays
  // (DraftCostModel; the scheduler times its steps); off: draft whenever the drafter has
  // something (tests).
  bool pause_when_slower = true;
  // The cost model explores a new depth (one draft, to measure its step) only in replies this
  // many tokens long, so that short replies never pay for a new shape's first steps.
  int explore_after = 32;
  // Where the cost model's measurements persist between processes (empty: nowhere), and what
  // they were measured on (model file, backend, threads, drafter: cli/draft_options.h
  // step_costs_key): read when the scheduler starts, so that a new process drafts from its first
  // decision without exploring, and written when it ends. A file of another key, or one that does
  // not parse, is ignored (a warning) and replaced.
  std::string costs_file;
  std::string costs_key;
};

// Prompt lookup: up to `max` tokens that followed the most recent earlier occurrence of the last
// n tokens of text = prompt ++ generated (n from max_n down to min_n, the first n that occurs).
// Empty when nothing matches.
void draft_ngram(std::span<const int32_t> prompt, std::span<const int32_t> generated, int min_n,
                 int max_n, int max, std::vector<int32_t>& out);

// How deep a sequence drafts next, from how its checks went: the depth grows by one after a check
// whose drafts were all accepted and falls to one more than the accepted count after a miss;
// after kMissesToPause checks in a row that accepted nothing, drafting pauses for kPauseSteps
// decode steps (plain steps cost least when the drafter keeps missing).
//
// It also keeps the sequence's acceptance: the chance that a draft holds given that the ones
// before it did, from decayed counts of the drafts its checks tested (a check that accepts j of k
// tested min(j + 1, k): the first miss ends the test), starting from kPriorAcceptance worth
// kPriorWeight drafts.
class DraftController {
 public:
  explicit DraftController(int max_depth = 0) : max_(max_depth), depth_(max_depth) {}
  // Drafts wanted for the next step (0: a plain step); counts a paused step.
  int depth();
  void record(int drafted, int accepted);
  // Whether the next depth() may be above zero (not off, not paused).
  bool drafts_next() const { return max_ > 0 && paused_ == 0; }
  double acceptance() const {
    return (held_ + kPriorAcceptance * kPriorWeight) / (tested_ + kPriorWeight);
  }

  static constexpr int kMissesToPause = 4;
  static constexpr int kPauseSteps = 16;
  static constexpr double kPriorAcceptance = 0.6;
  static constexpr double kPriorWeight = 2;
  static constexpr double kDecay = 0.9;  // a check's weight against the one after it

 private:
  int max_;
  int depth_;
  int misses_ = 0;
  int paused_ = 0;
  double held_ = 0, tested_ = 0;  // decayed counts of drafts accepted / tested
};

// Whether drafting pays on this engine, and how deep: the seconds of a decode-only step by its
// rows and the drafter's seconds per drafted token (moving averages, measured by the scheduler).
// The first kWarmupSteps steps of each row count are not counted: a shape's first steps grow
// workspaces, and on the cuda backend run eagerly and then capture a graph.
//
// A sequence that may draft up to k tokens, with acceptance a, in a step beside b other rows,
// drafts the depth j <= k that maximises (b + E(j)) / (cost(b + 1 + j) + j d), where
// E(j) = 1 + a + ... + a^j is the tokens a check of j drafts yields on average and d the
// drafter's cost a token, and only when that beats the plain step's (b + 1) / cost(b + 1) by
// kMargin. A row count not measured yet costs what a straight line through the measured ones
// around it says; with one row count measured, one draft measures the next (when the caller lets
// it explore: the scheduler does once a reply is DraftOptions::explore_after tokens long, so that
// short replies never pay for a new shape's first steps).
class DraftCostModel {
 public:
  void record_step(int64_t rows, double seconds);
  void record_drafting(int64_t drafts, double seconds);
  int depth(int max_depth, double acceptance, int64_t other_rows, bool may_explore = true) const;
  // A step of `rows` rows, in seconds (measured or estimated); negative when no estimate exists.
  double cost(int64_t rows) const;

  // The measurements as text under `key` (a header line, the key, the drafter's cost a token, one
  // line a measured row count), and back: restore changes nothing and returns false for text of
  // another key or that does not parse (an error naming why in *why). Restored row counts are
  // measured; a process's own first kWarmupSteps steps of a row count are still left out.
  std::string save(const std::string& key) const;
  bool restore(std::string_view text, const std::string& key, std::string* why = nullptr);
  // Whether anything was measured (this process or restored).
  bool any_measured() const;

  static constexpr int kWarmupSteps = 2;
  static constexpr int64_t kMaxRows = 64;  // steps with more rows are not modelled
  static constexpr double kMargin = 0.03;

 private:
  struct Cost {
    double seconds = 0;
    int samples = 0;  // steps averaged in (this process's and restored ones)
    int seen = 0;     // this process's steps, its warm-up ones included
  };
  bool measured(int64_t rows) const;
  Cost by_rows_[kMaxRows + 1];
  double draft_seconds_ = 0;  // a drafted token
  int draft_samples_ = 0;
};

}  // namespace qwenrt::gen
