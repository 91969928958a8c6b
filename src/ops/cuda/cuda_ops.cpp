// The CUDA backend's Ops (cuda_ops.h): construction, memory, weight placement, the step and its
// graphs, sampling; and the backend's entry points (ops.h).
#include "ops/cuda/cuda_ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/weight.h"
#include "quant/quant.h"

namespace qwenrt::ops::cuda {
namespace {

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return std::strcmp(v, "0") != 0;
}

}  // namespace

CudaOps::CudaOps(int device) : device_(device) {
  int count = 0;
  QWENRT_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    fail("cuda backend: no GPU {} (this machine has {})", device, count);
  QWENRT_CUDA_CHECK(cudaSetDevice(device));
  QWENRT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  QWENRT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  for (auto& e : stage_done_)
    QWENRT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  profile_ = env_flag("QWENRT_CUDA_PROFILE", false);
  graphs_enabled_ = env_flag("QWENRT_CUDA_GRAPHS", true) && !profile_;
  if (const char* v = std::getenv("QWENRT_CUDA_GROUPED_ROWS"); v != nullptr && *v != '\0') {
    const long long r = std::atoll(v);
    grouped_min_rows_ = mmq_min_rows_ = r <= 0 ? INT64_MAX : r;
  }
  prefetcher_ = std::make_unique<cuda::L2Prefetcher>(device);
  norm_route_ = env_flag("QWENRT_CUDA_NORM_ROUTE", true);
  down_combine_ = env_flag("QWENRT_CUDA_DOWN_COMBINE", true);
  moe_row_ = env_flag("QWENRT_CUDA_MOE_ROW", true);
  fused_conv_ = env_flag("QWENRT_CUDA_FUSED_CONV", true);
  early_launch_ = env_flag("QWENRT_CUDA_EARLY_LAUNCH", true);
  drop_ = parse_drop(std::getenv("QWENRT_CUDA_DROP"));
  grow_counters(kInitialCounters);
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(stream_);
  if (profile_) profiler_.print();
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  for (void* p : buffers_) cudaFree(p);
  for (const auto& [start, end] : weight_chunks_) cudaFree(reinterpret_cast<void*>(start));
  for (auto& e : stage_done_) cudaEventDestroy(e);
  prefetcher_.reset();
  experts_.reset();
  cudaFree(counters_);
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
  cudaStreamDestroy(side_);
  cudaStreamDestroy(stream_);
}

void CudaOps::free_buffer(void* buffer) {
  outside_step("free_buffer");
  QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  auto it = std::find(buffers_.begin(), buffers_.end(), buffer);
  if (it == buffers_.end()) fail("cuda backend: free_buffer of memory it did not allocate");
  buffers_.erase(it);
  buffer_bytes_.erase(buffer);
  std::erase_if(ple_shadows_, [&](const PleShadow& sh) { return sh.dev == buffer; });
  QWENRT_CUDA_CHECK(cudaFree(buffer));
}

uint8_t* CudaOps::weight_memory(int64_t bytes) {
  bytes = round_up(bytes, 256);
  if (weight_chunk_ == nullptr || weight_used_ + bytes > weight_chunk_size_) {
    weight_chunk_size_ = std::max(kWeightChunk, bytes);
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(weight_chunk_size_)) != cudaSuccess) {
      cudaGetLastError();
      fail("cuda backend: out of device memory placing the weights ({} bytes placed so far)",
           placed_bytes_);
    }
    weight_chunk_ = static_cast<uint8_t*>(p);
    weight_chunks_[reinterpret_cast<uintptr_t>(p)] =
        reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(weight_chunk_size_);
    weight_used_ = 0;
  }
  uint8_t* p = weight_chunk_ + weight_used_;
  weight_used_ += bytes;
  return p;
}

Weight CudaOps::place(const Weight& w) {
  if (!w.present()) return w;
  if (experts_ && is_routed_expert_tensor(w.name)) {  // streamed: stays in the mapping
    experts_->note(w);
    progress_done_ += static_cast<uint64_t>(w.view.n_rows() * w.view.row_bytes());
    if (progress_) progress_(std::min(progress_done_, progress_total_), progress_total_);
    return w;
  }
  Weight out = w;
  TensorView v = w.view;
  std::vector<float> converted;
  const uint64_t file_bytes = static_cast<uint64_t>(v.n_rows() * v.row_bytes());
  if (v.nb[1] != v.row_bytes() || v.nb[2] != v.nb[1] * v.ne[1] || v.nb[3] != v.nb[2] * v.ne[2]) {
    fail("cuda backend: tensor '{}' is not contiguous", w.name);
  }
  if (!cuda::has_kernel(v.dtype)) {
    converted.resize(static_cast<size_t>(v.n_elements()));
    quant::dequantize(v.dtype, v.data, converted.data(), v.n_elements(), w.name);
    v = TensorView::contiguous(DType::F32, v.n_dims, v.ne, converted.data());
  }
  const int64_t bytes = v.n_rows() * v.row_bytes();
  uint8_t* dst = weight_memory(bytes);
  const uint8_t* src = static_cast<const uint8_t*>(v.data);
  // Q8_0 rows of whole superblocks are repacked on the device on the way in (kernels.h,
  // repack_q8_0_superblocks): each chunk goes to a scratch buffer, then the repack writes it
  // into place. Chunks are whole superblocks.
  const bool repack = v.dtype == DType::Q8_0 && cuda::q8_0_superblocks_fit(v.ne[0]);
  constexpr int64_t kSuperblock = 272;
  const int64_t chunk = repack ? kStageBytes / kSuperblock * kSuperblock : kStageBytes;
  uint8_t* scratch = repack ? repack_scratch_.get(chunk) : nullptr;
  for (int64_t off = 0; off < bytes; off += chunk) {
    const int64_t len = std::min(chunk, bytes - off);
    const int i = stage_next_;
    stage_next_ ^= 1;
    QWENRT_CUDA_CHECK(cudaEventSynchronize(stage_done_[i]));
    uint8_t* stage = stage_[i].get(kStageBytes);
    std::memcpy(stage, src + off, static_cast<size_t>(len));
    QWENRT_CUDA_CHECK(cudaMemcpyAsync(repack ? scratch : dst + off, stage, static_cast<size_t>(len),
                                      cudaMemcpyHostToDevice, stream_));
    QWENRT_CUDA_CHECK(cudaEventRecord(stage_done_[i], stream_));
    if (repack) cuda::repack_q8_0_superblocks(scratch, dst + off, len, stream_);
  }
  if (repack)
    q8_superblock_ranges_[reinterpret_cast<uintptr_t>(dst)] =
        reinterpret_cast<uintptr_t>(dst + bytes);
  placed_bytes_ += bytes;
  progress_done_ += file_bytes;
  if (progress_) progress_(std::min(progress_done_, progress_total_), progress_total_);
  out.view = v;
  out.view.data = dst;
  return out;
}

void CudaOps::begin_step(const StepLayout& layout) {
  if (mode_ == Mode::kCapture) abort_capture();
  mode_ = Mode::kEager;
  replay_launched_ = false;
  QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging buffer is free again
  host_step_ = layout;
  // The stream is idle: the PLE token state written since the last step is read back here,
  // before a capture may begin.
  for (PleShadow& sh : ple_shadows_) {
    if (sh.stale) read_ple_tokens(sh);
  }
  ple_calls_ = 0;
  qsa_sparse_ = false;
  for (const auto& [ratio, budget] : qsa_configs_)
    qsa_sparse_ = qsa_sparse_ || drops_blocks(ratio, budget);
  upload_layout(layout);
  choose_mode(layout);
}

void CudaOps::upload_layout(const StepLayout& l) {
  int max_slot = -1;
  int64_t max_count = 0;
  for (int s = 0; s < l.n_spans; ++s) {
    max_slot = std::max(max_slot, static_cast<int>(l.spans[s].slot));
    max_count = std::max<int64_t>(max_count, l.spans[s].count);
  }
  const int64_t pt_ints = (max_slot + 1) * l.page_table_stride;
  const int64_t tok_off = 0, pos_off = round_up(l.n * 4, 256);
  const int64_t span_off = pos_off + round_up(l.n * 4, 256);
  const int64_t out_off = span_off + round_up(l.n_spans * int64_t{sizeof(Span)}, 256);
  const int64_t pt_off = out_off + round_up(l.n_output_rows * 4, 256);
  const int64_t total = pt_off + round_up(pt_ints * 4, 256);
  uint8_t* host = layout_stage_.get(total);
  if (l.n) {
    std::memcpy(host + tok_off, l.tokens, l.n * 4);
    std::memcpy(host + pos_off, l.positions, l.n * 4);
  }
  if (l.n_spans) std::memcpy(host + span_off, l.spans, l.n_spans * sizeof(Span));
  if (l.n_output_rows) std::memcpy(host + out_off, l.output_rows, l.n_output_rows * 4);
  if (pt_ints) std::memcpy(host + pt_off, l.page_tables, pt_ints * 4);
  bool grew = false;
  uint8_t* dev = layout_dev_.get(total, &grew);
  if (grew) ++layout_generation_;
  QWENRT_CUDA_CHECK(
      cudaMemcpyAsync(dev, host, static_cast<size_t>(total), cudaMemcpyHostToDevice, stream_));
  dstep_ = {.tokens = reinterpret_cast<const int32_t*>(dev + tok_off),
            .positions = reinterpret_cast<const int32_t*>(dev + pos_off),
            .n = l.n,
            .spans = reinterpret_cast<const Span*>(dev + span_off),
            .n_spans = l.n_spans,
            .output_rows = reinterpret_cast<const int32_t*>(dev + out_off),
            .n_output_rows = l.n_output_rows,
            .page_tables = reinterpret_cast<const int32_t*>(dev + pt_off),
            .page_table_stride = l.page_table_stride,
            .max_tokens = 0,
            .max_span_count = max_count,
            .deltanet_mode = l.deltanet_mode,
            .keep_states = l.keep_states};
  // A graph bakes in these addresses: the offsets follow from n, n_spans and n_output_rows (part
  // of its key), the buffer's address from layout_generation_.
}

void CudaOps::choose_mode(const StepLayout& l) {
  mode_ = Mode::kEager;
  if (!graphs_enabled_ || !l.ends_in_sample || l.n > kMaxGraphRows) return;
  // The last element: the DeltaNet mode, whether the step keeps states (a launch more), whether
  // QSA layers drop blocks (other kernels than dense attention), whether it returns every row's
  // hidden state (a norm more) and whether it is the MTP block's (its head's rows are the
  // engine's draft vocabulary, the same in every MTP step that ends in a sample).
  int variant = static_cast<int>(l.deltanet_mode);
  for (bool bit : {l.keep_states, qsa_sparse_, l.all_hidden, l.mtp_block})
    variant = variant * 2 + (bit ? 1 : 0);
  const GraphKey key{l.n, l.n_spans, l.n_output_rows, dstep_.max_span_count, variant};
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second.generation == generation()) {
    mode_ = Mode::kReplay;
    replay_ = &it->second;
    op_count_ = 0;
    // The layout's upload is ahead of it on the stream; the ops' walk checks the count after.
    replay_launched_ = early_launch_ && !replay_->host_fed;
    if (replay_launched_) QWENRT_CUDA_CHECK(cudaGraphLaunch(replay_->exec, stream_));
    return;
  }
  if (it != graphs_.end()) {  // addresses moved since it was captured
    QWENRT_CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
    graphs_.erase(it);
  }
  int& seen = seen_[key];
  if (seen < 0) return;     // a capture of this shape met a transfer (end_capture): eager now
  if (seen++ == 0) return;  // the first step of a shape runs eagerly (warm-up)
  mode_ = Mode::kCapture;
  capture_key_ = key;
  capture_generation_ = generation();
  capture_host_fed_ = false;
  op_count_ = 0;
  QWENRT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
}

void CudaOps::end_capture(const char* what) {
  if (mode_ == Mode::kCapture) {
    prefetcher_->join(stream_);
    cudaGraph_t graph = nullptr;
    QWENRT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    Graph g;
    QWENRT_CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
    QWENRT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g.n_nodes));
    QWENRT_CUDA_CHECK(cudaGraphDestroy(graph));
    g.generation = capture_generation_;
    g.n_ops = op_count_;
    g.host_fed = capture_host_fed_;
    QWENRT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
    if (g.generation != generation() || what) {
      QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
      QWENRT_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
      if (what) seen_[capture_key_] = -1;  // never again for this shape (choose_mode)
    } else {
      log(LogLevel::kInfo, "cuda: captured a {}-row step: {} ops, {} graph nodes",
          std::get<0>(capture_key_), g.n_ops, g.n_nodes);
      graphs_[capture_key_] = g;
    }
  } else if (mode_ == Mode::kReplay) {
    if (what) fail("cuda backend: {} inside a replayed step", what);
    if (op_count_ != replay_->n_ops) {
      fail("cuda backend: a replayed step called {} ops, its graph holds {}", op_count_,
           replay_->n_ops);
    }
    if (!replay_launched_) QWENRT_CUDA_CHECK(cudaGraphLaunch(replay_->exec, stream_));
    replay_launched_ = false;
  }
  mode_ = Mode::kEager;
}

void CudaOps::abort_capture() {
  cudaGraph_t graph = nullptr;
  prefetcher_->join(stream_, false);
  cudaStreamEndCapture(stream_, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  mode_ = Mode::kEager;
}

void CudaOps::sample(const float* logits, int64_t n_vocab, const SamplingRow* rows, int n_top,
                     SampledToken* out) {
  end_capture(nullptr);
  const int64_t n_rows = host_step_.n_output_rows;
  if (n_rows == 0) return;
  // Pack the rows and their arrays, validated as ref does.
  int64_t n_bias = 0, n_hist = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    n_bias += static_cast<int64_t>(rows[i].logit_bias.size());
    n_hist += static_cast<int64_t>(rows[i].history.size());
  }
  const int64_t rows_bytes = round_up(n_rows * int64_t{sizeof(cuda::DeviceSamplingRow)}, 256);
  const int64_t bias_ids_off = rows_bytes, bias_val_off = bias_ids_off + round_up(n_bias * 4, 256);
  const int64_t hist_off = bias_val_off + round_up(n_bias * 4, 256);
  const int64_t total = hist_off + round_up(n_hist * 4, 256);
  uint8_t* host = sample_stage_.get(total);
  auto* drows = reinterpret_cast<cuda::DeviceSamplingRow*>(host);
  auto* bias_ids = reinterpret_cast<int32_t*>(host + bias_ids_off);
  auto* bias_vals = reinterpret_cast<float*>(host + bias_val_off);
  auto* hist = reinterpret_cast<int32_t*>(host + hist_off);
  int32_t nb = 0, nh = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    const SamplingRow& r = rows[i];
    cuda::DeviceSamplingRow& d = drows[i];
    d.temperature = r.temperature;
    d.top_p = r.top_p;
    d.min_p = r.min_p;
    d.top_k = r.top_k;
    d.presence_penalty = r.presence_penalty;
    d.frequency_penalty = r.frequency_penalty;
    d.repetition_penalty = r.repetition_penalty;
    d.bias_begin = nb;
    d.bias_count = static_cast<int32_t>(r.logit_bias.size());
    for (const auto& [id, bias] : r.logit_bias) {
      if (id < 0 || id >= n_vocab) {
        fail("logit_bias: token id {} is outside the vocabulary of {}", id, n_vocab);
      }
      bias_ids[nb] = id;
      bias_vals[nb++] = bias;
    }
    d.history_begin = nh;
    d.history_count = static_cast<int32_t>(r.history.size());
    for (int32_t t : r.history) hist[nh++] = t;
    d.u = r.u;
    d.n_top = n_top;
  }
  bool plain_greedy = n_top == 0, logprobs = false;
  for (int64_t i = 0; i < n_rows && plain_greedy; ++i) {
    const SamplingRow& r = rows[i];
    plain_greedy = r.temperature == 0 && r.logit_bias.empty() && r.presence_penalty == 0 &&
                   r.frequency_penalty == 0 && r.repetition_penalty == 1;
    logprobs = logprobs || r.logprobs;
  }
  const int64_t out_bytes = n_rows * int64_t{sizeof(SampledToken)};
  auto* dout = reinterpret_cast<SampledToken*>(sample_out_dev_.get(out_bytes));
  {
    Scope s(this, op_class::kSample);
    if (plain_greedy && n_rows <= 65535) {
      void* ws = arena_.take(cuda::sample_greedy_workspace_bytes(n_rows));
      cuda::sample_greedy(logits, n_vocab, n_rows, dout, ws, counters(n_rows), logprobs, stream_);
    } else {  // the rows go up only where the kernel reads them
      uint8_t* dev = sample_dev_.get(total);
      QWENRT_CUDA_CHECK(
          cudaMemcpyAsync(dev, host, static_cast<size_t>(total), cudaMemcpyHostToDevice, stream_));
      void* ws = arena_.take(cuda::sample_workspace_bytes(n_rows, n_vocab));
      cuda::sample(logits, n_vocab, reinterpret_cast<const cuda::DeviceSamplingRow*>(dev), n_rows,
                   reinterpret_cast<const int32_t*>(dev + bias_ids_off),
                   reinterpret_cast<const float*>(dev + bias_val_off),
                   reinterpret_cast<const int32_t*>(dev + hist_off), dout, ws, stream_);
    }
  }
  auto* hout = reinterpret_cast<SampledToken*>(sample_out_host_.get(out_bytes));
  QWENRT_CUDA_CHECK(
      cudaMemcpyAsync(hout, dout, static_cast<size_t>(out_bytes), cudaMemcpyDeviceToHost, stream_));
  QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profile_) profiler_.collect();
  for (int64_t i = 0; i < n_rows; ++i) {
    if (hout[i].id < 0) fail("sampling: every token was excluded");
    out[i] = hout[i];
  }
}

unsigned CudaOps::parse_drop(const char* v) {
  if (v == nullptr) return 0;
  static constexpr std::pair<const char*, unsigned> kNames[] = {
      {"norm", kDropNorm},     {"matmul", kDropMatmul},       {"group", kDropGroup},
      {"heads", kDropHeads},   {"attention", kDropAttention}, {"deltanet", kDropDeltaNet},
      {"router", kDropRouter}, {"experts", kDropExperts},     {"combine", kDropCombine},
      {"shared", kDropShared}};
  unsigned mask = 0;
  std::string list(v);
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    bool known = name.empty();
    for (const auto& [n, bit] : kNames) {
      if (name == n) {
        mask |= bit;
        known = true;
      }
    }
    if (!known) fail("QWENRT_CUDA_DROP: unknown kernel class '{}'", name);
    at = end + 1;
  }
  return mask;
}

}  // namespace qwenrt::ops::cuda

namespace qwenrt::ops {

bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return count > 0;
  }();
  return available;
}

std::string cuda_unsupported(int head_dim, int ssm_head_dim) {
  // The limits attention.cu and deltanet.cu check at every call.
  if (!cuda::attention_head_dim_ok(head_dim))
    return fmt::format("attention head_dim {} (the kernels take 64, 128 or 256)", head_dim);
  if (ssm_head_dim < 1 || ssm_head_dim > 256)
    return fmt::format("DeltaNet head_dim {} (the kernels take at most 256)", ssm_head_dim);
  return "";
}

std::unique_ptr<Ops> make_cuda_ops(int device) {
  if (!cuda_available()) fail("cuda backend: no usable GPU (cudaGetDeviceCount found none)");
  return std::make_unique<cuda::CudaOps>(device);
}

}  // namespace qwenrt::ops
