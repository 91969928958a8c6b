// Random quantised blocks drawn directly (no float pass), for `qwenrt synth` (synth.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/synth.h"

namespace qwenrt::model::synth_blocks {

uint64_t mix_seed(uint64_t a, uint64_t b);
uint64_t name_hash(const std::string& name);
// Rows of a tensor: the product of its dimensions after the first.
int64_t row_count(const SynthTensor& t);
// Types fill_direct draws.
bool has_direct_blocks(DType type);
// Direct blocks are drawn in chunks of this many blocks, each chunk from its own seed.
constexpr int64_t kChunk = 1024;
// Fills blocks [first_block, first_block + dst.size() / block_bytes) of a matrix of
// N(0, sigma^2)-like values, each chunk of kChunk blocks from its own seed (so the bytes depend
// on neither the thread count nor how the matrix is split into pieces; first_block is a multiple
// of kChunk).
void fill_direct(ThreadPool& pool, DType type, float sigma, uint64_t seed, std::span<uint8_t> dst,
                 int64_t first_block);

}  // namespace qwenrt::model::synth_blocks
