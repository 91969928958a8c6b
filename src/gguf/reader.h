// GGUF reader (versions 2 and 3).
//
// Everything read from the file is checked before use: counts, lengths, shapes and offsets with
// overflow-safe arithmetic, string and array lengths against caps and the bytes left, tensor data
// inside the file, no two tensors overlapping, no duplicate names or keys. A File that opened
// successfully is safe to index without further checks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/tensor.h"
#include "gguf/value.h"

namespace qwenrt::gguf {

// Strings from a file in messages (keys, names, values): control bytes escaped as \xNN, so that
// a message stays one printable line (a '\n' or an escape sequence must not reach a terminal).
std::string one_line(std::string_view text);

// Limits on untrusted input (beyond "must fit in the file").
struct Limits {
  uint64_t max_string_bytes = 64ull << 20;  // one string (a chat template is ~10 KB)
  uint64_t max_array_items = 4ull << 20;    // one array (a vocabulary is ~250k entries)
  uint64_t max_tensors = 1ull << 20;        // the largest checkpoints hold a few thousand
  uint64_t max_keys = 1ull << 20;
  uint64_t max_tensor_name_bytes = 1024;
  uint64_t max_alignment = 1ull << 20;
  int max_array_depth = 4;  // arrays of arrays
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;                      // always a type GGUF defines
  int n_dims = 0;                                // 1..4
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ggml order: ne[0] is contiguous
  uint64_t offset = 0;                           // from the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapped file

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  TensorView view() const { return TensorView::contiguous(dtype, n_dims, ne, data); }
  std::string shape_string() const;  // "[4096, 32000]"
};

class File {
 public:
  static Expected<File> open(const std::string& path, const Limits& limits = {});
  static Expected<File> from_bytes(std::span<const uint8_t> bytes, std::string name = "<memory>",
                                   const Limits& limits = {});

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_.size(); }
  // The first byte of the file in memory: a tensor's data - base() is its offset in the file.
  const uint8_t* base() const { return file_.data(); }

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: nullopt when the key is absent; Error naming the key and both types when the
  // key holds a value of another type. Integers of any width convert when the value fits.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<uint64_t> get_uint(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // integers accepted too
  std::optional<bool> get_bool(std::string_view key) const;
  const Array* get_array(std::string_view key) const;

 private:
  explicit File(MappedFile file) : file_(std::move(file)) {}
  void parse(const Limits& limits);

  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> key_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace qwenrt::gguf
