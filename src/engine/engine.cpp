#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"

namespace qwenrt::engine {

void Batch::add(int slot, int32_t token, int32_t position, bool logits) {
  tokens.push_back(token);
  positions.push_back(position);
  slots.push_back(slot);
  want_logits.push_back(logits ? 1 : 0);
}

void Batch::clear() {
  tokens.clear();
  positions.clear();
  slots.clear();
  want_logits.clear();
  keep_states.clear();
  hidden_slots.clear();
}

void MtpBatch::add(int slot, int32_t token, int32_t position, std::span<const float> row,
                   bool logits) {
  slots.push_back(slot);
  tokens.push_back(token);
  positions.push_back(position);
  hidden.insert(hidden.end(), row.begin(), row.end());
  want_logits.push_back(logits ? 1 : 0);
}

void MtpBatch::clear() {
  slots.clear();
  tokens.clear();
  positions.clear();
  hidden.clear();
  want_logits.clear();
}

Engine::KvSizes Engine::kv_sizes(const EngineOptions& options) const {
  KvSizes kv;
  kv.n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(config_.n_ctx_train, 32768);
  for (int il = 0; il < config_.n_layer; ++il) {
    if (config_.is_attention_layer(il)) {
      const int64_t idx_dim = config_.is_qsa_layer(il) ? config_.q4.indexer_head_dim : 0;
      kv.page_bytes +=
          (2 * int64_t{config_.n_head_kv} * config_.head_dim + idx_dim) * kPageSize * 4;
    }
  }
  kv.own_bytes =
      int64_t{options.n_slots} * ((kv.n_ctx + kPageSize - 1) / kPageSize) * kv.page_bytes;
  kv.extra_bytes = options.cache_kv_bytes;
  // Room for several conversations per slot (a server interleaves more of them than it runs at
  // once). Host backends commit the pages only as they are used.
  if (kv.extra_bytes < 0) kv.extra_bytes = std::min<int64_t>(8 * kv.own_bytes, int64_t{4} << 30);
  return kv;
}

void Engine::setup_expert_streaming(const EngineOptions& options) {
  if (!config_.is_moe() || options.expert_cache_bytes == 0) return;
  // One slot: the largest expert of a layer (its gate, up and down slices, 64-byte aligned).
  int64_t slot = 0, expert_bytes = 0;
  for (int il = 0; il < config_.n_layer; ++il) {
    int64_t layer = 0;
    for (const auto& t : file_.tensors()) {
      if (!t.name.starts_with(fmt::format("blk.{}.", il)) || !is_routed_expert_tensor(t.name))
        continue;
      layer += (t.n_bytes / t.ne[2] + 63) / 64 * 64;
      expert_bytes += t.n_bytes;
    }
    slot = std::max(slot, layer);
  }
  int64_t budget = options.expert_cache_bytes;
  if (budget < 0) {
    // No --expert-cache: stream only when the weights do not fit the memory they go to, with
    // what the trunk and the rest leave.
    const std::string backend = ops_[0]->name();
    const int64_t file_bytes = static_cast<int64_t>(file_.file_size());
    int64_t free = 0, reserve = 0;
    const char* where = "";
    if (backend == "cpu") {
      free = available_memory();                             // cgroup limits included
      if (free == 0 || file_bytes <= free * 8 / 10) return;  // fits: map everything
      reserve = int64_t{512} << 20;                          // activations, state and the loader
    } else if (backend == "cuda") {
      free = ops_[0]->device_memory_free();
      // The KV pool, then 3 GiB for the state and the step's activations.
      const KvSizes kv = kv_sizes(options);
      reserve = kv.own_bytes + kv.extra_bytes + (int64_t{3} << 30);
      if (free == 0 || file_bytes + reserve <= free) return;  // fits: upload everything
      where = " of device memory";
    } else {
      return;
    }
    // What stays resident (the trunk) and the reserve come first.
    const int64_t others = file_bytes - expert_bytes;
    budget = free - others - reserve;
    // Below a few tokens' worth of experts the cache only thrashes; run anyway, and say so.
    const int64_t floor = int64_t{4} * config_.n_expert_used * slot;
    if (budget < floor) {
      log(LogLevel::kWarn,
          "{:.1f} GB{} free leaves {:.2f} GB for experts after {:.1f} GB of trunk weights: using "
          "{:.2f} GB (the memory is short; --expert-cache sets the cache)",
          free / 1e9, where, std::max<int64_t>(budget, 0) / 1e9, others / 1e9, floor / 1e9);
      budget = floor;
    }
    log(LogLevel::kInfo,
        "{:.1f} GB of weights, {:.1f} GB{} free: streaming the experts through a "
        "{:.1f} GB cache (--expert-cache sets it)",
        file_bytes / 1e9, free / 1e9, where, budget / 1e9);
  }
  std::vector<ops::MappedPart> files;
  for (const gguf::Part& p : file_.parts()) files.push_back({p.path, p.base, p.size});
  ops_[0]->stream_experts({.files = std::move(files),
                           .budget_bytes = budget,
                           .slot_bytes = slot,
                           .min_slots = config_.n_expert_used});
  streaming_experts_ = true;
}

void Engine::prefault_weights(const std::function<void(uint64_t, uint64_t)>& progress) {
  // The PLE n-gram table (qwen4exp, tens of GB in the released model) is read row by row on
  // demand, never whole.
  // Streamed experts are read by the expert cache, likewise.
  auto on_demand = [&](const gguf::TensorInfo& t) {
    return t.name == "per_layer_token_embd.weight" ||
           (streaming_experts_ && is_routed_expert_tensor(t.name));
  };
  uint64_t total = 0, done = 0;
  for (const auto& t : file_.tensors()) total += on_demand(t) ? 0 : t.n_bytes;
  constexpr uint64_t kPage = 4096, kReport = 64ull << 20;
  uint64_t next_report = 0;
  volatile uint8_t sink = 0;  // the reads must happen
  for (const auto& t : file_.tensors()) {
    if (on_demand(t)) continue;
    for (uint64_t off = 0; off < t.n_bytes; off += kPage) sink = sink + t.data[off];
    done += t.n_bytes;
    if (progress && (done >= next_report || done == total)) {
      progress(done, total);
      next_report = done + kReport;
    }
  }
}

std::unique_ptr<Engine> Engine::load(const std::string& path, const EngineOptions& options) {
  return std::unique_ptr<Engine>(new Engine(gguf::File::open(path).value(), options));
}

Engine::Engine(gguf::File file, const EngineOptions& options)
    : file_(std::move(file)),
      config_(model::Config::from_gguf(file_)),
      identity_(model::identify(file_)),
      options_(options) {
  std::string backend = options.backend;
  if (backend == "auto") {
    backend = "cpu";
    if (ops::cuda_available()) {
      const std::string why = ops::cuda_unsupported(config_.head_dim, config_.ssm_head_dim);
      if (why.empty()) {
        backend = "cuda";
      } else {
        log(LogLevel::kInfo, "the cuda backend has no kernels for this model's {}: using cpu", why);
      }
    }
  }
  tp_ = options.tensor_parallel;
  const int n_stages = options.pipeline_parallel;
  if (tp_ < 1 || tp_ > 64) fail("tensor parallel: {} ranks (1..64)", tp_);
  if (n_stages < 1 || n_stages > 64) fail("pipeline parallel: {} stages (1..64)", n_stages);
  stages_ = n_stages == 1 ? std::vector<model::Stage>{model::whole_trunk(config_)}
                          : model::split_layers(file_, config_, n_stages);
  const int n_ranks = tp_ * n_stages;
  head_ = (n_stages - 1) * tp_;
  if (n_stages > 1) {
    for (const model::Stage& st : stages_) {
      log(LogLevel::kInfo, "pipeline stage {}: layers {}..{}{}{}", st.index, st.first, st.end - 1,
          st.is_first() ? ", the embedding" : "", st.is_last() ? ", the head" : "");
    }
  }
  // Each rank's cpu backend takes its share of the threads (0: of the logical CPUs); the stages
  // run one after another, so the ranks of one stage share them.
  const int threads =
      tp_ == 1 ? options.n_threads
               : std::max(1, (options.n_threads > 0
                                  ? options.n_threads
                                  : static_cast<int>(std::thread::hardware_concurrency())) /
                                 tp_);
  for (int r = 0; r < n_ranks; ++r) {
    if (options.make_backend) {
      ops_.push_back(options.make_backend());
    } else if (backend == "ref") {
      ops_.push_back(ops::make_ref_ops());
    } else if (backend == "cpu") {
      ops_.push_back(ops::make_cpu_ops(threads));
    } else if (backend == "cuda") {
      if (tp_ > 1)
        fail("tensor parallel: the cuda backend does not run it yet (no NCCL collectives)");
      if (n_stages > 1)
        fail("pipeline parallel: the cuda backend does not run it yet (one device a process)");
      ops_.push_back(ops::make_cuda_ops());
    } else {
      fail("unknown backend '{}' (available: auto, cuda, cpu, ref)", options.backend);
    }
  }
  if (n_ranks > 1) {
    if (options.expert_cache_bytes > 0) {
      fail("{} parallel: streamed experts (--expert-cache) are not supported with it",
           tp_ > 1 ? "tensor" : "pipeline");
    }
    if (tp_ > 1) {
      for (int s = 0; s < n_stages; ++s) {
        groups_.push_back(std::make_shared<ops::HostGroup>(tp_));
        for (int t = 0; t < tp_; ++t) ops_[s * tp_ + t]->join_host_group(groups_.back(), t);
      }
      rank_threads_ = std::make_unique<ThreadPool>(tp_);
    }
  } else {
    // Before the weights are placed: they skip the routed experts (cuda) and a budget too small
    // is refused before anything is uploaded.
    setup_expert_streaming(options);
  }
  if (ops_[0]->copies_weights()) {
    // Every rank may drop the file pages of what it copied (each places a tensor once, and its
    // own copies of split weights are freed once placed). The progress is the ranks' bytes
    // together (ranks load one after another; replicated tensors count on each, hence the cap).
    uint64_t total = 0;
    for (const auto& t : file_.tensors()) total += t.n_bytes;
    auto placed = std::make_shared<std::vector<uint64_t>>(n_ranks, 0);
    for (int r = 0; r < n_ranks; ++r) {
      std::function<void(uint64_t, uint64_t)> progress;
      if (options.on_load_progress) {
        progress = [placed, r, report = options.on_load_progress](uint64_t done, uint64_t all) {
          (*placed)[r] = done;
          uint64_t sum = 0;
          for (uint64_t d : *placed) sum += d;
          report(std::min(sum, all), all);
        };
      }
      ops_[r]->set_place_progress(n_ranks == 1 ? options.on_load_progress : progress, total);
    }
  }
  for (int r = 0; r < n_ranks; ++r) {
    models_.push_back(arch::make_model(
        file_, config_, *ops_[r],
        {.shard = {.rank = r % tp_, .size = tp_, .expert_parallel = options.expert_parallel},
         .stage = stages_[r / tp_],
         .state_rank = r}));
  }
  if (config_.is_moe() && std::string(ops_[0]->name()) == "cuda") {
    if (streaming_experts_) {
      log(LogLevel::kInfo,
          "cuda: routed experts stream from the file into device memory (--expert-cache; graphs "
          "off)");
    } else {
      log(LogLevel::kInfo,
          "cuda: every weight is resident in device memory, no routed expert is streamed from the "
          "file{}",
          config_.is_qwen4exp() ? " (the PLE n-gram rows are read from it on the host)" : "");
    }
  }
  if (options.prefault && !ops_[0]->copies_weights()) prefault_weights(options.on_load_progress);
  const KvSizes kv = kv_sizes(options);
  const int64_t n_ctx = kv.n_ctx, page_bytes = kv.page_bytes, cache_bytes = kv.extra_bytes;
  const int64_t extra_pages = page_bytes > 0 ? cache_bytes / page_bytes : 0;
  if (options.verify_rows < 0 || options.verify_rows > 64)
    fail("verify rows must be in [0, 64], got {}", options.verify_rows);
  std::vector<model::Config> rank_configs;
  std::vector<ops::Ops*> rank_ops;
  std::vector<model::Stage> rank_stages;
  for (int r = 0; r < n_ranks; ++r) {
    rank_configs.push_back(models_[r]->config());
    rank_ops.push_back(ops_[r].get());
    rank_stages.push_back(stages_[r / tp_]);
  }
  states_ = std::make_unique<state::StateStore>(rank_configs, options.n_slots, n_ctx, rank_ops,
                                                kPageSize, extra_pages,
                                                std::max(0, options.verify_rows - 1), rank_stages);
}

void Engine::plan(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                  const std::vector<int32_t>& slots, const std::vector<uint8_t>* want_output,
                  state::Track track, bool ends_in_sample, const std::vector<int32_t>* keep,
                  bool all_hidden, bool mtp_block) {
  const size_t n = tokens.size();
  if (positions.size() != n || slots.size() != n || (want_output && want_output->size() != n)) {
    fail("batch: tokens, positions, slots and want_logits must have the same length");
  }
  spans_.clear();
  output_rows_.clear();
  for (size_t i = 0; i < n; ++i) {
    const int slot = slots[i];
    const int32_t token = tokens[i];
    if (token < 0 || token >= config_.n_vocab) {
      fail("batch row {}: token id {} is outside the vocabulary of {} tokens", i, token,
           config_.n_vocab);
    }
    if (slot < 0 || slot >= states_->n_slots()) {
      fail("batch row {}: slot {} out of range [0, {})", i, slot, states_->n_slots());
    }
    if (spans_.empty() || spans_.back().slot != slot) {
      for (const ops::Span& s : spans_) {
        if (s.slot == slot) fail("batch row {}: the tokens of slot {} are not contiguous", i, slot);
      }
      spans_.push_back({.slot = slot,
                        .begin = static_cast<int32_t>(i),
                        .count = 0,
                        .n_past = static_cast<int32_t>(states_->length(slot, track))});
    }
    ops::Span& span = spans_.back();
    const int64_t expected = int64_t{span.n_past} + span.count;
    if (positions[i] != expected) {
      fail("batch row {}: slot {} expects position {}, got {}", i, slot, expected, positions[i]);
    }
    if (expected >= states_->n_ctx()) {
      fail("batch row {}: slot {} would hold {} tokens, the context is {}", i, slot, expected + 1,
           states_->n_ctx());
    }
    ++span.count;
    if (!want_output || (*want_output)[i]) output_rows_.push_back(static_cast<int32_t>(i));
  }
  bool any_keep = false;
  if (keep && !keep->empty()) {
    kept_.clear();
    for (int32_t slot : *keep) {
      auto it = std::find_if(spans_.begin(), spans_.end(),
                             [&](const ops::Span& s) { return s.slot == slot; });
      if (it == spans_.end()) fail("batch: slot {} keeps its states but has no rows", slot);
      if (it->count > std::max(1, options_.verify_rows)) {
        fail("batch: slot {} checks {} rows; the engine keeps states for {} (verify_rows)", slot,
             it->count, std::max(1, options_.verify_rows));
      }
      it->keep_states = 1;
      any_keep = true;
      kept_.push_back(*it);
    }
  } else if (track == state::Track::kTrunk) {
    kept_.clear();
  }
  for (const ops::Span& s : spans_) states_->reserve(s.slot, s.count, track);
  for (auto& ops : ops_)
    ops->begin_step({.tokens = tokens.data(),
                     .positions = positions.data(),
                     .n = static_cast<int64_t>(n),
                     .spans = spans_.data(),
                     .n_spans = static_cast<int>(spans_.size()),
                     .output_rows = output_rows_.data(),
                     .n_output_rows = static_cast<int64_t>(output_rows_.size()),
                     .page_tables = states_->page_tables(track),
                     .page_table_stride = states_->page_table_stride(),
                     .deltanet_mode = options_.deltanet_mode,
                     .ends_in_sample = ends_in_sample && !output_rows_.empty(),
                     .keep_states = any_keep,
                     .all_hidden = all_hidden,
                     .mtp_block = mtp_block});
}

void Engine::advance(state::Track track) {
  for (const ops::Span& s : spans_) states_->advance(s.slot, s.count, track);
}

const std::vector<int64_t>& Engine::head_columns(int64_t rows) {
  head_columns_.resize(tp_);
  for (int t = 0; t < tp_; ++t)
    head_columns_[t] = model::head_rows_on_rank(config_, {t, tp_}, rows);
  return head_columns_;
}

const float* Engine::gather_logits(int64_t m, const std::vector<int64_t>& cols) {
  if (tp_ == 1) return results_[head_].logits;
  int64_t total = 0;
  for (int64_t c : cols) total += c;
  gathered_.resize(static_cast<size_t>(m * total));
  int64_t col = 0;
  for (int t = 0; t < tp_; ++t) {
    if (cols[t] == 0) continue;
    part_.resize(static_cast<size_t>(m * cols[t]));
    ops_[head_ + t]->download(results_[head_ + t].logits, part_.data(), m * cols[t]);
    for (int64_t i = 0; i < m; ++i)
      std::copy(part_.begin() + i * cols[t], part_.begin() + (i + 1) * cols[t],
                gathered_.begin() + i * total + col);
    col += cols[t];
  }
  float* logits = ops_[head_]->alloc(m * total);
  ops_[head_]->upload(gathered_.data(), logits, m * total);
  return logits;
}

arch::ForwardResult Engine::run(const Batch& batch, bool ends_in_sample) {
  plan(batch.tokens, batch.positions, batch.slots, &batch.want_logits, state::Track::kTrunk,
       ends_in_sample, &batch.keep_states, !batch.hidden_slots.empty());
  results_.resize(ops_.size());
  const auto n = static_cast<int64_t>(batch.size()), m = static_cast<int64_t>(output_rows_.size());
  const int64_t handoff = n * config_.n_embd;
  for (int s = 0; s < pipeline_parallel(); ++s) {
    on_stage(s, [&](int r) {
      ops_[r]->reset_workspace();
      float* input = nullptr;
      if (s > 0) {  // the previous stage's residual stream
        input = ops_[r]->alloc(handoff);
        ops_[r]->upload(handoff_.data(), input, handoff);
      }
      results_[r] =
          models_[r]->forward(*ops_[r], *states_, n, m, !batch.hidden_slots.empty(), input);
    });
    if (s + 1 < pipeline_parallel()) {  // every rank of the stage holds the same floats
      handoff_.resize(static_cast<size_t>(handoff));
      ops_[s * tp_]->download(results_[s * tp_].residual, handoff_.data(), handoff);
    }
  }
  advance(state::Track::kTrunk);
  arch::ForwardResult r = results_[head_];
  if (m > 0) r.logits = gather_logits(m, head_columns(config_.n_vocab));
  return r;
}

void Engine::step(const Batch& batch, StepOutput& out) {
  out.logits.clear();
  out.hidden.clear();
  if (batch.size() == 0) return;
  const arch::ForwardResult r = run(batch);
  const int64_t m = static_cast<int64_t>(output_rows_.size());
  out.logits.resize(m * config_.n_vocab);
  out.hidden.resize(m * config_.n_embd);
  if (m > 0) {
    ops_[head_]->download(r.logits, out.logits.data(), m * config_.n_vocab);
    ops_[head_]->download(r.hidden, out.hidden.data(), m * config_.n_embd);
  }
}

StepOutput Engine::step_with_hidden(const Batch& batch) {
  StepOutput out;
  step(batch, out);
  return out;
}

std::vector<float> Engine::step(const Batch& batch) {
  return step_with_hidden(batch).logits;
}

void Engine::step_sample(const Batch& batch, std::span<const ops::SamplingRow> rows, int n_top,
                         std::vector<ops::SampledToken>& out, std::vector<float>* hidden) {
  out.clear();
  if (hidden) hidden->clear();
  if (batch.size() == 0) return;
  if (!batch.hidden_slots.empty() && !hidden)
    fail("batch: {} slots want hidden states but no buffer was given", batch.hidden_slots.size());
  int64_t wanted = 0;
  for (uint8_t w : batch.want_logits) wanted += w ? 1 : 0;
  if (static_cast<int64_t>(rows.size()) != wanted) {
    fail("batch: {} rows want a sample but {} sampling settings were given", wanted, rows.size());
  }
  if (n_top < 0 || n_top > ops::kMaxTopLogprobs) {
    fail("top log-probabilities: {} asked, at most {}", n_top, ops::kMaxTopLogprobs);
  }
  const bool with_hidden = !batch.hidden_slots.empty();
  // The hidden states are read after the sample, so a step that returns them may still be
  // captured and replayed (the MTP drafter's steps).
  const arch::ForwardResult r = run(batch, /*ends_in_sample=*/true);
  out.resize(output_rows_.size());
  if (!out.empty()) ops_[head_]->sample(r.logits, config_.n_vocab, rows.data(), n_top, out.data());
  if (with_hidden) {
    const int64_t e = config_.n_embd;
    int64_t n_rows = 0;
    for (int32_t slot : batch.hidden_slots) {
      auto it = std::find_if(spans_.begin(), spans_.end(),
                             [&](const ops::Span& s) { return s.slot == slot; });
      if (it == spans_.end()) fail("batch: slot {} wants hidden states but has no rows", slot);
      n_rows += it->count;
    }
    hidden->resize(n_rows * e);
    float* dst = hidden->data();
    for (const ops::Span& s : spans_) {  // batch order
      if (std::find(batch.hidden_slots.begin(), batch.hidden_slots.end(), s.slot) ==
          batch.hidden_slots.end())
        continue;
      ops_[head_]->download(r.all_hidden + int64_t{s.begin} * e, dst, int64_t{s.count} * e);
      dst += int64_t{s.count} * e;
    }
  }
}

void Engine::rollback(int slot, int64_t n_tokens) {
  auto it =
      std::find_if(kept_.begin(), kept_.end(), [&](const ops::Span& s) { return s.slot == slot; });
  if (it == kept_.end())
    fail("rollback: slot {} kept no states in the last step (batch.keep_states)", slot);
  const int64_t first = int64_t{it->n_past} + 1, last = int64_t{it->n_past} + it->count;
  if (n_tokens < first || n_tokens > last) {
    fail("rollback: slot {} can keep {}..{} tokens, not {}", slot, first, last, n_tokens);
  }
  if (n_tokens < last) {
    states_->restore_history(slot, static_cast<int>(n_tokens - it->n_past - 1));
    states_->truncate(slot, n_tokens, state::Track::kTrunk);
  }
  kept_.erase(it);  // once: the history may be overwritten by the next step
}

arch::ForwardResult Engine::run_mtp(const MtpBatch& batch, int64_t head_rows, bool ends_in_sample) {
  if (!has_mtp()) fail("{}: the model has no MTP block", file_.path());
  const size_t n = batch.tokens.size();
  if (batch.hidden.size() != n * config_.n_embd) {
    fail("MTP batch: {} hidden values for {} rows of {}", batch.hidden.size(), n, config_.n_embd);
  }
  if (!batch.want_logits.empty() && batch.want_logits.size() != n)
    fail("MTP batch: {} want_logits flags for {} rows", batch.want_logits.size(), n);
  // The trunk's hidden states go up before the step begins, so that a backend may capture the
  // step whole (an upload inside a step ends a capture).
  const int last = pipeline_parallel() - 1;  // the MTP block is on the last stage
  const int64_t values = static_cast<int64_t>(n) * config_.n_embd;
  mtp_inputs_.assign(ops_.size(), nullptr);
  on_stage(last, [&](int r) {
    ops_[r]->reset_workspace();
    mtp_inputs_[r] = ops_[r]->alloc(values);
    ops_[r]->upload(batch.hidden.data(), mtp_inputs_[r], values);
  });
  plan(batch.tokens, batch.positions, batch.slots,
       batch.want_logits.empty() ? nullptr : &batch.want_logits, state::Track::kMtp, ends_in_sample,
       nullptr, /*all_hidden=*/false, /*mtp_block=*/true);
  results_.resize(ops_.size());
  const auto m = static_cast<int64_t>(output_rows_.size());
  on_stage(last, [&](int r) {
    results_[r] = models_[r]->mtp_forward(*ops_[r], *states_, static_cast<int64_t>(n), m,
                                          mtp_inputs_[r], head_rows);
  });
  advance(state::Track::kMtp);
  arch::ForwardResult r = results_[head_];
  if (m > 0) {
    const int64_t rows =
        head_rows > 0 ? std::min<int64_t>(head_rows, config_.n_vocab) : config_.n_vocab;
    r.logits = gather_logits(m, head_columns(rows));
  }
  return r;
}

std::vector<float> Engine::mtp_step(const MtpBatch& batch) {
  if (!has_mtp()) fail("{}: the model has no MTP block", file_.path());
  if (batch.tokens.empty()) return {};
  const arch::ForwardResult r = run_mtp(batch);
  std::vector<float> out(output_rows_.size() * config_.n_vocab);
  if (!out.empty()) ops_[head_]->download(r.logits, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

void Engine::mtp_draft(const MtpBatch& batch, std::vector<int32_t>& drafts,
                       std::vector<float>& hidden) {
  drafts.clear();
  hidden.clear();
  if (!has_mtp()) fail("{}: the model has no MTP block", file_.path());
  if (batch.tokens.empty()) return;
  const int64_t vocab = options_.draft_vocab > 0 && options_.draft_vocab < config_.n_vocab
                            ? options_.draft_vocab
                            : config_.n_vocab;
  // The step ends in the drafts' pick (it may then be captured and replayed); the hidden states
  // are read after it.
  const arch::ForwardResult r = run_mtp(batch, vocab, /*ends_in_sample=*/true);
  const auto m = static_cast<int64_t>(output_rows_.size());
  if (m == 0) return;
  greedy_rows_.assign(m, ops::SamplingRow{.temperature = 0.0f, .logprobs = false});
  greedy_picks_.resize(m);
  ops_[head_]->sample(r.logits, vocab, greedy_rows_.data(), 0, greedy_picks_.data());
  hidden.resize(m * config_.n_embd);
  ops_[head_]->download(r.hidden, hidden.data(), m * config_.n_embd);
  drafts.resize(m);
  for (int64_t i = 0; i < m; ++i) drafts[i] = greedy_picks_[i].id;
}

void Engine::truncate_mtp(int slot, int64_t n_tokens) {
  if (slot < 0 || slot >= states_->n_slots())
    fail("truncate_mtp: slot {} out of range [0, {})", slot, states_->n_slots());
  const int64_t have = states_->n_mtp_tokens(slot);
  if (n_tokens < 0 || n_tokens > have)
    fail("truncate_mtp: slot {} holds {} MTP rows, cannot keep {}", slot, have, n_tokens);
  states_->truncate(slot, n_tokens, state::Track::kMtp);
}

}  // namespace qwenrt::engine
