#include "ops/cuda/expert_stream.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "ops/cuda/check.h"
#include "ops/expert_budget.h"
#include "quant/quant.h"

namespace qwenrt::ops::cuda {
namespace {

// "blk.N." of a tensor name ("" when it has none).
std::string layer_of(const std::string& name) {
  if (!name.starts_with("blk.")) return "";
  const size_t dot = name.find('.', 4);
  return dot == std::string::npos ? "" : name.substr(0, dot + 1);
}

// Host threads copying a miss into its stage.
constexpr int kCopyThreads = 4;

}  // namespace

ExpertStream::ExpertStream(int64_t budget_bytes, int64_t file_slot_bytes, int min_slots,
                           cudaStream_t stream)
    : stream_(stream), budget_(budget_bytes), min_slots_(min_slots), copiers_(kCopyThreads) {
  if (file_slot_bytes > 0)
    expert_slots_in_budget("cuda expert cache", budget_bytes, file_slot_bytes, min_slots);
  for (auto& e : stage_done_)
    QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

ExpertStream::~ExpertStream() {
  cudaStreamSynchronize(stream_);
  for (auto& e : stage_done_) cudaEventDestroy(e);
  if (pool_) cudaFree(pool_);
  if (host_) cudaFreeHost(host_);
}

int64_t ExpertStream::device_bytes(const Weight& t) {
  const TensorView& v = t.view;
  if (cuda::has_kernel(v.dtype)) return v.nb[2];
  return v.ne[0] * v.ne[1] * int64_t{sizeof(float)};
}

void ExpertStream::note(const Weight& w) {
  const TensorView& v = w.view;
  if (v.nb[1] != v.row_bytes() || v.nb[2] != v.nb[1] * v.ne[1])
    fail("cuda expert cache: tensor '{}' is not contiguous", w.name);
  if (pool_) fail("cuda expert cache: tensor '{}' noted after the pool was made", w.name);
  Layer& layer = layers_[layer_of(w.name)];
  layer.experts = v.ne[2];
  layer.bytes += aligned_device_bytes(w);
  stage_bytes_ = std::max(stage_bytes_, device_bytes(w));
}

void ExpertStream::make_pool() {
  for (const auto& [name, layer] : layers_) {
    slot_bytes_ = std::max(slot_bytes_, layer.bytes);
    n_experts_ += layer.experts;
  }
  if (slot_bytes_ == 0) fail("cuda expert cache: no routed expert tensor was placed");
  const int64_t n = expert_slots_in_budget("cuda expert cache (experts as the device holds them)",
                                           budget_, slot_bytes_, min_slots_);
  // No more slots than experts (a budget beyond them holds every expert once).
  capacity_ = static_cast<int>(std::min<int64_t>(n, std::max<int64_t>(n_experts_, min_slots_)));
  void* p = nullptr;
  if (cudaMalloc(&p, static_cast<size_t>(capacity_ * slot_bytes_)) != cudaSuccess) {
    cudaGetLastError();
    fail(
        "cuda expert cache: out of device memory for {} experts ({:.1f} MiB): lower --expert-cache",
        capacity_, capacity_ * slot_bytes_ / 1048576.0);
  }
  pool_ = static_cast<uint8_t*>(p);
  slots_ = std::make_unique<ExpertSlots>(capacity_);
  for (auto& s : stage_) s.get(stage_bytes_);
  stats_.capacity = capacity_;
  if (capacity_ < n_experts_) make_host_copy();
}

void ExpertStream::make_host_copy() {
  const char* env = std::getenv("QWENRT_CUDA_EXPERT_HOST");
  if (env && std::string(env) == "0") return;
  int64_t total = 0, experts = 0;
  for (auto& [name, layer] : layers_) {
    layer.host = total;
    layer.first = experts;
    total += layer.bytes * layer.experts;
    experts += layer.experts;
  }
  const int64_t room = available_memory();
  if (total > room / 2) {
    log(LogLevel::kInfo,
        "cuda expert cache: the experts ({:.1f} GiB) are more than half the host memory left "
        "({:.1f} GiB): misses are read from the file",
        total / 1073741824.0, room / 1073741824.0);
    return;
  }
  void* p = nullptr;
  if (cudaMallocHost(&p, static_cast<size_t>(total)) != cudaSuccess) {
    cudaGetLastError();
    log(LogLevel::kWarn,
        "cuda expert cache: cannot pin {:.1f} GiB of host memory for the experts: misses are "
        "read from the file",
        total / 1073741824.0);
    return;
  }
  host_ = static_cast<uint8_t*>(p);
  host_filled_.assign(static_cast<size_t>(experts), 0);
  log(LogLevel::kInfo,
      "cuda expert cache: {} slots in device memory, the experts in {:.1f} GiB of "
      "pinned host memory",
      capacity_, total / 1073741824.0);
}

ExpertStream::Mats ExpertStream::mats(const MoeWeights& w) {
  if (!pool_) make_pool();
  Mats m;
  int64_t off = 0;
  auto over_pool = [&](const Weight& t) {
    const TensorView& v = t.view;
    const bool kernel = cuda::has_kernel(v.dtype);
    Matrix x{.dtype = kernel ? v.dtype : DType::F32,
             .in = v.ne[0],
             .out = v.ne[1],
             .n_expert = capacity_,
             .row_bytes = kernel ? v.nb[1] : v.ne[0] * int64_t{sizeof(float)},
             .expert_bytes = slot_bytes_,
             .data = pool_ + off,
             .q8_superblocks = v.dtype == DType::Q8_0 && cuda::q8_0_superblocks_fit(v.ne[0])};
    off += aligned_device_bytes(t);
    return x;
  };
  if (w.gate_up_exps.present()) {
    std::tie(m.gate, m.up) = gate_up_halves(over_pool(w.gate_up_exps));
  } else {
    m.gate = over_pool(w.gate_exps);
    m.up = over_pool(w.up_exps);
  }
  m.down = over_pool(w.down_exps);
  if (off > slot_bytes_)
    fail("cuda expert cache: an expert of '{}' takes {} bytes, slots hold {}", w.down_exps.name,
         off, slot_bytes_);
  return m;
}

void ExpertStream::fetch(const MoeWeights& w, const int32_t* ids, int64_t count, int32_t* slots) {
  if (!pool_) make_pool();
  const int n_expert = static_cast<int>(w.down_exps.view.ne[2]);
  for (int64_t i = 0; i < count; ++i) {
    // -1: routed nowhere (a NaN logit): slot -1, and the kernels write NaN as for resident experts
    if (ids[i] != -1 && (ids[i] < 0 || ids[i] >= n_expert))
      fail("cuda expert cache: expert id {} is outside [0, {})", ids[i], n_expert);
  }
  if (static_cast<int64_t>(miss_.size()) < count) miss_.resize(static_cast<size_t>(count));
  slots_->run(w.down_exps.view.data, ids, count, slots, miss_.data());
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] == -1) continue;
    ++stats_.lookups;
    if (miss_[i]) {
      load(w, ids[i], slots[i]);
    } else {
      ++stats_.hits;
    }
  }
}

void ExpertStream::load(const MoeWeights& w, int e, int slot) {
  uint8_t* dst = pool_ + slot * slot_bytes_;
  uint8_t* held = nullptr;  // the expert in the pinned host copy, laid out as in the slot
  bool fill = false;
  if (host_) {
    const Layer& layer = layers_.at(layer_of(w.down_exps.name));
    held = host_ + layer.host + e * layer.bytes;
    uint8_t& filled = host_filled_[static_cast<size_t>(layer.first + e)];
    fill = !filled;
    filled = 1;
  }
  int64_t off = 0;
  for (const Weight* t : routed_matrices(w)) {
    stats_.bytes_read += t->view.nb[2];
    if (held) {
      if (fill) read_expert(*t, e, held + off);
      upload(*t, held + off, dst + off);
    } else {
      const int i = stage_next_;
      stage_next_ ^= 1;
      QWENRT_CUDA_CHECK(cudaEventSynchronize(stage_done_[i]));
      uint8_t* stage = stage_[i].get(stage_bytes_);
      read_expert(*t, e, stage);
      upload(*t, stage, dst + off);
      QWENRT_CUDA_CHECK(cudaEventRecord(stage_done_[i], stream_));
    }
    off += aligned_device_bytes(*t);
  }
  ++stats_.loads;
}

void ExpertStream::read_expert(const Weight& t, int e, uint8_t* to) {
  const TensorView& v = t.view;
  const auto* src = static_cast<const uint8_t*>(v.data) + e * v.nb[2];
  // The matrix's rows split between the copying threads.
  const bool kernel = cuda::has_kernel(v.dtype);
  const int64_t rows = v.ne[1];
  copiers_.run(kCopyThreads, [&](int part, int parts) {
    const int64_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    if (r1 == r0) return;
    const uint8_t* from = src + r0 * v.nb[1];
    if (kernel) {
      std::memcpy(to + r0 * v.nb[1], from, static_cast<size_t>((r1 - r0) * v.nb[1]));
    } else {
      quant::dequantize(v.dtype, from, reinterpret_cast<float*>(to) + r0 * v.ne[0],
                        (r1 - r0) * v.ne[0], t.name);
    }
  });
}

void ExpertStream::upload(const Weight& t, const uint8_t* from, uint8_t* dst) {
  const TensorView& v = t.view;
  const int64_t bytes = device_bytes(t);
  // Q8_0 rows of whole superblocks are repacked as placement repacks them (cuda_ops.cpp).
  const bool repack = v.dtype == DType::Q8_0 && cuda::q8_0_superblocks_fit(v.ne[0]);
  uint8_t* to = repack ? repack_scratch_.get(bytes) : dst;
  QWENRT_CUDA_CHECK(
      cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
  if (repack) cuda::repack_q8_0_superblocks(to, dst, bytes, stream_);
}

ExpertStats ExpertStream::stats() const {
  return stats_;
}

}  // namespace qwenrt::ops::cuda
