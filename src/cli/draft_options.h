// `--draft none|ngram|mtp`, `--draft-max K`, `--draft-vocab N`, `--no-draft`: speculative decoding
// (gen/draft.h), the same on every command that generates. The output is the same with or without
// it. Without --draft-max, MTP drafts the checkpoint's depth (gen/defaults.h, shown by `qwenrt
// info`) and the n-gram drafter gen::kNgramDraftDepth; without --draft-vocab, MTP drafts among the
// first gen::kMtpDraftVocab ids.
#pragma once

#include <CLI/CLI.hpp>

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
}

}  // namespace qwenrt::cli
