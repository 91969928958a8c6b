// The cuda backend's L2 prefetch of decode weights (prefetch.cu): the learned read order
// (prefetch_schedule.h), the stream the prefetches run on, and the settings.
//   QWENRT_CUDA_PREFETCH        read events ahead to prefetch (default 0: off until measured)
//   QWENRT_CUDA_PREFETCH_EXPERTS 0 none (default), 1 the routed experts' down, 2 gate, up, down
//   QWENRT_CUDA_PREFETCH_FORK   0: the main stream's prefetches inline instead of forked
// Each event's prefetch is held to half of L2.
#pragma once

#include <cuda_runtime.h>

#include <span>

#include "ops/cuda/prefetch_schedule.h"

namespace qwenrt::ops::cuda {

class L2Prefetcher {
 public:
  explicit L2Prefetcher(int device);
  ~L2Prefetcher();
  L2Prefetcher(const L2Prefetcher&) = delete;
  L2Prefetcher& operator=(const L2Prefetcher&) = delete;

  bool on() const { return lead_ > 0; }
  // How many of a MoE's expert tensors (down, gate, up in that order) routing prefetches.
  int expert_tensors() const { return experts_ >= 2 ? 3 : experts_ == 1 ? 1 : 0; }

  // After a launch on `stream` that read `read`: prefetches what followed it last time. On the
  // main stream they go on a stream forked after the launch, holding up nothing after it (a
  // capture must then join it: join()); other streams (the shared expert's, itself beside the
  // main one) take them inline.
  void after(std::span<const PrefetchSchedule::Range> read, cudaStream_t stream, cudaStream_t main,
             bool capturing);
  // Joins the forked prefetches of a capture into `main` (before the capture ends); `check`
  // false while a failed capture is torn down.
  void join(cudaStream_t main, bool check = true);

 private:
  int lead_ = 0, experts_ = 0;
  bool forked_ = true;
  PrefetchSchedule schedule_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool pending_ = false;  // a capture forked stream_ and has not joined it
};

}  // namespace qwenrt::ops::cuda
