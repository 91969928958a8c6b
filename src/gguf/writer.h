// GGUF writer (version 3). Used by tools and tests; round-trips with File and with the PyPI gguf
// package. Tensor bytes are either held in memory or produced by a callback while writing, so
// files of tens of GB stream to disk.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/value.h"

namespace qwenrt::gguf {

class Writer {
 public:
  // Fills `dst` (exactly the tensor's byte size) with the tensor's data.
  using Fill = std::function<void(std::span<uint8_t> dst)>;

  explicit Writer(uint32_t alignment = 32);

  // Adds a key, or replaces the value of a key already set (keeping its position).
  void set(const std::string& key, Value value);
  // ne in ggml order (ne[0] contiguous), 1..4 dims; ne[0] a multiple of the type's block size.
  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> ne,
                  std::vector<uint8_t> data);
  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> ne, Fill fill);

  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> ne;
    uint64_t n_bytes;
    uint64_t offset;  // in the data section
    std::vector<uint8_t> data;
    Fill fill;
  };
  void add(PendingTensor tensor);
  template <class Sink>
  void emit(Sink& sink) const;

  uint32_t alignment_;
  std::vector<KeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace qwenrt::gguf
