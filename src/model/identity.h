// Which checkpoint a file holds: decides chat dialect and sampling defaults further up.
#pragma once

#include <string>

#include "gguf/reader.h"

namespace qwenrt::model {

enum class Checkpoint { kQwen36_27B, kQwen36_35B_A3B, kQwen38_27B, kQwen38_FlashNext, kOther };

struct Identity {
  Checkpoint checkpoint = Checkpoint::kOther;
  std::string name;  // the registry name, or the file's own name for kOther
};

// Matches general.name, then the file name, against the registry: an exact full name or a full
// name inside the text ("Qwen3.6-27B-Instruct" is Qwen3.6-27B); never a partial one like "3.6".
// Two releases ship byte-identical configs, so names are the only evidence. A text naming two
// checkpoints ("Qwen3.6-27B x Qwen3.8-27B merge") identifies as neither. An unknown model runs
// under its own name with a logged note.
Identity identify(const gguf::File& file);
Identity identify_name(const std::string& general_name, const std::string& file_name);
const char* checkpoint_name(Checkpoint checkpoint);

}  // namespace qwenrt::model
