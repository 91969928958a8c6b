// What both attention kernels (attention.cu, attention_prefill.cu) use to read the paged KV:
// where a key lives, and 16-byte asynchronous copies into shared memory.
#pragma once

#include <cstdint>

#include "ops/types.h"

namespace qwenrt::ops::cuda {

// Where key `pos` of span `sp` lives, as a float offset: into the pages (pos < n_past), or into the
// step's new rows args.k / args.v (fresh = true). -1 when its page is missing (the host reserves
// every page before the step; this only keeps a bad table from reading out of bounds). Args: any
// struct with page_tables, page_table_stride, page_size and kv_dim.
struct KeyAt {
  int64_t offset;
  bool fresh;
};
template <class Args>
__device__ __forceinline__ KeyAt key_at(const Args& a, const Span& sp, int pos) {
  if (pos >= sp.n_past) return {(int64_t{sp.begin} + pos - sp.n_past) * a.kv_dim, true};
  const int32_t page = a.page_tables[sp.slot * a.page_table_stride + pos / a.page_size];
  if (page < 0) return {-1, false};
  return {(int64_t{page} * a.page_size + pos % a.page_size) * a.kv_dim, false};
}

// 16-byte asynchronous global -> shared copy; valid = false zero-fills the 16 bytes and reads
// nothing (src must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned dst_addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_addr), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

}  // namespace qwenrt::ops::cuda
