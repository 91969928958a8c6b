// The resident GEMV's kernel body (the host-side plan of its launches: gemv_resident_plan.cuh):
// one activation row of fp32, the batch-1 decode path. Shared by gemv_resident.cu (the GEMV
// launches) and moe_fused.cu (a decode row's whole MoE FFN in one launch). Internal to ops/cuda.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "ops/cuda/check.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {

// ---- Resident GEMV: the batch-1 decode path (n = 1) ------------------------------------------
// For the types whose 256-element blocks split into 8 units of 32 that load with 16- or 8-byte
// loads (Q4_K, Q5_K, IQ4_XS, Q8_0 in superblocks). The staged kernel (gemv_staged.cu) re-reads the
// activations for every row from L1 and stages the weights through shared memory; both cost
// load instructions per weight byte that the weight stream cannot afford. Here:
// - A row's n_units = in / 32 units are split into S slices of 32 UPL units, UPL = 1..4 units a
//   lane (resident_shape); a block is S x R warps (R = max(1, 8 / S) row lanes). Lane l of slice
//   s owns units 32 UPL s + 32 i + l of every row it visits, so its activations stay in
//   registers: the block quantises x
//   once into shared memory (quantize_q8_kernel's arithmetic, so the int8 values equal the
//   two-launch path's; rows longer than kResQuantiseInKernelMax take that kernel's output
//   instead) and each lane keeps its unit's int8 values, scales and scaled sums. A row then costs
//   its weight loads (consecutive lanes take consecutive units: coalesced) and the dot products.
// - Blocks are persistent (the grid is what fits on the GPU at once) and walk the row groups (R
//   rows) grid-strided; each warp keeps the weights of the next DEPTH rows in flight (registers:
//   3 rows ahead at one unit a lane, 1 at more). Slice partials meet in shared memory once at the
//   end, summed in a fixed order.
// - Programmatic dependent launch (sm_90, pdl.cuh): the kernel lets the next kernel launch at
//   once, and loads its first rows' weights (which no earlier kernel writes) before waiting for
//   the previous kernel's results.
inline constexpr int kResRowWarps = 8;    // warps a block aims for (S x R)
inline constexpr int kResMaxSlices = 18;  // rows up to 18432 wide (the 27B's FFN rows are 17408)

// The four shapes of work: matmul / matmul_group (jobs), a dense SwiGLU (gate and up rows
// together), routed experts' gate/up (rows pair * ff + row of expert ids[pair]), and routed
// experts' down per pair (blockIdx.y = pair p: rows of expert ids[p] against x row p, written to
// y row p), and routed experts' down summed over a token's pairs (kResCombine below).
enum ResidentMode { kResJobs = 0, kResSwiglu = 1, kResExperts = 2, kResPairs = 3, kResCombine = 4 };
// kResCombine: blockIdx.y = token t. Row r of its output is one row of k * ff elements: expert
// ids[t k + j]'s down row r for j = 0..k-1 side by side, against the token's k hidden rows x
// [t k .. t k + k, ff] side by side, whose block scales the block multiplies by the routing
// weights w[t k + j] after quantising them. So the row's dot is sum_j w_j (down_j row r . x_j),
// the weighted sum over the pairs; the store adds shared_scale[t] * shared[t, r]. ff is a
// multiple of 256 (a pair's row is whole superblocks).

struct ResidentArgs {
  const uint8_t* data[kMaxJobs];
  int64_t row_bytes[kMaxJobs];
  int64_t expert_bytes[2];
  float* y[kMaxJobs];
  int64_t first_row[kMaxJobs + 1];  // kResJobs: job j holds rows [first_row[j], first_row[j + 1])
  int n_jobs;
  int64_t total_rows;
  int64_t ff;             // kResExperts: rows per pair
  const int32_t* ids;     // kResExperts, kResPairs
  int64_t n_expert;       // kResExperts, kResPairs
  const float* x;         // [in] ([pairs, in] for kResPairs), 16-byte aligned
  const int8_t* xq;       // x already quantised (quantize_q8_kernel; long rows), or null
  const float* xd;        // its scales
  int in;                 // a multiple of 256
  int slices, row_lanes;  // S, R
  int max_groups;         // row groups a block visits, at most (the partials' shared memory)
  int stages;             // streamed kernel: stages of its shared-memory ring
  int64_t stage_bytes;    // bytes a stage (NM x R rows of row_bytes[0], rounded up to 128)
  int k;                  // kResCombine: pairs a token
  const float* weights;   // kResCombine: routing weights [tokens, k]
  const float* shared;    // kResCombine: the shared expert's output [tokens, total_rows], or null
  const float* shared_scale;  // kResCombine: its gate [tokens]
  // The MoE row's two launches (resident_moe_row): the first zeroes `zero` [zero_n] after its
  // wait; the second's parts add their rows into y (atomicAdd: two addends onto zero, so the
  // sum is the same whichever lands first), kResJobs rows times *out_scale.
  float* zero;
  int64_t zero_n;
  bool add_out;
  const float* out_scale;
};

template <int MODE>
constexpr int resident_mats() {
  return MODE == kResJobs || MODE == kResPairs || MODE == kResCombine ? 1 : 2;
}
// Rows a warp has in flight beyond the one it computes: with one unit a lane there are registers
// for three (two with two matrices); with more units a lane, one.
template <int UPL, int MODE>
constexpr int resident_depth() {
  return UPL > 1 ? 1 : resident_mats<MODE>() == 1 ? 3 : 2;
}
// Threads a block may have: slices of one unit a lane make up to 18 warps (9 with 64-element
// units); with more units a lane a block has at most 8 (and the registers that UPL x (1 + depth)
// units need).
template <int UE, int UPL>
constexpr int resident_max_threads() {
  return UPL == 1 ? kResMaxSlices * 32 * 32 / UE : kResRowWarps * 32;
}

// The weight rows of global row r (false: an expert id out of range; nothing to read).
template <int MODE>
__device__ __forceinline__ bool resident_rows(const ResidentArgs& a, const int32_t* ids, int64_t r,
                                              const uint8_t* (&ptr)[resident_mats<MODE>()]) {
  if constexpr (MODE == kResJobs) {
    int j = 0;
    while (j + 1 < a.n_jobs && r >= a.first_row[j + 1]) ++j;
    ptr[0] = a.data[j] + (r - a.first_row[j]) * a.row_bytes[j];
    return true;
  } else if constexpr (MODE == kResSwiglu) {
    ptr[0] = a.data[0] + r * a.row_bytes[0];
    ptr[1] = a.data[1] + r * a.row_bytes[1];
    return true;
  } else if constexpr (MODE == kResExperts) {
    const int64_t p = r / a.ff, row = r % a.ff;
    const int32_t e = ids[p];
    if (e < 0 || e >= a.n_expert) return false;
    ptr[0] = a.data[0] + e * a.expert_bytes[0] + row * a.row_bytes[0];
    ptr[1] = a.data[1] + e * a.expert_bytes[1] + row * a.row_bytes[1];
    return true;
  } else if constexpr (MODE == kResPairs) {
    const int32_t e = ids[blockIdx.y];
    if (e < 0 || e >= a.n_expert) return false;
    ptr[0] = a.data[0] + e * a.expert_bytes[0] + r * a.row_bytes[0];
    return true;
  } else {  // kResCombine: row r of every pair's expert; resident_load places the units
    ptr[0] = a.data[0] + r * a.row_bytes[0];
    return true;
  }
}

// kResCombine: whether every one of the token's k expert ids is in range.
__device__ __forceinline__ bool combine_ids_ok(const ResidentArgs& a, const int32_t* ids) {
  bool ok = true;
  for (int j = 0; j < a.k; ++j) {
    const int32_t e = ids[int64_t{blockIdx.y} * a.k + j];
    ok = ok && e >= 0 && e < a.n_expert;
  }
  return ok;
}

template <int MODE>
__device__ __forceinline__ void resident_store(const ResidentArgs& a, int64_t r,
                                               const float (&v)[resident_mats<MODE>()], bool ok) {
  if constexpr (MODE == kResJobs) {
    int j = 0;
    while (j + 1 < a.n_jobs && r >= a.first_row[j + 1]) ++j;
    float* y = a.y[j] + (r - a.first_row[j]);
    if (a.add_out) {
      atomicAdd(y, a.out_scale ? __fmul_rn(v[0], *a.out_scale) : v[0]);
    } else {
      *y = v[0];
    }
  } else if constexpr (MODE == kResPairs) {
    a.y[0][blockIdx.y * a.total_rows + r] = ok ? v[0] : __int_as_float(0x7fc00000);
  } else if constexpr (MODE == kResCombine) {
    const int64_t i = blockIdx.y * a.total_rows + r;
    float out = v[0];
    if (a.shared) out += a.shared_scale[blockIdx.y] * a.shared[i];
    if (!ok) out = __int_as_float(0x7fc00000);
    if (a.add_out) {
      atomicAdd(a.y[0] + i, out);
    } else {
      a.y[0][i] = out;
    }
  } else {
    a.y[0][r] = ok ? silu(v[0]) * v[1] : __int_as_float(0x7fc00000);
  }
}

// The rows of this block's groups from their slice partials (part[(m S + s) part_stride + t R +
// i]: matrix m, slice s, row i of the block's t-th group), summed in slice order, by threads tid
// of n.
template <int MODE>
__device__ __forceinline__ void resident_store_partials(const ResidentArgs& a, const int32_t* ids,
                                                        const float* part, int part_stride, int tid,
                                                        int n, int bx, int gx) {
  constexpr int NM = resident_mats<MODE>();
  const int S = a.slices, R = a.row_lanes;
  for (int l = tid; l < part_stride; l += n) {
    const int64_t row = (int64_t{bx} + int64_t{l / R} * gx) * R + l % R;
    if (row >= a.total_rows) continue;
    float v[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      float sum = 0.0f;
      for (int q = 0; q < S; ++q) sum += part[(m * S + q) * part_stride + l];
      v[m] = sum;
    }
    bool row_ok = true;
    if constexpr (MODE == kResExperts || MODE == kResPairs) {
      const int32_t e = ids[MODE == kResExperts ? row / a.ff : int64_t{blockIdx.y}];
      row_ok = e >= 0 && e < a.n_expert;
    } else if constexpr (MODE == kResCombine) {
      row_ok = combine_ids_ok(a, ids);
    }
    resident_store<MODE>(a, row, v, row_ok);
  }
}

// Elements a unit of T covers (32, or 64 for Q4K64), and its 16-element activation vectors.
template <class T>
constexpr int unit_elems() {
  return T::kElems / T::kUnits;
}
template <class T>
constexpr int unit_acts() {
  return unit_elems<T>() / 16;
}

// Eight elements of x (one quarter of a block of 32: thread t of four) into sq / sd.
__device__ __forceinline__ void quantise_eight(float4 v0, float4 v1, int t, int8_t* sq, float* sd) {
  const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  float amax = 0.0f;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    bad = bad || isnan(v[i]);
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  int any_bad = bad ? 1 : 0;
  any_bad |= __shfl_xor_sync(0xffffffffu, any_bad, 1);
  any_bad |= __shfl_xor_sync(0xffffffffu, any_bad, 2);
  const float scale = any_bad ? __int_as_float(0x7fc00000) : amax / 127.0f;
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i)
    packed[i / 4] |= (uint32_t(__float2int_rn(v[i] * inv)) & 0xff) << (8 * (i % 4));
  *reinterpret_cast<uint2*>(sq + 8 * t) = make_uint2(packed[0], packed[1]);
  if (t % 4 == 0) sd[t / 4] = scale;
}

// x [in] (in a multiple of 256, 16-byte aligned) into shared memory as int8 blocks of 32 with
// quantize_q8_kernel's arithmetic, by threads tid of n (a multiple of 32): four threads a block,
// eight elements each (in / 8 is a multiple of 32, so whole warps take part in each round of
// shuffles). Up to two rounds a thread load everything before quantising (one wait on L2, not
// one a round).
__device__ __forceinline__ void quantise_x_shared(const float* x, int in, int8_t* sq, float* sd,
                                                  int tid, int n) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int units = in / 8;
  if (units <= 2 * n) {
    float4 v[2][2] = {};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int t = tid + q * n;
      if (t < units) {
        v[q][0] = x4[2 * t];
        v[q][1] = x4[2 * t + 1];
      }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int t = tid + q * n;
      if (t < units) quantise_eight(v[q][0], v[q][1], t, sq, sd);
    }
    return;
  }
  for (int t = tid; t < units; t += n) quantise_eight(x4[2 * t], x4[2 * t + 1], t, sq, sd);
}

// A lane's units of x in registers: units u0 + 32 i (i < UPL) of every row, their int8 values
// (av), scales (xd) and scaled sums (xs = xd sum(q)); zero past the row's n_units.
template <class T, int UPL>
struct LaneActs {
  static constexpr int NA = unit_acts<T>();
  int4 av[UPL][NA];
  float xd[UPL][NA], xs[UPL][NA];

  __device__ __forceinline__ void load(const int8_t* aq, const float* ad, int u0, int j,
                                       int n_units) {
#pragma unroll
    for (int i = 0; i < UPL; ++i) {
      const int u = u0 + 32 * i;
#pragma unroll
      for (int k = 0; k < NA; ++k) {
        av[i][k] = make_int4(0, 0, 0, 0);
        xd[i][k] = xs[i][k] = 0.0f;
        if (u < n_units) {
          const int e = (u / T::kUnits) * T::kElems + T::act_offset(j, k);
          av[i][k] = *reinterpret_cast<const int4*>(aq + e);
          xd[i][k] = ad[e / qb::kActBlock];
          const int4 v = av[i][k];
          xs[i][k] =
              xd[i][k] * float(qb::sum4(v.w, qb::sum4(v.z, qb::sum4(v.y, qb::sum4(v.x, 0)))));
        }
      }
    }
  }
};

// kResCombine: where unit u0 + 32 i of a lane lies in any row, past the row's start: its pair's
// expert and its superblock within that expert's row (the same for every row the lane visits;
// 0 where the unit is past the row). The token's ids are in range (combine_ids_ok).
template <class T, int UPL>
__device__ __forceinline__ void combine_offsets(const ResidentArgs& a, const int32_t* ids, int u0,
                                                int n_units, int64_t (&off)[UPL]) {
  const int sb_per_pair = a.in / a.k / T::kElems;
#pragma unroll
  for (int i = 0; i < UPL; ++i) {
    const int u = u0 + 32 * i;
    off[i] = 0;
    if (u >= n_units) continue;
    const int b = u / T::kUnits;
    const int32_t e = ids[int64_t{blockIdx.y} * a.k + b / sb_per_pair];
    off[i] = e * a.expert_bytes[0] + int64_t{b % sb_per_pair} * T::kBytes;
  }
}

template <class T, int UPL, int MODE>
__device__ __forceinline__ bool resident_load(const ResidentArgs& a, const int32_t* ids, int64_t r,
                                              int u0, int j, int n_units,
                                              typename T::Unit (&w)[resident_mats<MODE>()][UPL],
                                              const int64_t (&unit_off)[UPL]) {
  constexpr int NM = resident_mats<MODE>();
  const uint8_t* ptr[NM];
  if (!resident_rows<MODE>(a, ids, r, ptr)) return false;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int i = 0; i < UPL; ++i) {
      const int u = u0 + 32 * i;
      if (u < n_units) {
        w[m][i] = MODE == kResCombine ? T::load(ptr[m] + unit_off[i], j)
                                      : T::load(ptr[m] + (u / T::kUnits) * T::kBytes, j);
      }
    }
  }
  return true;
}

// Where a body reads its activations, expert ids and routing weights: the launch's arguments
// (inputs_of), or shared memory (moe_fused.cu: computed in the same kernel).
struct ResInputs {
  const float* x;
  const int32_t* ids;
  const float* weights;
};
__device__ __forceinline__ ResInputs inputs_of(const ResidentArgs& a) {
  return {a.x, a.ids, a.weights};
}

// Where the body waits for the results of earlier work: the previous kernel (programmatic
// dependent launch), or a grid-wide barrier of the kernel it is part of (moe_fused.cu).
struct PdlWait {
  __device__ __forceinline__ void operator()() const { pdl_wait(); }
};

// The kernel's work as block bx of gx (a launch may hold two such grids: resident_two_kernel).
// The first rows' weights load before `wait` unless they depend on expert ids not yet known
// (kIdsReady: the ids are in place before the wait).
template <class T, int UPL, int MODE, bool kIdsReady = false, class Wait = PdlWait>
__device__ __forceinline__ void resident_body(const ResidentArgs& a, ResInputs in, int bx, int gx,
                                              uint8_t* res_smem, Wait wait = {}) {
  constexpr int NM = resident_mats<MODE>();
  constexpr int DEPTH = resident_depth<UPL, MODE>(), NB = DEPTH + 1;
  static_assert(T::kElems == 256 && (T::kUnits == 8 || T::kUnits == 4),
                "resident GEMV: 256-element blocks of 8 or 4 units");
  int8_t* sq = reinterpret_cast<int8_t*>(res_smem);       // [in] (unless pre-quantised)
  float* sd = reinterpret_cast<float*>(res_smem + a.in);  // [in / 32]
  float* part = a.xq ? reinterpret_cast<float*>(res_smem) : sd + a.in / qb::kActBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int S = a.slices, R = a.row_lanes;
  const int s = warp % S, rw = warp / S;
  const int n_units = a.in / unit_elems<T>();
  const int u0 = 32 * UPL * s + lane;  // this lane's units of every row: u0 + 32 i, i < UPL
  const int j = lane % T::kUnits;      // their place in their blocks
  const int64_t stride = int64_t{gx} * R;
  const int64_t r0 = int64_t{bx} * R + rw;

  pdl_launch_dependents();
  typename T::Unit w[NB][NM][UPL];
  bool ok[NB];
  int64_t unit_off[UPL] = {};  // kResCombine
  bool ids_ok = true;
  auto load_ahead = [&]() {
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) {
      const int64_t r = r0 + q * stride;
      ok[q] = ids_ok && r < a.total_rows &&
              resident_load<T, UPL, MODE>(a, in.ids, r, u0, j, n_units, w[q], unit_off);
    }
  };
  // Expert ids come from an earlier kernel (not necessarily finished before the previous one).
  constexpr bool kIds = MODE == kResExperts || MODE == kResPairs || MODE == kResCombine;
  constexpr bool kLoadEarly = !kIds || kIdsReady;
  // Every lane checks all of the token's ids: a row with any out of range is NaN as a whole.
  auto check_ids = [&]() {
    if constexpr (MODE == kResCombine) {
      ids_ok = combine_ids_ok(a, in.ids);
      if (ids_ok) combine_offsets<T, UPL>(a, in.ids, u0, n_units, unit_off);
    }
  };
  if constexpr (kLoadEarly) {
    check_ids();
    load_ahead();
  }
  wait();
  if constexpr (!kLoadEarly) {
    check_ids();
    load_ahead();
  }
  if (a.zero) {
    for (int64_t i = int64_t{bx} * blockDim.x + threadIdx.x; i < a.zero_n;
         i += int64_t{gx} * blockDim.x)
      a.zero[i] = 0.0f;
  }

  if (a.xq == nullptr) {
    const float* x =
        MODE == kResPairs || MODE == kResCombine ? in.x + int64_t{blockIdx.y} * a.in : in.x;
    // kResCombine: each pair's block scales times its routing weight (loaded with x).
    const int n_blocks = a.in / qb::kActBlock;
    float wt = 0.0f;
    if constexpr (MODE == kResCombine) {
      if (int(threadIdx.x) < n_blocks)
        wt = in.weights[int64_t{blockIdx.y} * a.k + threadIdx.x / (n_blocks / a.k)];
    }
    quantise_x_shared(x, a.in, sq, sd, threadIdx.x, blockDim.x);
    __syncthreads();
    if constexpr (MODE == kResCombine) {
      if (int(threadIdx.x) < n_blocks) sd[threadIdx.x] *= wt;
      for (int b = threadIdx.x + blockDim.x; b < n_blocks; b += blockDim.x)
        sd[b] *= in.weights[int64_t{blockIdx.y} * a.k + b / (n_blocks / a.k)];
      __syncthreads();
    }
  }
  LaneActs<T, UPL> act;
  act.load(a.xq ? a.xq : sq, a.xq ? a.xd : sd, u0, j, n_units);

  // Row t of this warp is r0 + t * stride, its weights in buffer t % NB; the loop is unrolled NB
  // times so every buffer index is a constant (registers, not local memory).
  const int part_stride = R * a.max_groups;
  for (int t0 = 0;; t0 += NB) {
#pragma unroll
    for (int q = 0; q < NB; ++q) {
      const int t = t0 + q;
      const int64_t r = r0 + t * stride;
      if (r >= a.total_rows) goto rows_done;  // uniform over the warp
      {
        const int ahead = (q + DEPTH) % NB;
        const int64_t rn = r + DEPTH * stride;
        ok[ahead] = ids_ok && rn < a.total_rows &&
                    resident_load<T, UPL, MODE>(a, in.ids, rn, u0, j, n_units, w[ahead], unit_off);
      }
      float acc[NM] = {};
      if (ok[q]) {
#pragma unroll
        for (int m = 0; m < NM; ++m) {
#pragma unroll
          for (int i = 0; i < UPL; ++i) {
            if (u0 + 32 * i < n_units)
              acc[m] += T::dot_regs(w[q][m][i], j, act.av[i], act.xd[i], act.xs[i]);
          }
        }
      }
      warp_sum<NM>(acc);
      if (lane == 0) {
        if (S == 1) {
          resident_store<MODE>(a, r, acc, ok[q]);
        } else {
#pragma unroll
          for (int m = 0; m < NM; ++m) part[(m * S + s) * part_stride + t * R + rw] = acc[m];
        }
      }
    }
  }
rows_done:
  if (S > 1) {
    __syncthreads();
    resident_store_partials<MODE>(a, in.ids, part, part_stride, threadIdx.x, blockDim.x, bx, gx);
  }
}

template <class T, int UPL, int MODE>
__global__ void __launch_bounds__(resident_max_threads<unit_elems<T>(), UPL>())
    resident_gemv_kernel(const __grid_constant__ ResidentArgs a) {
  extern __shared__ __align__(16) uint8_t res_smem[];
  resident_body<T, UPL, MODE>(a, inputs_of(a), blockIdx.x, gridDim.x, res_smem);
}

}  // namespace qwenrt::ops::cuda::mm
