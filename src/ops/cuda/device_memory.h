// Device and pinned host memory of the CUDA backend (cuda_ops.h): the workspace arena and the
// growing buffers its steps reuse.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "ops/cuda/check.h"

namespace qwenrt::ops::cuda {

inline int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

// Device bump allocator: like the cpu backend's arena, a step that outgrows the current block
// gets a new one and the next reset merges them. generation() changes whenever addresses change
// (a captured graph is valid only for the generation it was captured in).
class DeviceArena {
 public:
  ~DeviceArena() {
    for (auto& b : blocks_) cudaFree(b.data);
  }
  void* take(int64_t bytes) {
    bytes = round_up(std::max<int64_t>(bytes, 1), 256);
    if (blocks_.empty() || blocks_.back().used + bytes > blocks_.back().size) {
      const int64_t size =
          std::max<int64_t>(bytes, blocks_.empty() ? int64_t{64} << 20 : 2 * blocks_.back().size);
      void* p = nullptr;
      if (cudaMalloc(&p, static_cast<size_t>(size)) != cudaSuccess) {
        cudaGetLastError();
        fail("cuda backend: out of device memory allocating a {}-byte workspace", size);
      }
      blocks_.push_back({static_cast<uint8_t*>(p), size, 0});
      ++generation_;
    }
    Block& b = blocks_.back();
    void* p = b.data + b.used;
    b.used += bytes;
    return p;
  }
  // Scratch use (one op's workspace at a time): the next take starts at the newest block's start
  // again. Ops on one stream run one after another, so each reuses the same memory; a bigger need
  // gets a bigger block, the older ones are freed by the next reset.
  void rewind() {
    if (!blocks_.empty()) blocks_.back().used = 0;
  }
  // A point in the arena, and giving back what was taken after it (a layer's temporaries). Ops
  // are stream-ordered, so the next take may reuse the memory at once. A block added after the
  // mark is emptied whole; the blocks between stay taken until the next reset merges them.
  int64_t mark() const {
    const int64_t used = blocks_.empty() ? 0 : blocks_.back().used;
    return (static_cast<int64_t>(blocks_.size()) << kMarkShift) | used;
  }
  void release(int64_t mark) {
    if (blocks_.empty()) return;
    const auto n_blocks = static_cast<size_t>(mark >> kMarkShift);
    const int64_t used = mark & ((int64_t{1} << kMarkShift) - 1);
    Block& last = blocks_.back();
    if (n_blocks == blocks_.size()) {
      if (used <= last.used) last.used = used;
    } else {
      last.used = 0;
    }
  }
  // Callers synchronise first when blocks may be freed (a merge).
  bool needs_merge() const { return blocks_.size() > 1; }
  void reset() {
    if (blocks_.size() > 1) {
      int64_t total = 0;
      for (auto& b : blocks_) {
        total += b.size;
        QWENRT_CUDA_CHECK(cudaFree(b.data));
      }
      blocks_.clear();
      void* p = nullptr;
      QWENRT_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(total)));
      blocks_.push_back({static_cast<uint8_t*>(p), total, 0});
      ++generation_;
    }
    if (!blocks_.empty()) blocks_.back().used = 0;
  }
  uint64_t generation() const { return generation_; }

 private:
  static constexpr int kMarkShift = 44;  // a mark: block count above, bytes used in the last below
  struct Block {
    uint8_t* data;
    int64_t size;
    int64_t used;
  };
  std::vector<Block> blocks_;
  uint64_t generation_ = 0;
};

// Pinned host memory that grows (contents are not kept across growth).
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (data_) cudaFreeHost(data_);
  }
  uint8_t* get(int64_t bytes) {
    if (bytes > size_) {
      if (data_) QWENRT_CUDA_CHECK(cudaFreeHost(data_));
      size_ = round_up(std::max<int64_t>(bytes, 4096), 4096);
      void* p = nullptr;
      QWENRT_CUDA_CHECK(cudaMallocHost(&p, static_cast<size_t>(size_)));
      data_ = static_cast<uint8_t*>(p);
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// Device memory that grows (contents are not kept across growth); grew() says the address changed.
class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  uint8_t* get(int64_t bytes, bool* grew = nullptr) {
    if (bytes > size_) {
      if (data_) QWENRT_CUDA_CHECK(cudaFree(data_));
      size_ = round_up(std::max<int64_t>(bytes * 2, 4096), 4096);
      void* p = nullptr;
      QWENRT_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(size_)));
      data_ = static_cast<uint8_t*>(p);
      if (grew) *grew = true;
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace qwenrt::ops::cuda
