// The Engine: a loaded model, its backend and its sequence slots, driven one step at a time.
// One entry point (step) serves the CLI, the server's continuous batching and speculative
// verification: a batch mixes prefill chunks and decode tokens of many sequences, and runs as one
// op call per layer per op whatever the number of sequences. A step ends in logits (tests,
// perplexity, harnesses) or in tokens sampled on the backend (generation).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "arch/model.h"
#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "model/config.h"
#include "model/identity.h"
#include "ops/host_group.h"
#include "ops/ops.h"
#include "state/state.h"

namespace qwenrt::engine {

struct EngineOptions {
  std::string backend = "auto";  // "auto" (cuda if usable, else cpu), "cuda", "cpu", "ref"
  int n_threads = 0;             // cpu backend threads; 0 = the physical cores
  // Tensor parallelism (model/shard.h): the model split over this many backends of `backend`,
  // one thread a rank (the cpu backend's threads divided among them). 1: off.
  int tensor_parallel = 1;
  // Under tensor parallelism, MoE routed experts split by expert (true) or each expert's width
  // split over the ranks as a dense FFN's (false; model/shard.h).
  bool expert_parallel = true;
  // Pipeline parallelism (model/pipeline.h): the trunk's layers split into this many stages run
  // one after another, each on its own backend(s) of `backend` (tensor_parallel of them each);
  // the last stage holds the head and the MTP block. 1: off.
  int pipeline_parallel = 1;
  // A backend of the caller's making instead of `backend` (tests wrap one to watch its calls).
  std::function<std::unique_ptr<ops::Ops>()> make_backend;
  int n_slots = 1;    // sequences held at once
  int64_t n_ctx = 0;  // tokens per sequence; 0 = the model's context_length, capped at 32768
  ops::DeltaNetMode deltanet_mode = ops::DeltaNetMode::kAuto;
  // KV pool room beyond the slots' own, for KV kept after its sequence ends (the prefix cache):
  // this many bytes of pages over every trunk attention layer, rounded down to whole pages;
  // negative: eight times the slots' own KV, at most 4 GiB.
  int64_t cache_kv_bytes = 0;
  // The most rows a speculative check of one sequence may have (its fed token and the drafts):
  // each slot keeps this many - 1 recurrent states per DeltaNet layer (Engine::rollback).
  // 0 or 1: none.
  int verify_rows = 0;
  // MTP drafts pick among the first draft_vocab token ids only (0, or n_vocab and above: every
  // id): the draft head is a GEMV over that many rows of the LM head instead of all of them
  // (on a 27B the head is ~3/4 of an MTP forward's bytes). Checks keep the output exact
  // whatever the drafts are; a draft outside the ids is simply never proposed.
  int64_t draft_vocab = 0;
  // Read every weight page once at load (so the first step does not pay for page faults);
  // on_load_progress(bytes done, bytes total) is called as it goes.
  bool prefault = true;
  std::function<void(uint64_t, uint64_t)> on_load_progress;
  // Routed experts streamed from the file into a cache of this many bytes (the cpu backend):
  // 0 = off (experts mapped like the rest); -1 = auto: on, with what memory is free beyond the
  // other weights, when the file is larger than 80% of the free memory.
  int64_t expert_cache_bytes = -1;
};

// Rows of (slot, token, position, wants output). A slot's tokens must be contiguous in the batch
// and continue its sequence: the first at the slot's current length, then one position each.
struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> slots;
  std::vector<uint8_t> want_logits;
  // Slots whose rows in this step are a speculative check: after the step, Engine::rollback can
  // keep any prefix of them.
  std::vector<int32_t> keep_states;
  // Slots whose every row's final hidden state (after output_norm) step_sample returns, whether
  // or not the row wants a token: the MTP drafter's input for every position.
  std::vector<int32_t> hidden_slots;

  void add(int slot, int32_t token, int32_t position, bool logits);
  void clear();
  size_t size() const { return tokens.size(); }
};

// Rows for the MTP block: row i drafts position p + 2 of slot slots[i] from the trunk's hidden
// state at p (hidden, n_embd floats a row) and the token at p + 1; positions are the MTP block's
// own, continuing from the slot's n_mtp_tokens. A chained draft's row takes the MTP block's own
// output hidden state (mtp_draft) in place of the trunk's.
struct MtpBatch {
  std::vector<int32_t> slots;
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<float> hidden;
  std::vector<uint8_t> want_logits;  // per row; empty: every row is an output row

  void add(int slot, int32_t token, int32_t position, std::span<const float> row, bool logits);
  void clear();
  size_t size() const { return tokens.size(); }
};

struct StepOutput {
  std::vector<float> logits;  // [rows wanting logits, n_vocab]
  std::vector<float> hidden;  // [rows wanting logits, n_embd]: after output_norm (MTP input)
};

class Engine {
 public:
  // Opens, validates and binds the model; Error on anything wrong with the file.
  static std::unique_ptr<Engine> load(const std::string& path, const EngineOptions& options = {});

  const model::Config& config() const { return config_; }
  const model::Identity& identity() const { return identity_; }
  const gguf::File& file() const { return file_; }
  state::StateStore& states() { return *states_; }
  // The backend steps end on (the only one without tensor or pipeline parallelism): rank 0 of
  // the last pipeline stage, which samples.
  ops::Ops& backend() { return *ops_[head_]; }
  int tensor_parallel() const { return tp_; }
  int pipeline_parallel() const { return static_cast<int>(stages_.size()); }
  // The layers each pipeline stage holds (one stage: the whole trunk).
  const std::vector<model::Stage>& stages() const { return stages_; }

  // Runs one batch; returns logits [rows wanting logits, n_vocab] in batch order.
  std::vector<float> step(const Batch& batch);
  // The same, also returning the final hidden states of those rows.
  StepOutput step_with_hidden(const Batch& batch);
  // The same into `out`, reusing its buffers.
  void step(const Batch& batch, StepOutput& out);
  // Runs one batch and samples a token for each row wanting output, rows[i] for the i-th such
  // row (on the backend: only the tokens and their log-probabilities come back). `out` is resized
  // to the number of those rows; with the same batch shape, no allocation after the first call.
  // With batch.hidden_slots, `hidden` gets the final hidden states of every row of those slots'
  // spans in batch order, [rows, n_embd] (such a step runs eagerly: it ends in a download).
  void step_sample(const Batch& batch, std::span<const ops::SamplingRow> rows, int n_top,
                   std::vector<ops::SampledToken>& out, std::vector<float>* hidden = nullptr);

  // After a step in which `slot` was in batch.keep_states: keeps only its first n_tokens (the
  // slot's length before that step + 1 .. its length now), as if the step had fed only those
  // rows: KV truncated by length, recurrent state copied from the history the step kept.
  void rollback(int slot, int64_t n_tokens);

  bool has_mtp() const { return models_[head_]->has_mtp(); }
  // Runs the MTP block; returns draft logits [output rows, n_vocab]. Error if the model has none.
  std::vector<float> mtp_step(const MtpBatch& batch);
  // Runs the MTP block and drafts greedily (argmax of the draft logits over the first
  // EngineOptions::draft_vocab ids, picked on the backend): drafts[i] and hidden [i, n_embd] (the
  // block's state after its head norm, the input of the next chained row) for the i-th output row.
  void mtp_draft(const MtpBatch& batch, std::vector<int32_t>& drafts, std::vector<float>& hidden);
  // Shortens the slot's MTP track to n_tokens (<= its length): the rows a draft chain fed beyond
  // the positions the trunk holds are dropped by length.
  void truncate_mtp(int slot, int64_t n_tokens);

 private:
  Engine(gguf::File file, const EngineOptions& options);
  void prefault_weights(const std::function<void(uint64_t, uint64_t)>& progress);
  // Sets up the expert cache of options.expert_cache_bytes, when it is on.
  void setup_expert_streaming(const EngineOptions& options);
  // The KV pool's sizes: tokens a sequence, bytes of a page (kPageSize tokens over every trunk
  // attention layer), the slots' own pages' bytes and the bytes beyond them
  // (options.cache_kv_bytes, or its default).
  static constexpr int kPageSize = 64;
  struct KvSizes {
    int64_t n_ctx = 0, page_bytes = 0, own_bytes = 0, extra_bytes = 0;
  };
  KvSizes kv_sizes(const EngineOptions& options) const;
  bool streaming_experts_ = false;
  // Checks rows (slot, token, position), groups them into spans, reserves their KV pages on the
  // track and hands the layout to the backend. ends_in_sample: the caller samples the step's
  // output rows right after it (the layout says so only where there are output rows).
  void plan(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
            const std::vector<int32_t>& slots, const std::vector<uint8_t>* want_output,
            state::Track track, bool ends_in_sample = false,
            const std::vector<int32_t>* keep = nullptr, bool all_hidden = false,
            bool mtp_block = false);
  arch::ForwardResult run(const Batch& batch, bool ends_in_sample = false);
  // head_rows: the LM head's rows the logits take (0: all).
  arch::ForwardResult run_mtp(const MtpBatch& batch, int64_t head_rows = 0,
                              bool ends_in_sample = false);
  void advance(state::Track track);
  // Runs fn(rank) for every tensor-parallel rank of pipeline stage `stage` at once (ranks
  // stage * tp_ ..), one thread each (the caller's for the first); the first failure is rethrown
  // after every rank has stopped.
  // (A template: a decode step allocates nothing, and a std::function of these lambdas would.)
  template <class Fn>
  void on_stage(int stage, Fn&& fn) {
    const int first = stage * tp_;
    if (tp_ == 1) return fn(first);
    ops::HostGroup& group = *groups_[stage];
    group.reset();
    std::mutex mutex;
    std::exception_ptr error;
    rank_threads_->run(tp_, [&](int t, int) {
      try {
        fn(first + t);
      } catch (...) {
        {
          std::lock_guard lock(mutex);
          if (!error) error = std::current_exception();  // the cause, before the others abort
        }
        group.abort();
      }
    });
    if (error) std::rethrow_exception(error);
  }
  // The head rank's workspace gets logits [m, sum of cols] assembled from the last stage's
  // ranks' logits: cols[t] columns of tensor-parallel rank t's, in rank order.
  const float* gather_logits(int64_t m, const std::vector<int64_t>& cols);
  // The columns of the head each tensor-parallel rank holds of its first `rows` rows (all:
  // n_vocab).
  const std::vector<int64_t>& head_columns(int64_t rows);
  std::vector<int64_t> head_columns_;

  gguf::File file_;
  model::Config config_;
  model::Identity identity_;
  EngineOptions options_;
  // Per rank (stage * tp_ + tensor-parallel rank; one without parallelism): backend and model.
  // Per stage, its tensor-parallel group; the threads its ranks run on.
  std::vector<std::unique_ptr<ops::Ops>> ops_;
  std::vector<std::unique_ptr<arch::Model>> models_;
  int tp_ = 1;
  std::vector<model::Stage> stages_;
  int head_ = 0;  // rank 0 of the last stage: it gathers the head, samples and returns results
  std::vector<std::shared_ptr<ops::HostGroup>> groups_;
  std::unique_ptr<ThreadPool> rank_threads_;
  std::vector<arch::ForwardResult> results_;
  std::vector<float> gathered_, part_;
  std::vector<float*> mtp_inputs_;  // run_mtp: each rank's copy of the trunk's hidden states
  std::vector<float> handoff_;      // the residual stream between pipeline stages (host memory)
  std::unique_ptr<state::StateStore> states_;
  // The layout of the step being run (reused: no allocation per step once grown).
  std::vector<ops::Span> spans_;
  std::vector<int32_t> output_rows_;
  // The keep_states spans of the last trunk step (rollback's bounds).
  std::vector<ops::Span> kept_;
  // mtp_draft's greedy sampling rows and picks (reused).
  std::vector<ops::SamplingRow> greedy_rows_;
  std::vector<ops::SampledToken> greedy_picks_;
};

}  // namespace qwenrt::engine
