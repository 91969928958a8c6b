// Writing and reading float32 .npy files (NumPy format 1.0, C order), for logits dumps and
// reference comparisons.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qwenrt {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a little-endian float32 (or float16, widened) C-order .npy; Error names the problem.
NpyArray read_npy_f32(const std::string& path);

}  // namespace qwenrt
