// GGUF reader (versions 2 and 3), of one file or of a split GGUF's parts.
//
// Everything read from the file is checked before use: counts, lengths, shapes and offsets with
// overflow-safe arithmetic, string and array lengths against caps and the bytes left, tensor data
// inside the file, no two tensors overlapping, no duplicate names or keys. A File that opened
// successfully is safe to index without further checks.
//
// Split GGUFs (llama.cpp's gguf-split, gguf-py's writer with a split size): the first part,
// NAME-00001-of-0000N.gguf, holds the metadata and keys split.no = 0, split.count = N and
// split.tensors.count; parts 2..N sit beside it under the same name, each with its own header
// (split.no, split.count and split.tensors.count again) and tensors whose offsets are relative to
// that part's data section. Opening the first part opens them all; the metadata is the first
// part's, the tensors are those of every part, in part order.
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
  int max_array_depth = 4;          // arrays of arrays
  uint64_t max_split_parts = 1024;  // a split GGUF's files (50 GB each on the hub: 50 TB)
  // One part of a split GGUF read alone, as a file with its own keys and tensors (tools that
  // rewrite parts); otherwise the first part opens them all and a later part is refused.
  bool single_part = false;
};

// llama.cpp's names for a split GGUF's parts (llama_split_path): STEM-00002-of-00003.gguf is
// index 1 of 3; five digits each. The one place that knows the pattern.
struct SplitName {
  std::string stem;    // "dir/x"
  uint64_t index = 0;  // 0-based
  uint64_t count = 0;
  std::string path(uint64_t i) const;  // part i's name (0-based)
};
std::optional<SplitName> parse_split_name(std::string_view path);  // nullopt: not a part's name

// The name of part `index` of a split GGUF of `count` parts whose first part is `first`; nullopt
// when `first` is not named as the first of `count` parts.
std::optional<std::string> split_part_path(std::string_view first, uint64_t index, uint64_t count);

// One file of a GGUF: the file itself, or one part of a split GGUF.
struct Part {
  std::string path;
  const uint8_t* base = nullptr;  // its first byte in memory (mapped)
  uint64_t size = 0;              // bytes
  uint64_t data_offset = 0;       // where its data section starts
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;                      // always a type GGUF defines
  int n_dims = 0;                                // 1..4
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ggml order: ne[0] is contiguous
  uint64_t offset = 0;                           // from the start of its part's data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapped file
  int part = 0;                   // the part of a split GGUF holding the data (0: the first)

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  TensorView view() const { return TensorView::contiguous(dtype, n_dims, ne, data); }
  std::string shape_string() const;  // "[4096, 32000]"
};

class File {
 public:
  // A single file, or the first part of a split GGUF with all its parts (errors name the part
  // and the key: a part missing, out of order or from another split, tensors counted wrong).
  static Expected<File> open(const std::string& path, const Limits& limits = {});
  // One file's bytes; a split GGUF's first part is refused (its other parts are files).
  static Expected<File> from_bytes(std::span<const uint8_t> bytes, std::string name = "<memory>",
                                   const Limits& limits = {});

  const std::string& path() const { return file_.path(); }  // the first part's, when split
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // the first part's
  uint64_t file_size() const;                            // all parts together
  // The files holding the tensors: one, or a split GGUF's parts in order.
  std::vector<Part> parts() const;
  // Whether every part is a read-only file mapping (not bytes in memory: from_bytes).
  bool mapped() const;

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
  uint64_t split_count(const Limits& limits) const;  // 1 for a file that is not split
  void open_other_parts(uint64_t count, const Limits& limits);

  MappedFile file_;
  struct OtherPart {
    MappedFile file;
    uint64_t data_offset;
  };
  std::vector<OtherPart> other_parts_;  // a split GGUF's parts 2..N
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> key_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace qwenrt::gguf
