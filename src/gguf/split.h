// Writing a GGUF as a split GGUF, laid out as llama.cpp's gguf-split writes one: part 1 holds
// every metadata key, each part holds split.no (u16, 0-based), split.count (u16) and
// split.tensors.count (i32), tensors keep their order and each part's data section holds its own.
// For tests and tools (a published checkpoint past the hub's 50 GB per file comes split).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gguf/reader.h"

namespace qwenrt::gguf {

struct SplitLimits {
  uint64_t max_part_bytes = std::numeric_limits<uint64_t>::max();  // tensor data per part
  uint64_t max_part_tensors = std::numeric_limits<uint64_t>::max();
};

// Writes `file`'s keys (split.* of its own dropped) and tensors as parts
// `prefix`-00001-of-0000N.gguf, ...; a tensor larger than max_part_bytes gets a part of its own.
// Returns the parts' paths, first to last.
std::vector<std::string> write_split(const File& file, const std::string& prefix,
                                     const SplitLimits& limits);

}  // namespace qwenrt::gguf
