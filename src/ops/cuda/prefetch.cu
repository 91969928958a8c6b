// Weights pulled into L2 ahead of the kernel that reads them (kernels.h l2_prefetch) and the
// backend's prefetcher (prefetch.h).
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/prefetch.cuh"
#include "ops/cuda/prefetch.h"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kPrefetchThreads = 128;
constexpr int64_t kPrefetchChunk = 16 << 10;  // bytes a thread asks for at a time

// Thread i asks for chunks i, i + threads, ... of [p, p + bytes) (16-byte aligned, a multiple of
// 16). It lets its dependents launch at once and touches no memory a later kernel reads; launched
// dependent, it asks before its predecessor finishes and waits for it only at the end (pdl.cuh: a
// dependent kernel must not finish before the one it follows).
__global__ void __launch_bounds__(kPrefetchThreads)
    l2_prefetch_kernel(const char* __restrict__ p, int64_t bytes) {
  pdl_launch_dependents();
  const int64_t stride = int64_t{gridDim.x} * kPrefetchThreads * kPrefetchChunk;
  for (int64_t off = (int64_t{blockIdx.x} * kPrefetchThreads + threadIdx.x) * kPrefetchChunk;
       off < bytes; off += stride) {
    const int64_t left = bytes - off;
    l2_prefetch_range(p + off, left < kPrefetchChunk ? left : kPrefetchChunk, kPrefetchChunk);
  }
  pdl_wait();
}

}  // namespace

void l2_prefetch(const void* p, int64_t bytes, cudaStream_t stream) {
  if (bytes < 16) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + 15) & ~uintptr_t{15};
  const int64_t n = (bytes - static_cast<int64_t>(begin - a)) & ~int64_t{15};
  if (n <= 0) return;
  const int64_t chunks = (n + kPrefetchChunk - 1) / kPrefetchChunk;
  const int64_t blocks = (chunks + kPrefetchThreads - 1) / kPrefetchThreads;
  launch_dependent(l2_prefetch_kernel, static_cast<unsigned>(blocks < 8 ? blocks : 8),
                   kPrefetchThreads, 0, stream, reinterpret_cast<const char*>(begin), n);
  QWENRT_CUDA_CHECK_LAUNCH();
}

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

int64_t l2_bytes(int device) {
  int l2 = 0;
  QWENRT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  return l2;
}

}  // namespace

L2Prefetcher::L2Prefetcher(int device)
    : lead_(env_int("QWENRT_CUDA_PREFETCH", 0)),
      experts_(env_int("QWENRT_CUDA_PREFETCH_EXPERTS", 0)),
      forked_(env_int("QWENRT_CUDA_PREFETCH_FORK", 1) != 0),
      schedule_(lead_, l2_bytes(device) / 2) {
  QWENRT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

L2Prefetcher::~L2Prefetcher() {
  cudaStreamSynchronize(stream_);
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
  cudaStreamDestroy(stream_);
}

void L2Prefetcher::after(std::span<const PrefetchSchedule::Range> read, cudaStream_t stream,
                         cudaStream_t main, bool capturing) {
  const std::vector<PrefetchSchedule::Range> next = schedule_.read(read);
  if (next.empty()) return;
  const bool fork = forked_ && stream == main;
  if (fork) {
    QWENRT_CUDA_CHECK(cudaEventRecord(fork_, main));
    QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
  }
  for (const auto& r : next) l2_prefetch(r.p, r.bytes, fork ? stream_ : stream);
  if (fork) {
    QWENRT_CUDA_CHECK(cudaEventRecord(join_, stream_));
    // Eager steps need no join: nothing reads what a prefetch does.
    if (capturing) pending_ = true;
  }
}

void L2Prefetcher::join(cudaStream_t main, bool check) {
  if (!pending_) return;
  pending_ = false;
  const cudaError_t err = cudaStreamWaitEvent(main, join_, 0);
  if (check) QWENRT_CUDA_CHECK(err);
}

}  // namespace qwenrt::ops::cuda
