// `--draft none|ngram|mtp`, `--draft-max K`, `--no-draft`: speculative decoding (gen/draft.h), the
// same on every command that generates. The output is the same with or without it.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "core/error.h"
#include "engine/engine.h"
#include "gen/scheduler.h"

namespace qwenrt::cli {

struct DraftCliOptions {
  std::string kind = "none";
  int max_tokens = 4;
  bool off = false;
};

inline void add_draft_options(CLI::App* sub, DraftCliOptions& opt) {
  sub->add_option("--draft", opt.kind,
                  "Speculative decoding: ngram (drafts from earlier text of the sequence: "
                  "quotes, code edits), mtp (the model's MTP block drafts, one forward per "
                  "token) or none; the output is the same either way")
      ->check(CLI::IsMember({"none", "ngram", "mtp"}));
  sub->add_option("--draft-max", opt.max_tokens, "Drafted tokens per check at most")
      ->check(CLI::Range(1, 16));
  sub->add_flag("--no-draft", opt.off, "No speculative decoding (as --draft none)");
}

inline void apply(const DraftCliOptions& opt, engine::EngineOptions& eo,
                  gen::SchedulerOptions& so) {
  so.draft.kind = opt.off || opt.kind == "none" ? gen::DraftKind::kNone
                  : opt.kind == "mtp"           ? gen::DraftKind::kMtp
                                                : gen::DraftKind::kNgram;
  so.draft.max_tokens = opt.max_tokens;
  eo.verify_rows = so.draft.kind == gen::DraftKind::kNone ? 0 : opt.max_tokens + 1;
}

}  // namespace qwenrt::cli
