// Routed experts streamed from the mapped model file into device memory (`--expert-cache` on the
// cuda backend; internal to ops/cuda, used by CudaOps' MoE block).
//
// A pool of slots in device memory, one expert of one layer a slot: its gate and up (or fused
// gate_up) and its down, each in the form placement gives a resident tensor (Q8_0 repacked into
// superblocks, types without a kernel dequantised to F32), each 64-byte aligned. The MoE block
// reads the step's expert ids back, fetches the experts of a run of rows (expert_runs.h) and runs
// the usual expert kernels over the pool with slot numbers for expert ids: the pool is one
// "expert tensor" of `capacity` experts whose expert stride is the slot size. ops/expert_slots.h
// picks the slot a miss overwrites (never one the current run holds).
//
// Where the host has the memory (every routed expert in device form within half of what the
// process may still take; QWENRT_CUDA_EXPERT_HOST=0: never), each expert is also kept in pinned
// host memory, laid out as in its slot: filled from the mapping on its first miss, so a later
// miss is one DMA copy the host only enqueues. Otherwise a miss is copied from the mapping by a
// few host threads into one of two pinned stages, then to its slot. Either way the copy runs on
// the backend's stream, so a slot is overwritten only after the kernels that read it earlier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/kernels.h"
#include "ops/expert_slots.h"
#include "ops/types.h"

namespace qwenrt::ops::cuda {

// The gate and up halves of a fused gate_up expert matrix (each expert's gate rows, then its up
// rows), for the placed tensors and the pool alike.
inline std::pair<Matrix, Matrix> gate_up_halves(const Matrix& gate_up) {
  Matrix gate = gate_up, up = gate_up;
  gate.out = up.out = gate_up.out / 2;
  up.data = static_cast<const uint8_t*>(gate_up.data) + gate.out * gate_up.row_bytes;
  return {gate, up};
}

class ExpertStream {
 public:
  // budget_bytes of device memory for the pool; min_slots: the experts one token picks in a layer.
  // Error if the budget holds fewer than min_slots experts of file_slot_bytes (the file's largest
  // expert of a layer; the device form may be larger, checked again when the pool is made).
  ExpertStream(int64_t budget_bytes, int64_t file_slot_bytes, int min_slots, cudaStream_t stream);
  ~ExpertStream();
  ExpertStream(const ExpertStream&) = delete;
  ExpertStream& operator=(const ExpertStream&) = delete;

  // A routed expert tensor that placement leaves in the mapping (called for each at load): the
  // slot grows to hold one expert of the largest layer in device form.
  void note(const Weight& w);

  // The routed matrices of w over the pool (gate and up halves of a fused gate_up): expert id s
  // of a kernel reads slot s. Makes the pool at the first call.
  struct Mats {
    Matrix gate, up, down;
  };
  Mats mats(const MoeWeights& w);

  // Makes the experts ids[0, count) of w resident and writes their slots to slots[i]; every one
  // stays until the next call. The distinct ids must fit the pool (next_expert_run).
  void fetch(const MoeWeights& w, const int32_t* ids, int64_t count, int32_t* slots);

  // Pinned host arrays of n int32 for the step's ids and slots (valid until the next call).
  int32_t* host_ids(int64_t n) { return reinterpret_cast<int32_t*>(ids_host_.get(n * 4)); }
  int32_t* host_slots(int64_t n) { return reinterpret_cast<int32_t*>(slots_host_.get(n * 4)); }

  int capacity() const { return capacity_; }
  // bytes_read: the file's bytes of every expert brought into a slot, from the file or from the
  // pinned host copy alike.
  ExpertStats stats() const;

 private:
  // Device bytes of one expert of t (F32 for a type without a kernel), and the same rounded up
  // to the slot's 64-byte alignment.
  static int64_t device_bytes(const Weight& t);
  static int64_t aligned_device_bytes(const Weight& t) { return round_up(device_bytes(t), 64); }
  void make_pool();
  void make_host_copy();
  void load(const MoeWeights& w, int e, int slot);
  // Expert e of t, as its slot holds it, into host memory `to` (the copying threads).
  void read_expert(const Weight& t, int e, uint8_t* to);
  // From pinned host memory to the slot's part `dst` on the stream (Q8_0 repacked on the way).
  void upload(const Weight& t, const uint8_t* from, uint8_t* dst);

  cudaStream_t stream_;
  int64_t budget_ = 0;
  int min_slots_ = 0;
  // What note() saw of a layer ("blk.N."), and where its experts lie in the pinned host copy.
  struct Layer {
    int64_t bytes = 0;    // one expert in device form, as a slot holds it
    int64_t experts = 0;  // its routed experts
    int64_t host = 0;     // its first expert's offset in host_
    int64_t first = 0;    // its first expert's index in host_filled_
  };
  std::map<std::string, Layer> layers_;
  int64_t n_experts_ = 0;  // the routed experts of every layer (make_pool)
  int64_t slot_bytes_ = 0;
  int capacity_ = 0;
  uint8_t* pool_ = nullptr;
  std::unique_ptr<ExpertSlots> slots_;  // keyed by the layer's down tensor in the file
  std::vector<uint8_t> miss_;
  PinnedBuffer stage_[2];
  cudaEvent_t stage_done_[2] = {};
  int stage_next_ = 0;
  int64_t stage_bytes_ = 0;
  DeviceBuffer repack_scratch_;
  // The pinned host copy (null: none), laid out as layers_ says; each expert filled on first use.
  uint8_t* host_ = nullptr;
  std::vector<uint8_t> host_filled_;
  ThreadPool copiers_;  // the host copies of misses (one thread read ~10 GB/s from the mapping)
  PinnedBuffer ids_host_, slots_host_;
  ExpertStats stats_;
};

}  // namespace qwenrt::ops::cuda
