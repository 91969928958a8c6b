// Tensor parallelism: one rank's share of a model (issue 17, docs/decisions.md "Tensor
// parallelism"). Each rank holds its attention heads (with their KV), its DeltaNet heads (with
// their recurrent state), its slice of each dense FFN, its routed experts (expert parallelism) and
// its rows of the LM head; the rest is replicated. The arch code runs unchanged on the rank's local
// config, summing the block outputs across ranks (Ops::all_reduce_sum) where a projection was
// split by its input.
//
// How heads go to ranks:
// - attention: query heads in contiguous ranges; KV heads likewise when they divide by the ranks,
//   else each rank keeps the one KV head its query heads read (replicated across the ranks of one
//   GQA group);
// - MoE: routed experts by expert (expert parallelism), or each expert's width (Shard);
// - DeltaNet: V head h reads K head h % Hk (the converter's tiled order), so a rank holding K heads
//   [a, a + hk) holds the V heads m * Hk + i (i in that range) in the order m * hk + (i - a), which
//   keeps "local V head h reads local K head h % hk"; with more ranks than K heads, ranks share a K
//   head and split its V heads.
// Rows of a weight split by output are a view into the file when they are one contiguous range,
// else a copy; a weight split by input is a copy of its columns (as fp32 where the columns do not
// fall on quant block boundaries).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace qwenrt::model {

struct Shard {
  int rank = 0;
  int size = 1;
  // MoE routed experts: split by expert (each rank holds E / size whole experts), or, when false,
  // by width (each rank holds a slice of every expert, as the dense FFN's).
  bool expert_parallel = true;
};

// The global head ids a rank holds, in its local order.
struct HeadShare {
  std::vector<int> q, kv;  // attention: query heads, KV heads
  std::vector<int> k, v;   // DeltaNet: K heads, V heads
};
// Error (naming the counts) when the heads cannot be shared over shard.size ranks.
HeadShare share_heads(const Config& c, Shard shard);

// Half-open ranges of rows or columns.
struct Range {
  int64_t begin, count;
};

// The columns of a hidden width (a dense FFN's, the shared expert's) rank `shard` holds: whole
// units of 256 columns (a K-quant block: a split down matrix keeps its type) when every rank gets
// at least one, else of 32 (Q8_0 / Q4_0 blocks), else single columns; the ranks' shares differ by
// one unit at most. Error when the width has fewer columns than there are ranks.
Range width_part(int64_t width, Shard shard);

// The config a rank's forward pass runs on: its head counts and FFN widths. Everything else
// (n_embd, n_vocab, n_expert...) is the model's.
Config shard_config(const Config& c, Shard shard);

// The rank's rows of the LM head: [begin, end) of n_vocab.
struct VocabRange {
  int64_t begin = 0, end = 0;
};
VocabRange vocab_range(const Config& c, Shard shard);
// How many of the head's first `rows` rows lie on the rank (0: none).
int64_t head_rows_on_rank(const Config& c, Shard shard, int64_t rows);

// Copies a shard's tensors that are not plain views of the file; owned by the rank's model.
class ShardArena {
 public:
  // Sources in a read-only file mapping: once copied, their pages are dropped from the resident
  // set (a later read faults them in again), so copies and sources are not both held.
  void set_sources_mapped(bool mapped) { sources_mapped_ = mapped; }
  void copied(const void* source, int64_t bytes) const;
  void* alloc(size_t bytes);
  // Frees the copies none of `in_use` points at (those a backend copied when it placed them).
  void keep_only(const std::vector<const void*>& in_use);

 private:
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  bool sources_mapped_ = false;
};

// The rank's share of every weight (full: as bound from the file with the model's config).
Qwen35Weights shard_weights(const Qwen35Weights& full, const Config& c, Shard shard,
                            ShardArena& arena);
Qwen35MoeWeights shard_weights(const Qwen35MoeWeights& full, const Config& c, Shard shard,
                               ShardArena& arena);

// The same for a stack of expert matrices [in, out, n_expert]: every expert's rows `rows` (empty:
// all) and columns `cols` (empty: all), always a copy, contiguous expert after expert.
Weight take_experts(const Weight& w, const std::vector<Range>& rows, const std::vector<Range>& cols,
                    ShardArena& arena);
// The copy ranges of rows and columns select (exposed for tests):
// w's rows `rows` (in order) and, when `cols` is not empty, only those columns of each (in order).
// One row range and every column: a view of w's bytes; otherwise a copy into the arena, in w's
// type when every column range falls on w's block boundaries, else in F32.
Weight take(const Weight& w, const std::vector<Range>& rows, const std::vector<Range>& cols,
            ShardArena& arena);

}  // namespace qwenrt::model
