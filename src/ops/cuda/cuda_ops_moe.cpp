// The CUDA backend's MoE block (cuda_ops.h): the routing (with the FFN's norm folded in for
// decode-sized steps), the routed experts by the path the step's size and types choose (one
// decode row in two launches, per-pair GEMVs, int8 or bf16 grouped GEMMs), the shared expert
// beside them on the side stream, and the weighted sum; with streamed experts (expert_stream.h)
// the routed experts of runs of rows over the device pool.
#include <algorithm>
#include <cstdint>
#include <tuple>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/expert_runs.h"

namespace qwenrt::ops::cuda {

cuda::NormRouteArgs CudaOps::norm_route_args(const NormedInput& in, const MoeWeights& w, int64_t n,
                                             int n_expert, int k) {
  const Matrix router = matrix(w.router);
  cuda::NormRouteArgs a{};
  a.x = in.x;
  a.delta = in.delta;
  a.norm = ref::f32_data(*in.norm);
  a.eps = in.eps;
  a.h = in.h;
  a.n = n;
  a.dim = in.dim;
  a.router = router.dtype == DType::F32 && router.in == in.dim && router.out == n_expert
                 ? static_cast<const float*>(router.data)
                 : nullptr;
  a.n_expert = n_expert;
  a.k = k;
  a.counters = counters(cuda::kNormRouteMaxRows);
  a.gate_inp = w.shared_gate_inp.present() ? ref::f32_data(w.shared_gate_inp) : nullptr;
  return a;
}

void CudaOps::stream_experts(const ExpertStreaming& c) {
  if (placed_bytes_ > 0) fail("cuda backend: experts can stream only before weights are placed");
  experts_ =
      std::make_unique<cuda::ExpertStream>(c.budget_bytes, c.slot_bytes, c.min_slots, stream_);
  graphs_enabled_ = false;  // the host picks each step's slots
}

int64_t CudaOps::device_memory_free() const {
  size_t free = 0, total = 0;
  QWENRT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

ExpertStats CudaOps::expert_stats() const {
  return experts_ ? experts_->stats() : ExpertStats{};
}

void CudaOps::moe_block(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert,
                        int k, const NormedInput* pre) {
  if (w.expert_base != 0 || w.down_exps.view.ne[2] != n_expert)
    fail("cuda moe: expert parallelism is not implemented on this backend yet");
  const int64_t dim = w.down_exps.view.ne[1];
  // The routed matrices: placed, or over the expert cache's pool, whose experts are its slots.
  Matrix gate, up, down;
  if (experts_) {
    const cuda::ExpertStream::Mats m = experts_->mats(w);
    gate = m.gate, up = m.up, down = m.down;
  } else if (w.gate_up_exps.present()) {
    std::tie(gate, up) = cuda::gate_up_halves(matrix(w.gate_up_exps));
  } else {
    gate = matrix(w.gate_exps), up = matrix(w.up_exps);
  }
  if (!experts_) down = matrix(w.down_exps);
  // The expert ids the routed kernels see: the router's, or slots of the pool.
  const int n_ids = experts_ ? experts_->capacity() : n_expert;
  const Matrix router = matrix(w.router);
  const int64_t ff = gate.out;
  const bool shared = w.shared_down.present();
  float* logits = alloc(n * n_expert);
  auto* ids = reinterpret_cast<int32_t*>(alloc(n * k));
  auto* slot_ids = experts_ ? reinterpret_cast<int32_t*>(alloc(n * k)) : nullptr;
  float* weights = alloc(n * k);
  float* mid = alloc(n * k * ff);
  float* routed = shared ? alloc(n * dim) : out;
  float* pairs = alloc(n * k * dim);
  const Matrix sg = shared ? matrix(w.shared_gate) : Matrix{};
  const Matrix su = shared ? matrix(w.shared_up) : Matrix{};
  const Matrix sd = shared ? matrix(w.shared_down) : Matrix{};
  const int64_t sff = shared ? sg.out : 0;
  float* smid = shared ? alloc(n * sff) : nullptr;
  float* sout = shared ? alloc(n * dim) : nullptr;
  float* shared_scale = shared ? alloc(n) : nullptr;
  int64_t ws_bytes =
      std::max({cuda::matmul_workspace_bytes(router, n), cuda::matmul_workspace_bytes(gate, n * k),
                cuda::matmul_workspace_bytes(down, n * k)});
  if (shared) {
    ws_bytes = std::max({ws_bytes, cuda::matmul_swiglu_workspace_bytes(sg, n),
                         cuda::matmul_workspace_bytes(sd, n)});
  }
  // Many rows: the routed experts as grouped GEMMs over the pairs ordered by expert.
  // On int8 tensor cores where the types allow (QWENRT_CUDA_MOE_MMQ=0: the bf16 kernels).
  // (A pool of more slots than the ordering takes runs the per-pair kernels.)
  const bool orderable = n_ids <= cuda::kMaxOrderedExperts;
  const bool mmq = orderable && n >= mmq_min_rows_ && cuda::mmq_experts_enabled() &&
                   cuda::mmq_experts_fit(gate, up, down);
  const bool grouped = orderable && !mmq && n >= grouped_min_rows_ &&
                       cuda::grouped_experts_fit(gate) && cuda::grouped_experts_fit(down);
  void* order_ws =
      grouped || mmq ? arena_.take(cuda::expert_order_workspace_bytes(n * k, n_ids)) : nullptr;
  void* mmq_ws =
      mmq ? arena_.take(cuda::mmq_experts_workspace_bytes(n, gate.in, n * k, ff)) : nullptr;
  // The shared expert runs on the side stream, beside the routed experts (its own workspace).
  // (The side stream runs its ops one after another too: its scratch is reused like scratch_.)
  if (shared) side_scratch_.rewind();
  void* side_ws = shared ? side_scratch_.take(ws_bytes) : nullptr;
  if (skip(ws_bytes)) return;
  Scope s(this, op_class::kMoe);
  // The chosen experts' weights asked into L2 by the routing kernel (decode-sized steps): the
  // down halves arrive while the gate and up GEMVs run.
  cuda::ExpertPrefetch expert_prefetch;
  if (n <= kMaxPrefetchRows && !mmq && !grouped) {
    const Matrix* chosen[] = {&down, &gate, &up};
    for (int i = 0; i < prefetcher_->expert_tensors(); ++i) {
      const Matrix& m = *chosen[i];
      if (!placed(m.data, (m.n_expert - 1) * m.expert_bytes + m.out * m.row_bytes)) continue;
      expert_prefetch.base[i] = m.data;
      expert_prefetch.stride[i] = m.expert_bytes;  // a fused gate_up: both halves' stride
      expert_prefetch.bytes[i] = m.out * m.row_bytes;
    }
  }
  // One decode row with a shared expert: the routed and shared experts side by side in two
  // launches on this stream (cuda::moe_row) where the types have that pair of kernels (not with
  // streamed experts: the host reads the ids between the routing and the experts).
  const cuda::MoeRow row{.gate = gate,
                         .up = up,
                         .down = down,
                         .shared_gate = sg,
                         .shared_up = su,
                         .shared_down = sd,
                         .ids = ids,
                         .weights = weights,
                         .k = k,
                         .h = x,
                         .mid = mid,
                         .shared_mid = smid,
                         .shared_scale = shared_scale,
                         .out = out};
  const bool one_row = n == 1 && shared && moe_row_ && !experts_ && down_combine_ && !mmq &&
                       !grouped && !dropped(kDropShared) && !dropped(kDropExperts) &&
                       !dropped(kDropCombine) && cuda::moe_row(row, false, stream_);
  if (pre) {  // x = pre->h is written by this kernel
    cuda::NormRouteArgs a = norm_route_args(*pre, w, n, n_expert, k);
    a.logits = logits;
    a.ids = ids;
    a.weights = weights;
    a.shared_scale = shared_scale;
    a.prefetch = expert_prefetch;
    // The routing and the row's experts in one launch where there is that kernel.
    if (one_row && cuda::moe_row(row, true, stream_, &a)) {
      prefetch_after({router}, n, stream_);
      return;
    }
    cuda::moe_norm_route(a, stream_);
    prefetch_after({router}, n, stream_);
  }
  if (shared && !one_row && !dropped(kDropShared)) {
    QWENRT_CUDA_CHECK(cudaEventRecord(fork_, stream_));
    QWENRT_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
    cuda::matmul_swiglu(sg, su, x, smid, n, side_ws, side_);
    prefetch_after({sg, su}, n, side_);
    cuda::matmul(sd, smid, sout, n, side_ws, side_);
    prefetch_after({sd}, n, side_);
    QWENRT_CUDA_CHECK(cudaEventRecord(join_, side_));
  }
  if (!pre) {
    if (!dropped(kDropRouter)) cuda::matmul(router, x, logits, n, ws_, stream_);
    prefetch_after({router}, n, stream_);
    cuda::moe_route(logits, n, n_expert, k, ids, weights, x,
                    shared ? ref::f32_data(w.shared_gate_inp) : nullptr, dim, shared_scale, stream_,
                    expert_prefetch);
  }
  if (one_row) {
    cuda::moe_row(row, true, stream_);
    return;
  }
  // Before the sum: the shared expert (the per-pair paths skip the wait when it was dropped).
  const auto join_shared = [&](bool always) {
    if (shared && (always || !dropped(kDropShared)))
      QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
  };
  // The routed experts of rows [r0, r0 + rows), whose expert ids (of the matrices above) are
  // rid [rows, k], and the sum into out.
  const auto routed_rows = [&](const int32_t* rid, int64_t r0, int64_t rows) {
    const float* xr = x + r0 * dim;
    const float* wr = weights + r0 * k;
    float* mid_r = mid + r0 * k * ff;
    float* pairs_r = pairs + r0 * k * dim;
    float* out_r = out + r0 * dim;
    float* sout_r = shared ? sout + r0 * dim : nullptr;
    float* scale_r = shared ? shared_scale + r0 : nullptr;
    if (mmq) {
      const cuda::ExpertOrder order = cuda::order_by_expert(
          rid, rows * k, n_ids, cuda::mmq_tile_rows(rows * k, n_ids), order_ws, stream_);
      cuda::mmq_experts(gate, up, down, order, k, xr, rows, pairs_r, mmq_ws, stream_);
      join_shared(true);
      cuda::moe_combine_pairs(pairs_r, wr, k, sout_r, scale_r, out_r, rows, dim, stream_);
      return;
    }
    if (grouped) {
      const cuda::ExpertOrder order =
          cuda::order_by_expert(rid, rows * k, n_ids, cuda::grouped_tile_rows(), order_ws, stream_);
      cuda::grouped_experts_swiglu(gate, up, order, k, xr, mid_r, stream_);
      cuda::grouped_experts_down(down, order, mid_r, pairs_r, stream_);
      join_shared(true);
      cuda::moe_combine_pairs(pairs_r, wr, k, sout_r, scale_r, out_r, rows, dim, stream_);
      return;
    }
    const bool experts = !dropped(kDropExperts);
    // (Each run of rows takes the kernels the whole step of n rows takes.)
    if (experts) cuda::experts_swiglu(gate, up, rid, k, xr, mid_r, rows, ws_, stream_, n);
    // The routed down, the weighted sum and the shared expert in one launch where it fits
    // (QWENRT_CUDA_DOWN_COMBINE=0: the down pairs, then the combine).
    if (down_combine_ && experts && !dropped(kDropCombine)) {
      join_shared(false);
      if (cuda::experts_down_combine(down, rid, wr, k, mid_r, sout_r, scale_r, out_r, rows, stream_,
                                     n))
        return;
    }
    // Each routed expert's down on its own warps, summed with the shared expert in the combine;
    // the looping kernel where the type has no staged path.
    if (!experts || cuda::experts_down_pairs(down, rid, k, mid_r, pairs_r, rows, ws_, stream_, n)) {
      join_shared(false);
      if (!dropped(kDropCombine))
        cuda::moe_combine_pairs(pairs_r, wr, k, sout_r, scale_r, out_r, rows, dim, stream_);
      return;
    }
    float* routed_r = routed + r0 * dim;
    cuda::experts_down(down, rid, wr, k, mid_r, routed_r, rows, ws_, stream_);
    if (shared) {
      join_shared(true);
      cuda::moe_combine(routed_r, sout_r, scale_r, out_r, rows, dim, stream_);
    }
  };
  if (!experts_) return routed_rows(ids, 0, n);
  // Streamed experts: the step's ids read back, then runs of rows whose experts fit the pool
  // together, each fetched and run over its slots.
  int32_t* host_ids = experts_->host_ids(n * k);
  QWENRT_CUDA_CHECK(cudaMemcpyAsync(host_ids, ids, static_cast<size_t>(n * k) * 4,
                                    cudaMemcpyDeviceToHost, stream_));
  QWENRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  int32_t* host_slots = experts_->host_slots(n * k);
  for (int64_t r0 = 0, rows = 0; r0 < n; r0 += rows) {
    rows = cuda::next_expert_run(host_ids, n, k, n_expert, experts_->capacity(), r0);
    experts_->fetch(w, host_ids + r0 * k, rows * k, host_slots + r0 * k);
    QWENRT_CUDA_CHECK(cudaMemcpyAsync(slot_ids + r0 * k, host_slots + r0 * k,
                                      static_cast<size_t>(rows * k) * 4, cudaMemcpyHostToDevice,
                                      stream_));
    routed_rows(slot_ids + r0 * k, r0, rows);
  }
}

}  // namespace qwenrt::ops::cuda
