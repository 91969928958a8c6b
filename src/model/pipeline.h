// Pipeline (layer) parallelism (issue 17, docs/decisions.md "Pipeline parallelism"): the trunk's
// layers split into P stages that run one after another, each on its own backend (or its own
// tensor-parallel group of backends). Stage s hands the residual stream x [n, n_embd] after its
// last layer to stage s + 1, which norms it with its first layer's attn_norm. The first stage
// holds the token embedding; the last the output norm, the LM head and the MTP block (which needs
// the trunk's final hidden states and the head). Each stage's state store holds only its layers.
//
// The stages are contiguous layer ranges chosen so that the largest holds as few weight bytes as
// possible: the mode exists for models larger than one device.
#pragma once

#include <cstdint>
#include <vector>

#include "gguf/reader.h"
#include "model/config.h"
#include "model/weights.h"

namespace qwenrt::model {

struct Stage {
  int index = 0, count = 1;  // this stage of `count`
  int first = 0, end = 0;    // trunk layers [first, end)
  bool is_first() const { return index == 0; }
  bool is_last() const { return index == count - 1; }
  // Whether the stage holds state layer il of a model of n_layer trunk layers (il >= n_layer:
  // the MTP block's, on the last stage).
  bool holds(int il, int n_layer) const {
    return il >= n_layer ? is_last() : (il >= first && il < end);
  }
};

// The whole trunk as one stage.
Stage whole_trunk(const Config& c);

// Splits layers of layer_bytes[il] bytes into `stages` contiguous non-empty ranges, the first
// also holding first_bytes (the embedding) and the last last_bytes (head, MTP block): the split
// whose largest stage holds the fewest bytes. Error when there are fewer layers than stages.
std::vector<Stage> split_layers(const std::vector<int64_t>& layer_bytes, int64_t first_bytes,
                                int64_t last_bytes, int stages);

// The split of a model file: layer il weighs its blk.{il}. tensors, the first stage the token
// embedding, the last the output norm, the head (output.weight) and the MTP blocks.
std::vector<Stage> split_layers(const gguf::File& file, const Config& c, int stages);

// Empties the weights a stage does not hold: the other stages' layers, the embedding off the
// first stage, the output norm, head and MTP block off the last.
void keep_stage(Qwen35Weights& w, const Stage& stage);
void keep_stage(Qwen35MoeWeights& w, const Stage& stage);

}  // namespace qwenrt::model
