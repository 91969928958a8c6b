// `--draft none|ngram|mtp`, `--draft-max K`, `--draft-vocab N`, `--no-draft`: speculative decoding
// (gen/draft.h), the same on every command that generates. The output is the same with or without
// it. Without --draft-max, MTP drafts the checkpoint's depth (gen/defaults.h, shown by `qwenrt
// info`) and the n-gram drafter gen::kNgramDraftDepth; without --draft-vocab, MTP drafts among the
// first gen::kMtpDraftVocab ids.
#pragma once

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "engine/engine.h"
#include "gen/defaults.h"
#include "gen/scheduler.h"
#include "gguf/reader.h"
#include "model/identity.h"

namespace qwenrt::cli {

struct DraftCliOptions {
  std::string kind = "none";
  int max_tokens = 0;  // 0: the drafter's default depth
  int64_t vocab = -1;  // MTP drafts among the first `vocab` ids (0: all; -1: gen::kMtpDraftVocab)
  bool off = false;
};

inline void add_draft_options(CLI::App* sub, DraftCliOptions& opt) {
  sub->add_option("--draft", opt.kind,
                  "Speculative decoding: ngram (drafts from earlier text of the sequence: "
                  "quotes, code edits), mtp (the model's MTP block drafts, one forward per "
                  "token) or none; the output is the same either way")
      ->check(CLI::IsMember({"none", "ngram", "mtp"}));
  sub->add_option("--draft-max", opt.max_tokens,
                  "Drafted tokens per check at most (default: the checkpoint's MTP depth, which "
                  "`qwenrt info` shows; 4 for ngram)")
      ->check(CLI::Range(1, 16));
  sub->add_option("--draft-vocab", opt.vocab,
                  "MTP drafts pick among the first N token ids only: a draft head over N rows of "
                  "the LM head instead of all of them (BPE ids run roughly from frequent to rare); "
                  "the output is the same, acceptance may drop; 0: every id (default: 65536)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  sub->add_flag("--no-draft", opt.off, "No speculative decoding (as --draft none)");
}

// The drafts a check: --draft-max, else the drafter's default for the model at `model_path` (a
// file that does not open gets the registered checkpoints' depth; loading it reports why).
inline int draft_depth(const DraftCliOptions& opt, const std::string& model_path) {
  if (opt.max_tokens > 0) return opt.max_tokens;
  if (opt.kind != "mtp") return gen::kNgramDraftDepth;
  auto file = gguf::File::open(model_path);
  if (!file) return gen::kMtpDraftDepth;
  const int depth = gen::checkpoint_defaults(model::identify(*file), nullptr, 0).drafter.depth;
  return depth > 0 ? depth : gen::kMtpDraftDepth;
}

// Where the draft cost model keeps its step costs between processes (gen::DraftOptions::
// costs_file): the folder QWENRT_STEP_COSTS names ("0": nowhere, every process measures afresh),
// else XDG_CACHE_HOME/qwenrt/step-costs, else HOME/.cache/qwenrt/step-costs; empty: nowhere.
inline std::string step_costs_dir() {
  if (const char* v = std::getenv("QWENRT_STEP_COSTS"); v != nullptr && *v != '\0')
    return std::string(v) == "0" ? std::string() : std::string(v);
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v != nullptr && *v != '\0')
    return std::string(v) + "/qwenrt/step-costs";
  if (const char* v = std::getenv("HOME"); v != nullptr && *v != '\0')
    return std::string(v) + "/.cache/qwenrt/step-costs";
  return {};
}

// What step costs were measured on: the model file (its path, size and modification time), the
// backend setup that runs it, and the drafter (its kind, depth and vocabulary).
inline std::string step_costs_key(const std::string& model_path, const engine::EngineOptions& eo,
                                  const gen::DraftOptions& d) {
  namespace fs = std::filesystem;
  std::error_code ec, size_ec, time_ec;
  const fs::path canonical = fs::weakly_canonical(model_path, ec);
  const auto size = fs::file_size(model_path, size_ec);
  const auto mtime = fs::last_write_time(model_path, time_ec);
  return fmt::format(
      "model={} size={} mtime={} backend={} threads={} tp={} pp={} ep={} draft={} depth={} "
      "vocab={}",
      ec ? model_path : canonical.string(), size_ec ? -1 : static_cast<int64_t>(size),
      time_ec ? -1
              : static_cast<int64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                         std::chrono::file_clock::to_sys(mtime).time_since_epoch())
                                         .count()),
      eo.backend, eo.n_threads, eo.tensor_parallel, eo.pipeline_parallel,
      eo.expert_parallel ? 1 : 0, gen::draft_kind_name(d.kind), d.max_tokens, eo.draft_vocab);
}

// The file of `key` in `dir`: its 64-bit FNV-1a hash in hex (the key itself is the file's second
// line, checked on reading).
inline std::string step_costs_file(const std::string& dir, const std::string& key) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{}/{:016x}.txt", dir, h);
}

inline void apply(const DraftCliOptions& opt, const std::string& model_path,
                  engine::EngineOptions& eo, gen::SchedulerOptions& so) {
  so.draft.kind = opt.off || opt.kind == "none" ? gen::DraftKind::kNone
                  : opt.kind == "mtp"           ? gen::DraftKind::kMtp
                                                : gen::DraftKind::kNgram;
  if (so.draft.kind == gen::DraftKind::kNone) {
    eo.verify_rows = 0;
    return;
  }
  so.draft.max_tokens = draft_depth(opt, model_path);
  eo.verify_rows = so.draft.max_tokens + 1;
  eo.draft_vocab = opt.vocab >= 0 ? opt.vocab : gen::kMtpDraftVocab;
  if (const std::string dir = step_costs_dir(); !dir.empty()) {
    so.draft.costs_key = step_costs_key(model_path, eo, so.draft);
    so.draft.costs_file = step_costs_file(dir, so.draft.costs_key);
  }
}

}  // namespace qwenrt::cli
