#include "gen/defaults.h"

namespace qwenrt::gen {
namespace {

nlohmann::json sampling_json(const sample::SamplingParams& p) {
  return {{"temperature", p.temperature},
          {"top_p", p.top_p},
          {"top_k", p.top_k},
          {"min_p", p.min_p},
          {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"repetition_penalty", p.repetition_penalty}};
}

}  // namespace

std::vector<std::pair<std::string, int32_t>> stop_tokens(const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::pair<std::string, int32_t>> stops;
  for (const char* text : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tokenizer.token_id(text)) stops.emplace_back(text, *id);
  }
  return stops;
}

const char* drafter_kind_name(DrafterKind kind) {
  switch (kind) {
    case DrafterKind::kMtp:
      return "mtp";
    case DrafterKind::kDflash:
      return "dflash";
    case DrafterKind::kNone:
      return "none";
  }
  return "none";
}

int mtp_draft_depth(model::Checkpoint checkpoint) {
  switch (checkpoint) {
    case model::Checkpoint::kQwen36_27B:
    case model::Checkpoint::kQwen38_27B:
      return 7;  // a check of 3..8 rows costs 2.1-2.3 plain steps
    case model::Checkpoint::kQwen36_35B_A3B:
      return 5;  // 2.0-2.9 plain steps, growing with the rows (the routed experts)
    case model::Checkpoint::kQwen38_FlashNext:
    case model::Checkpoint::kOther:
      break;
  }
  return kMtpDraftDepth;
}

CheckpointDefaults checkpoint_defaults(const model::Identity& identity,
                                       const tokenizer::Tokenizer* tokenizer, int mtp_blocks) {
  CheckpointDefaults d;
  d.identity = identity;
  d.dialect = chat::dialect_for(identity.checkpoint);
  const sample::SamplingRequest none;
  d.thinking = sample::resolve(none, identity.checkpoint, true);
  d.non_thinking = sample::resolve(none, identity.checkpoint, false);
  if (tokenizer) d.stops = stop_tokens(*tokenizer);
  d.drafter.blocks = mtp_blocks;
  d.drafter.in_file = mtp_blocks > 0;
  // Flash-Next's MTP head is dropped by the converter and qwen4exp has no MTP forward here, so
  // only a file that carries MTP blocks asks for the MTP drafter on its own.
  const bool ships_mtp = identity.checkpoint != model::Checkpoint::kOther &&
                         identity.checkpoint != model::Checkpoint::kQwen38_FlashNext;
  if (mtp_blocks > 0 || ships_mtp) d.drafter.kind = DrafterKind::kMtp;
  if (d.drafter.kind == DrafterKind::kMtp) d.drafter.depth = mtp_draft_depth(identity.checkpoint);
  return d;
}

nlohmann::json to_json(const CheckpointDefaults& d) {
  nlohmann::json stops = nlohmann::json::array();
  for (const auto& [text, id] : d.stops) stops.push_back({{"text", text}, {"id", id}});
  return {
      {"checkpoint", model::checkpoint_name(d.identity.checkpoint)},
      {"name", d.identity.name},
      {"chat_dialect", chat::dialect_name(d.dialect)},
      {"sampling",
       {{"thinking", sampling_json(d.thinking)}, {"non_thinking", sampling_json(d.non_thinking)}}},
      {"stop_tokens", stops},
      {"drafter",
       {{"kind", drafter_kind_name(d.drafter.kind)},
        {"in_file", d.drafter.in_file},
        {"mtp_blocks", d.drafter.blocks},
        {"depth", d.drafter.depth}}}};
}

}  // namespace qwenrt::gen
