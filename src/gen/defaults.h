// What a checkpoint runs with when nothing is asked for, from its identity (SPEC.md): the chat
// dialect, the card's sampling per mode, the stop tokens, the drafter. One place that gathers
// what chat/, sample/ and the generator decide, so `qwenrt info` shows exactly what is in force.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat/render.h"
#include "model/identity.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::gen {

// The tokens generation stops on: <|im_end|> and <|endoftext|>, by text (the GGUF advertises only
// the first), in that order; those the vocabulary lacks are left out.
std::vector<std::pair<std::string, int32_t>> stop_tokens(const tokenizer::Tokenizer& tokenizer);

enum class DrafterKind { kNone, kMtp, kDflash };
const char* drafter_kind_name(DrafterKind kind);  // "none", "mtp", "dflash"

struct DrafterDefaults {
  DrafterKind kind = DrafterKind::kNone;
  bool in_file = false;  // the MTP block is inside the trunk file (else an mtp-*.gguf sidecar)
  int blocks = 0;        // MTP blocks in the file (nextn_predict_layers)
  int depth = 0;         // drafts a check when drafting with it is asked for without --draft-max
};

// Drafts a check when none is asked for (docs/decisions.md, "Draft depth per checkpoint": the
// depth that maximises tokens per unit of time from the H200 check costs and a published MTP
// acceptance curve): the registered checkpoints' own depth, kMtpDraftDepth for other files with
// an MTP block, kNgramDraftDepth for the n-gram drafter (no checkpoint).
inline constexpr int kMtpDraftDepth = 2;
int mtp_draft_depth(model::Checkpoint checkpoint);
inline constexpr int kNgramDraftDepth = 4;
// MTP drafts pick among the first this many token ids unless --draft-vocab says otherwise
// (docs/decisions.md, "A draft vocabulary for MTP drafts"): on the family's 248,320-id vocabulary
// the draft head reads a quarter of the LM head, and ids below it are 98.3% of the tokens of
// English and code text (bench/results/draft-vocab.md). Smaller vocabularies draft among all ids.
inline constexpr int64_t kMtpDraftVocab = 65536;

struct CheckpointDefaults {
  model::Identity identity;
  chat::Dialect dialect = chat::Dialect::kQwen35;
  sample::SamplingParams thinking;                     // the card's sampling with thinking on
  sample::SamplingParams non_thinking;                 // and off (--no-think)
  std::vector<std::pair<std::string, int32_t>> stops;  // empty without a tokenizer
  DrafterDefaults drafter;
};

// `tokenizer` may be null (a file without one: no stop tokens). `mtp_blocks` is the file's
// nextn_predict_layers. The official checkpoints draft with their MTP head (in the file, or an
// mtp-*.gguf sidecar of the same repo), kMtpDraftDepth drafts a check.
CheckpointDefaults checkpoint_defaults(const model::Identity& identity,
                                       const tokenizer::Tokenizer* tokenizer, int mtp_blocks);

nlohmann::json to_json(const CheckpointDefaults& defaults);

}  // namespace qwenrt::gen
