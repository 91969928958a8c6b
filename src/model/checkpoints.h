// The shapes of the checkpoints the engine serves (SPEC.md's table), as Configs: what
// `qwenrt synth` writes full-size files of, and what tests check a file's layout against.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/identity.h"

namespace qwenrt::model {

struct CheckpointShape {
  Checkpoint checkpoint;
  std::string name;        // general.name of the official conversion: "Qwen3.6-27B"
  std::string size_label;  // general.size_label: "27B", "35B-A3B"
  Config config;           // every width, n_vocab 248320 (padded), context_length 262144
};

// The registered checkpoints with known shapes, in registry order.
const std::vector<CheckpointShape>& checkpoint_shapes();
// By exact registry name ("Qwen3.6-35B-A3B"); nullopt for any other text.
std::optional<CheckpointShape> checkpoint_shape(std::string_view name);

}  // namespace qwenrt::model
