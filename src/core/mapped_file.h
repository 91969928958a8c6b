// A read-only memory-mapped file (or an owned in-memory buffer, for tests and fuzzing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qwenrt {

class MappedFile {
 public:
  // Maps `path` read-only; throws Error naming the path and the OS reason.
  static MappedFile open(const std::string& path);
  // Wraps a copy of `bytes`; `name` stands in for the path in messages.
  static MappedFile from_bytes(std::span<const uint8_t> bytes, std::string name);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether the bytes are a read-only file mapping (their pages may be dropped and read again).
  bool mapped() const { return mapped_; }

 private:
  MappedFile() = default;
  void release();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;         // data_ came from mmap (else from owned_)
  std::vector<uint8_t> owned_;  // backing store of from_bytes()
};

}  // namespace qwenrt
