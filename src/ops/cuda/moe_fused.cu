// A decode row's whole MoE FFN in one launch (kernels.h, moe_row with a NormRouteArgs): the
// FFN input's add and norm, the router, the routing, the routed and shared experts' gate / up and
// their down, in three phases of one persistent grid separated by two grid-wide barriers.
//
// The same work otherwise takes three launches (moe.cu's norm_route_kernel, then
// gemv_resident.cu's two resident_two_kernel launches), each paying a kernel boundary and a
// ramp: on an H100 the three took 26.5 us a 35B-A3B layer for 19.6 MB of weights (6 us of
// bandwidth). Measured, this kernel is slower (38.6 us; 35B-A3B 354 against 431 tok/s): its two
// barriers cost 3.1 us, the routing in every routed block 6.2 us, and its GEMV phases under one
// 128-register kernel ~3 us more (bench/results/h100-moe-fused-2026-12-06.md). Off by default
// (QWENRT_CUDA_MOE_FUSED=1). Here:
// - A: every block forms x + delta and its norm h in shared memory (norm_route_kernel's
//   arithmetic: h bit for bit), then warp w of block b computes router row w * blocks + b (and
//   the shared expert's gate as row n_expert), each row one warp's dot4_warp as there. Barrier.
// - B: blocks [0, b1) route the row (one warp, route_row_warp: the same ids and weights as
//   norm_route_kernel) and run the routed experts' gate / up on h and those ids (in shared
//   memory); blocks [b1, G) run the shared expert's gate / up, then route the row too. Block 0
//   writes x, h, ids and weights for anything after the kernel. Barrier.
// - C: blocks [0, c1) the routed down summed over the pairs, blocks [c1, G) the shared down times
//   its gate, both adding into out (zeroed in B). Every block knows the ids before the barrier,
//   so its first rows' weights load before it.
// B and C are gemv_resident.cuh's resident_body with the two-launch path's arguments, so every
// output (mid, shared_mid, out) equals that path's bit for bit.
//
// The grid is at most what fits on the GPU at once (the barriers need every block resident). The
// barriers' counters (three unsigned ints, zero before the launch) are reset by the last block to
// finish. Blocks touch them only after pdl_wait, so a later launch on the same counters cannot
// see this one's.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ops/cuda/check.h"
#include "ops/cuda/gemv_resident.cuh"
#include "ops/cuda/gemv_resident_plan.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/prefetch.cuh"
#include "ops/cuda/routing.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

static_assert(kRouteThreads == kResRowWarps * 32, "one block shape for the norm and the GEMVs");

struct FusedArgs {
  NormRouteArgs r;
  ResidentArgs gu, sgu, down, sdown;
  int b1 = 0, c1 = 0;  // blocks of the routed parts in B and C
  int res_bytes = 0;   // the resident bodies' shared memory; h, ids and weights after it
  // Timing only (QWENRT_CUDA_MOE_FUSED_DROP, the output is wrong): kDropBarriers skips both grid
  // barriers, kDropRouting gives every block fixed ids and weights instead of routing.
  int drop = 0;
};

// Every block of the grid waits here until all have arrived (counter: zero before the first
// barrier on it; `target` = blocks, the arrivals it waits for). Writes before it are visible after
// it to every block. One thread a block arrives (a release add that returns nothing) and polls
// with an acquire load, backing off between polls so that the arrivals are not queued behind the
// polls.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    unsigned seen = 0;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= target) break;
      __nanosleep(64);
    }
  }
  __syncthreads();
}

constexpr int kDropBarriers = 1, kDropRouting = 2;

struct GridWait {
  unsigned* counter;
  unsigned target;
  bool skip;
  __device__ __forceinline__ void operator()() const {
    if (!skip) grid_barrier(counter, target);
  }
};

template <int NV, int kPerLane>
__global__ void __launch_bounds__(kResRowWarps * 32, 2)
    moe_fused_kernel(const __grid_constant__ FusedArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const NormRouteArgs& r = a.r;
  const int64_t dim4 = r.dim / 4;
  auto* s_h = reinterpret_cast<float4*>(smem + a.res_bytes);  // [dim4]
  auto* s_ids = reinterpret_cast<int32_t*>(s_h + dim4);       // [32]
  auto* s_w = reinterpret_cast<float*>(s_ids + 32);           // [32]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned blocks = gridDim.x;
  pdl_launch_dependents();

  // A: the norm and the router rows of this block's warps, their weights asked into L2 first.
  const auto* router = reinterpret_cast<const float4*>(r.router);
  const auto* gate4 = reinterpret_cast<const float4*>(r.gate_inp);
  const int n_rows = r.n_expert + (gate4 ? 1 : 0);
  const int first = warp * int(blocks) + int(blockIdx.x), step = kResRowWarps * int(blocks);
  if (lane == 0) {
    for (int e = first; e < n_rows; e += step)
      l2_prefetch_range(e < r.n_expert ? router + e * dim4 : gate4, dim4 * 16);
  }
  const auto* norm4 = reinterpret_cast<const float4*>(r.norm);
  float4 v[NV], w[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) w[j] = norm4[threadIdx.x + int64_t{j} * kRouteThreads];
  pdl_wait();  // x and delta come from earlier kernels
  add_norm_row<NV>(reinterpret_cast<const float4*>(r.x), reinterpret_cast<const float4*>(r.delta),
                   w, r.eps, dim4, v, s_h);
  for (int e = first; e < n_rows; e += step) {
    const float acc = dot4_warp(e < r.n_expert ? router + e * dim4 : gate4, s_h, dim4);
    if (lane == 0) {
      if (e < r.n_expert) {
        r.logits[e] = acc;
      } else {
        r.shared_scale[0] = sigmoid(acc);
      }
    }
  }
  if (!(a.drop & kDropBarriers)) grid_barrier(r.counters, blocks);

  // B: every block has read x and delta; block 0 writes x and h.
  if (blockIdx.x == 0) {
    auto* x4 = reinterpret_cast<float4*>(r.x);
    auto* h4 = reinterpret_cast<float4*>(r.h);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kRouteThreads;
      x4[i] = v[j];
      h4[i] = s_h[i];
    }
  }
  const auto route = [&]() {
    if ((a.drop & kDropRouting) && blockIdx.x != 0) {
      if (int(threadIdx.x) < r.k) {
        s_ids[threadIdx.x] = static_cast<int32_t>((threadIdx.x * 37 + 11) % r.n_expert);
        s_w[threadIdx.x] = 1.0f / float(r.k);
      }
    } else if (warp == 0) {
      route_row_warp<kPerLane>(r.logits, r.n_expert, r.k, s_ids, s_w,
                               blockIdx.x == 0 ? r.prefetch : ExpertPrefetch{});
    }
    __syncthreads();
    if (blockIdx.x == 0 && int(threadIdx.x) < r.k) {
      r.ids[threadIdx.x] = s_ids[threadIdx.x];
      r.weights[threadIdx.x] = s_w[threadIdx.x];
    }
  };
  const auto* h = reinterpret_cast<const float*>(s_h);
  if (int(blockIdx.x) < a.b1) {
    route();
    resident_body<qb::Q4K64, 1, kResExperts, true>(a.gu, {h, s_ids, nullptr}, blockIdx.x, a.b1,
                                                   smem);
  } else {
    resident_body<qb::Q80S, 1, kResSwiglu, true>(a.sgu, {h, nullptr, nullptr}, blockIdx.x - a.b1,
                                                 blocks - a.b1, smem);
    route();
  }
  __syncthreads();  // the shared memory of B is C's

  // C: the downs, their first weights loaded before the barrier that makes mid whole.
  const GridWait mid_ready{r.counters + 1, blocks, (a.drop & kDropBarriers) != 0};
  if (int(blockIdx.x) < a.c1) {
    resident_body<qb::Q4K64, 2, kResCombine, true>(a.down, {a.down.x, s_ids, s_w}, blockIdx.x, a.c1,
                                                   smem, mid_ready);
  } else {
    resident_body<qb::Q80S, 1, kResJobs, true>(a.sdown, inputs_of(a.sdown), blockIdx.x - a.c1,
                                               blocks - a.c1, smem, mid_ready);
  }

  // The last block out resets the counters for the next launch.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(r.counters + 2, 1u) == blocks - 1) {
      r.counters[0] = 0;
      r.counters[1] = 0;
      r.counters[2] = 0;
    }
  }
}

// QWENRT_CUDA_MOE_FUSED=1 turns it on (read per call: tests switch it); off by default: it
// measured slower than the three launches (35B-A3B 344 against 421 tok/s on an H100 with the
// first barrier, bench/results/h100-moe-fused-2026-12-06.md).
bool fused_on() {
  const char* v = std::getenv("QWENRT_CUDA_MOE_FUSED");
  return v && v[0] == '1';
}

template <int NV, int kPerLane>
bool launch_fused(FusedArgs f, bool launch, cudaStream_t stream) {
  auto* kernel = moe_fused_kernel<NV, kPerLane>;
  static const size_t kMaxSmem = max_dynamic_smem(kernel);
  const size_t extra = size_t(f.r.dim) * 4 + 64 * 4;  // h, ids and weights
  const auto fits = [&](size_t smem) {
    int per_sm = 0;
    QWENRT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kResRowWarps * 32, smem));
    return int64_t{per_sm} * sm_count();
  };
  QWENRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kMaxSmem)));
  // Blocks: at most what fits with h, ids and weights alone, then fewer until the memory the
  // parts' split needs still lets every block be resident at once.
  int64_t total = fits(extra);
  size_t smem = 0;
  for (;;) {
    if (total < 2) return false;
    const TwoSplit b =
        split_two<qb::Q4K64, kResExperts, qb::Q80S, kResSwiglu>(f.gu, f.sgu, total, true);
    const TwoSplit c =
        split_two<qb::Q4K64, kResCombine, qb::Q80S, kResJobs>(f.down, f.sdown, total, true);
    f.b1 = static_cast<int>(b.b1);
    f.c1 = static_cast<int>(c.b1);
    f.res_bytes = static_cast<int>((std::max(b.smem, c.smem) + 15) / 16 * 16);
    smem = size_t(f.res_bytes) + extra;
    if (smem > kMaxSmem) return false;
    const int64_t resident = fits(smem);
    if (resident >= total) break;
    total = resident;
  }
  if (launch) {
    launch_with_pdl(pdl_on(), kernel, dim3(static_cast<unsigned>(total)), dim3(kResRowWarps * 32),
                    smem, stream, f);
  }
  return true;
}

}  // namespace

bool resident_moe_fused(const MoeRowArgs& m, const NormRouteArgs& r, bool launch,
                        cudaStream_t stream) {
  MoeRowParts p;
  if (!fused_on() || r.n != 1 || !norm_route_fits(r) || r.k > 32 || r.dim != m.dim || r.h != m.h ||
      r.ids != m.ids || r.weights != m.weights || r.shared_scale != m.shared_scale ||
      r.gate_inp == nullptr || !moe_row_parts(m, p))
    return false;
  // The pairing resident_moe_row takes (routed Q4_K, shared Q8_0), the kernel's only one.
  if (!plan_is<qb::Q4K64, 1>(p.p_gu) || !plan_is<qb::Q80S, 1>(p.p_sgu) ||
      !plan_is<qb::Q4K64, 2>(p.p_down) || !plan_is<qb::Q80S, 1>(p.p_sdown))
    return false;
  FusedArgs f{.r = r, .gu = p.gu, .sgu = p.sgu, .down = p.down, .sdown = p.sdown};
  if (const char* d = std::getenv("QWENRT_CUDA_MOE_FUSED_DROP")) {
    const std::string drop = d;
    f.drop = (drop.find("barriers") != std::string::npos ? kDropBarriers : 0) |
             (drop.find("routing") != std::string::npos ? kDropRouting : 0);
  }
  // Rows of 2048 (the 35B-A3B's; the two-launch pairing takes no other width of the family) and
  // 129..256 experts; others take the two-launch path.
  if (r.dim != 2048 || r.n_expert <= 128 || r.n_expert > 256) return false;
  return launch_fused<2, 8>(f, launch, stream);
}

}  // namespace qwenrt::ops::cuda::mm
