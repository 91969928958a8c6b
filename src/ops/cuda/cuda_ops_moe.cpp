// The CUDA backend's MoE block (cuda_ops.h): the routing (with the FFN's norm folded in for
// decode-sized steps), the routed experts by the path the step's size and types choose (one
// decode row in two launches, per-pair GEMVs, int8 or bf16 grouped GEMMs), the shared expert
// beside them on the side stream, and the weighted sum.
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

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

void CudaOps::moe_block(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert,
                        int k, const NormedInput* pre) {
  if (w.expert_base != 0 || w.down_exps.view.ne[2] != n_expert)
    fail("cuda moe: expert parallelism is not implemented on this backend yet");
  const int64_t dim = w.down_exps.view.ne[1];
  const bool fused = w.gate_up_exps.present();
  const Matrix gate_up = fused ? matrix(w.gate_up_exps) : Matrix{};
  Matrix gate = fused ? gate_up : matrix(w.gate_exps);
  Matrix up = fused ? gate_up : matrix(w.up_exps);
  if (fused) {  // gate rows, then up rows, of each expert
    gate.out = up.out = gate_up.out / 2;
    up.data = static_cast<const uint8_t*>(gate_up.data) + gate.out * gate_up.row_bytes;
  }
  const Matrix down = matrix(w.down_exps), router = matrix(w.router);
  const int64_t ff = gate.out;
  const bool shared = w.shared_down.present();
  float* logits = alloc(n * n_expert);
  auto* ids = reinterpret_cast<int32_t*>(alloc(n * k));
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
  const bool mmq =
      n >= mmq_min_rows_ && cuda::mmq_experts_enabled() && cuda::mmq_experts_fit(gate, up, down);
  const bool grouped = !mmq && n >= grouped_min_rows_ && cuda::grouped_experts_fit(gate) &&
                       cuda::grouped_experts_fit(down);
  void* order_ws =
      grouped || mmq ? arena_.take(cuda::expert_order_workspace_bytes(n * k, n_expert)) : nullptr;
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
  // launches on this stream (cuda::moe_row) where the types have that pair of kernels.
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
  const bool one_row = n == 1 && shared && moe_row_ && down_combine_ && !mmq && !grouped &&
                       !dropped(kDropShared) && !dropped(kDropExperts) && !dropped(kDropCombine) &&
                       cuda::moe_row(row, false, stream_);
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
  if (mmq) {
    const cuda::ExpertOrder order = cuda::order_by_expert(
        ids, n * k, n_expert, cuda::mmq_tile_rows(n * k, n_expert), order_ws, stream_);
    cuda::mmq_experts(gate, up, down, order, k, x, n, pairs, mmq_ws, stream_);
    if (shared) QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    cuda::moe_combine_pairs(pairs, weights, k, sout, shared_scale, out, n, dim, stream_);
    return;
  }
  if (grouped) {
    const cuda::ExpertOrder order =
        cuda::order_by_expert(ids, n * k, n_expert, cuda::grouped_tile_rows(), order_ws, stream_);
    cuda::grouped_experts_swiglu(gate, up, order, k, x, mid, stream_);
    cuda::grouped_experts_down(down, order, mid, pairs, stream_);
    if (shared) QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    cuda::moe_combine_pairs(pairs, weights, k, sout, shared_scale, out, n, dim, stream_);
    return;
  }
  const bool experts = !dropped(kDropExperts);
  if (experts) cuda::experts_swiglu(gate, up, ids, k, x, mid, n, ws_, stream_);
  // The routed down, the weighted sum and the shared expert in one launch where it fits
  // (QWENRT_CUDA_DOWN_COMBINE=0: the down pairs, then the combine).
  if (down_combine_ && experts && !dropped(kDropCombine)) {
    if (shared && !dropped(kDropShared)) QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    if (cuda::experts_down_combine(down, ids, weights, k, mid, sout, shared_scale, out, n, stream_))
      return;
  }
  // Each routed expert's down on its own warps, summed with the shared expert in the combine;
  // the looping kernel where the type has no staged path.
  if (!experts || cuda::experts_down_pairs(down, ids, k, mid, pairs, n, ws_, stream_)) {
    if (shared && !dropped(kDropShared)) QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    if (!dropped(kDropCombine))
      cuda::moe_combine_pairs(pairs, weights, k, sout, shared_scale, out, n, dim, stream_);
    return;
  }
  cuda::experts_down(down, ids, weights, k, mid, routed, n, ws_, stream_);
  if (shared) {
    QWENRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    cuda::moe_combine(routed, sout, shared_scale, out, n, dim, stream_);
  }
}

}  // namespace qwenrt::ops::cuda
