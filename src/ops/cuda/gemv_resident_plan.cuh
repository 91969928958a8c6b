// The host-side plan of the resident GEMV's launches (its kernel body: gemv_resident.cuh): which
// unit type and shape read a matrix, the persistent grid, two GEMVs sharing one launch, and a
// decode row's MoE FFN as four resident GEMVs. Shared by gemv_resident.cu and moe_fused.cu.
// Internal to ops/cuda.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "ops/cuda/check.h"
#include "ops/cuda/gemv_resident.cuh"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {

inline bool resident_off() {
  static const bool off = [] {
    const char* v = std::getenv("QWENRT_CUDA_RESIDENT");
    return v && v[0] == '0';
  }();
  return off;
}

// QWENRT_CUDA_RES_PER_SM=N (N > 0): at most N persistent blocks an SM, leaving room on each SM
// for the next kernel's blocks to start early under PDL (an experiment; 0 or unset: no cap).
inline int resident_per_sm_cap() {
  static const int cap = [] {
    const char* v = std::getenv("QWENRT_CUDA_RES_PER_SM");
    return v ? std::max(0, std::atoi(v)) : 0;
  }();
  return cap;
}

// Persistent blocks: as many as fit on the GPU at once with `smem` bytes each (at most `groups`).
template <class Kernel>
int64_t persistent_grid(Kernel* kernel, int threads, size_t smem, int64_t groups) {
  int per_sm = 0;
  QWENRT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  if (resident_per_sm_cap() > 0) per_sm = std::min(per_sm, resident_per_sm_cap());
  return std::max<int64_t>(1, std::min<int64_t>(groups, int64_t{std::max(per_sm, 1)} * sm_count()));
}

// Rows longer than this take their activations quantised by quantize_q8_kernel (one launch)
// instead of every block quantising the whole row itself (a 17408-wide row is 70 KB of floats a
// block reads from L2 before its weights can be used).
inline constexpr int kResQuantiseInKernelMax = 8192;

// The resident kernel for `m`'s type with a's in and mode; false (nothing launched) where it has
// none: other types, rows over 18432 wide, unaligned x, or QWENRT_CUDA_RESIDENT=0.
// Units a lane, chosen by measurement (bench/results/h200.md, cuda_gemv_bench on the H200):
// single matrices and routed experts stream best with up to 4 units a lane over 1, 2, 4 or 8
// slices (fewer rows per byte: the per-row work of finding, summing and storing a row is paid
// less often), the dense SwiGLU with one unit a lane over in / 1024 slices and two rows ahead
// (two matrices' units at 3 a lane need ~170 registers: one block an SM).
struct ResidentShape {
  int slices, upl;
};
// Units of 64 elements (Q4K64) hold twice the registers of 32-element ones: at most 2 a lane.
// (Q8_0 superblocks in 64-element units measured slower, 56.6% of the bandwidth against 80.1% on
// 5120 x 17408, and were dropped: bench/results/h200-decode-gemv.md.)
template <int MODE>
ResidentShape resident_shape(int n_units, int max_upl) {
  if constexpr (MODE == kResSwiglu) {
    return {(n_units + 31) / 32, 1};
  } else {
    int S = 1;
    while (S < kResRowWarps && S * 32 * max_upl < n_units) S *= 2;
    return {S, (n_units + 32 * S - 1) / (32 * S)};
  }
}

// Q4_K in 64-element units (Q4K64: one scale decode per 64 weights, branch-free) unless
// QWENRT_CUDA_Q4K64=0 (the 32-element units); QWENRT_CUDA_Q4K64=1 keeps single matrices with
// rows over kResQuantiseInKernelMax on the staged kernel, as the 32-element units do.
inline int q4k64_mode() {
  static const int mode = [] {
    const char* v = std::getenv("QWENRT_CUDA_Q4K64");
    return v && (v[0] == '0' || v[0] == '1') ? v[0] - '0' : 2;
  }();
  return mode;
}

// The unit type and shape the resident kernel reads `m` with in mode MODE over rows of a.in
// (kind kResNone: it has none for that type or measured slower there).
enum ResKind { kResNone, kResQ4K, kResQ4K64, kResQ5K, kResIQ4XS, kResQ80S };
struct ResidentPlan {
  ResKind kind = kResNone;
  ResidentShape shape{};
};
template <class T>
constexpr ResKind kind_of() {
  if constexpr (std::is_same_v<T, qb::Q4K>) return kResQ4K;
  if constexpr (std::is_same_v<T, qb::Q4K64>) return kResQ4K64;
  if constexpr (std::is_same_v<T, qb::Q5K>) return kResQ5K;
  if constexpr (std::is_same_v<T, qb::IQ4XS>) return kResIQ4XS;
  return kResQ80S;
}

template <int MODE>
ResidentPlan resident_plan(const MatArg& m, const ResidentArgs& a) {
  // Q4_K rows of at least 2048 take 64-element units (shorter ones would leave lanes idle).
  const bool q4k64 = m.dtype == DType::Q4_K && q4k64_mode() != 0 && a.in >= 2048;
  const ResidentShape shape =
      q4k64 ? resident_shape<MODE>(a.in / 64, 2) : resident_shape<MODE>(a.in / 32, 4);
  if (shape.slices > (q4k64 ? kResMaxSlices / 2 : kResMaxSlices) || shape.upl > 4) return {};
  switch (m.dtype) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::IQ4_XS:
      // A single 4-bit matrix with rows this long streams faster through the staged kernel
      // (Q4_K 17408 x 5120: 29.6 us against 35.4 us here, quantisation launch included), except
      // in 64-element units (measured in bench/results/h200.md).
      if (MODE == kResJobs && a.in > kResQuantiseInKernelMax && !(q4k64 && q4k64_mode() == 2))
        return {};
      break;
    case DType::Q8_0:
      if (!m.q8s) return {};
      // An lm-head-sized Q8_0 matrix streams faster through the staged kernel (94% of the
      // bandwidth against 85% here, 2048 x 248320).
      if (MODE == kResJobs && a.total_rows >= 131072) return {};
      break;
    default:
      return {};
  }
  const ResKind kind = m.dtype == DType::Q4_K     ? (q4k64 ? kResQ4K64 : kResQ4K)
                       : m.dtype == DType::Q5_K   ? kResQ5K
                       : m.dtype == DType::IQ4_XS ? kResIQ4XS
                                                  : kResQ80S;
  return {kind, shape};
}

// ---- Two GEMVs in one launch (resident_two_kernel) ---------------------------------------------
// One part's layout: a.slices and a.row_lanes set (S x R = 8 warps), x quantised in the kernel.
template <class T, int MODE>
struct TwoPart {
  static constexpr int NM = resident_mats<MODE>();
  const ResidentArgs& a;
  int64_t groups() const { return (a.total_rows + a.row_lanes - 1) / a.row_lanes; }
  size_t smem(int64_t max_groups) const {
    const size_t base = size_t(a.in) + size_t(a.in / qb::kActBlock) * 4;
    return base + (a.slices > 1 ? size_t(NM) * a.slices * a.row_lanes * max_groups * 4 : 0);
  }
  double bytes() const { return double(a.total_rows) * NM * (a.in / T::kElems) * T::kBytes; }
};

// Blocks [0, b1) of a launch of `total` run part 1, the next b2 part 2: shared by their weight
// bytes (at least one each, at most a part's row groups; with `fill`, part 2 takes every block
// left, b1 + b2 = total); each part's row groups a block (max_groups) set, and the shared memory
// a block needs for either.
struct TwoSplit {
  int64_t b1 = 0, b2 = 0;
  size_t smem = 0;
};
template <class T1, int M1, class T2, int M2>
TwoSplit split_two(ResidentArgs& a1, ResidentArgs& a2, int64_t total, bool fill = false) {
  const TwoPart<T1, M1> p1{a1};
  const TwoPart<T2, M2> p2{a2};
  TwoSplit s;
  s.b1 = std::clamp<int64_t>(std::llround(double(total) * p1.bytes() / (p1.bytes() + p2.bytes())),
                             1, fill ? std::min(p1.groups(), total - 1) : p1.groups());
  s.b2 = fill ? total - s.b1 : std::clamp<int64_t>(total - s.b1, 1, p2.groups());
  a1.max_groups = static_cast<int>((p1.groups() + s.b1 - 1) / s.b1);
  a2.max_groups = static_cast<int>((p2.groups() + s.b2 - 1) / s.b2);
  s.smem = std::max(p1.smem(a1.max_groups), p2.smem(a2.max_groups));
  return s;
}

// The arguments of the two-matrix modes: gate and up rows side by side, y the SwiGLU output.
inline ResidentArgs gate_up_args(const MatArg& g, const MatArg& u, const float* x, int64_t in,
                                 float* y) {
  ResidentArgs a{};
  a.data[0] = g.data;
  a.data[1] = u.data;
  a.row_bytes[0] = g.row_bytes;
  a.row_bytes[1] = u.row_bytes;
  a.y[0] = y;
  a.x = x;
  a.in = static_cast<int>(in);
  return a;
}

// The arguments of the routed down modes: rows of expert ids[.]'s down against rows of x of `in`.
inline ResidentArgs down_args(const MatArg& d, const int32_t* ids, const float* x, int64_t in,
                              float* y) {
  ResidentArgs a{};
  a.data[0] = d.data;
  a.row_bytes[0] = d.row_bytes;
  a.expert_bytes[0] = d.expert_bytes;
  a.y[0] = y;
  a.x = x;
  a.in = static_cast<int>(in);
  a.total_rows = d.out;
  a.ids = ids;
  a.n_expert = d.n_expert;
  return a;
}

// ---- A decode row's MoE FFN as four resident GEMVs ---------------------------------------------
// The routed experts' gate / up (kResExperts; the first zeroes out) beside the shared expert's
// (kResSwiglu), then the routed down summed over the pairs (kResCombine) beside the shared down
// times its gate (kResJobs), both adding into out. Two launches (resident_moe_row) or one with the
// routing in front (moe_fused.cu).
struct MoeRowParts {
  ResidentArgs gu, sgu, down, sdown;  // slices and row_lanes set: S x R = kResRowWarps
  ResidentPlan p_gu, p_sgu, p_down, p_sdown;
};

// Whether plan p reads with unit type T, U units a lane.
template <class T, int U>
bool plan_is(const ResidentPlan& p) {
  return p.kind == kind_of<T>() && p.shape.upl == U;
}

// The parts of m in blocks of kResRowWarps warps; false where the resident kernel cannot take one
// of them (types, shapes, alignment, QWENRT_CUDA_RESIDENT=0).
inline bool moe_row_parts(const MoeRowArgs& m, MoeRowParts& parts) {
  const int k = m.k;
  if (resident_off() || k < 1 || m.dim % 256 != 0 || m.dim > kResQuantiseInKernelMax ||
      m.ff % 256 != 0 || k * m.ff > kResQuantiseInKernelMax || m.shared_ff % 256 != 0 ||
      m.shared_ff > kResQuantiseInKernelMax || m.down.out != m.dim || m.shared_down.out != m.dim ||
      !aligned(m.h, 16) || !aligned(m.mid, 16) || !aligned(m.shared_mid, 16) ||
      m.gate.dtype != m.up.dtype || m.gate.q8s != m.up.q8s ||
      m.shared_gate.dtype != m.shared_up.dtype || m.shared_gate.q8s != m.shared_up.q8s)
    return false;
  ResidentArgs& gu = parts.gu;
  gu = gate_up_args(m.gate, m.up, m.h, m.dim, m.mid);
  gu.expert_bytes[0] = m.gate.expert_bytes;
  gu.expert_bytes[1] = m.up.expert_bytes;
  gu.ff = m.ff;
  gu.total_rows = int64_t{k} * m.ff;
  gu.ids = m.ids;
  gu.n_expert = m.gate.n_expert;
  gu.zero = m.out;
  gu.zero_n = m.dim;
  ResidentArgs& sgu = parts.sgu;
  sgu = gate_up_args(m.shared_gate, m.shared_up, m.h, m.dim, m.shared_mid);
  sgu.total_rows = m.shared_ff;
  ResidentArgs& down = parts.down;
  down = down_args(m.down, m.ids, m.mid, int64_t{k} * m.ff, m.out);
  down.k = k;
  down.weights = m.weights;
  down.add_out = true;
  ResidentArgs& sdown = parts.sdown;
  sdown = {};
  sdown.n_jobs = 1;
  sdown.data[0] = m.shared_down.data;
  sdown.row_bytes[0] = m.shared_down.row_bytes;
  sdown.y[0] = m.out;
  sdown.first_row[1] = sdown.total_rows = m.dim;
  sdown.x = m.shared_mid;
  sdown.in = static_cast<int>(m.shared_ff);
  sdown.add_out = true;
  sdown.out_scale = m.shared_scale;
  parts.p_gu = resident_plan<kResExperts>(m.gate, gu);
  parts.p_sgu = resident_plan<kResSwiglu>(m.shared_gate, sgu);
  parts.p_down = resident_plan<kResCombine>(m.down, down);
  parts.p_sdown = resident_plan<kResJobs>(m.shared_down, sdown);
  for (const auto& [plan, a] : {std::pair{parts.p_gu, &gu}, std::pair{parts.p_sgu, &sgu},
                                std::pair{parts.p_down, &down}, std::pair{parts.p_sdown, &sdown}}) {
    if (plan.kind == kResNone || kResRowWarps % plan.shape.slices != 0) return false;
    a->slices = plan.shape.slices;
    a->row_lanes = kResRowWarps / plan.shape.slices;
  }
  return true;
}

}  // namespace qwenrt::ops::cuda::mm
