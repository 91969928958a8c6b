// The resident GEMV's launches (matmul_args.cuh, "gemv_resident.cu"; the kernel body in
// gemv_resident.cuh): one activation row of fp32, the batch-1 decode path.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/gemv_resident.cuh"
#include "ops/cuda/gemv_resident_plan.cuh"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

// Two resident GEMVs in one launch of 8-warp blocks: blocks [0, blocks1) run the first over a1,
// the rest the second over a2 (a MoE row's routed experts and its shared expert: no second
// stream, no fork and join; resident_moe_row).
template <class T1, int U1, int M1, class T2, int U2, int M2>
__global__ void __launch_bounds__(kResRowWarps * 32)
    resident_two_kernel(const __grid_constant__ ResidentArgs a1,
                        const __grid_constant__ ResidentArgs a2, int blocks1) {
  extern __shared__ __align__(16) uint8_t res_smem[];
  if (int(blockIdx.x) < blocks1) {
    resident_body<T1, U1, M1>(a1, inputs_of(a1), blockIdx.x, blocks1, res_smem);
  } else {
    resident_body<T2, U2, M2>(a2, inputs_of(a2), blockIdx.x - blocks1, gridDim.x - blocks1,
                              res_smem);
  }
}

// ---- Streamed GEMV: the resident kernel's lanes, weights landed in shared memory ------------
// The resident kernel keeps its next rows' weights in registers, which bounds the bytes a warp
// has in flight (bench/results/h200-decode-gemv.md: the 4-bit GEMV streams at 40-58% of the
// bandwidth, bound by bytes in flight, not by instructions). Here one producer warp copies whole
// row groups (R rows of each matrix, contiguous in shared memory: matrix m's row i at (m R + i)
// row_bytes) into a ring of `stages` stages with bulk copies (bulk_copy.cuh), tens of kilobytes
// ahead of the S x R consumer warps, which read their units from shared memory. Everything else
// is the resident kernel's: the lanes' activations in registers, the row groups a block visits
// (group blockIdx.x + t gridDim.x), the slice partials summed in a fixed order, PDL (the
// producer starts copying before the previous kernel has finished, except for routed experts,
// whose ids it must read).
constexpr int kStreamMaxWarps = 16;   // consumer warps of a block (S x R), at most
constexpr int kStreamBarBytes = 256;  // the ring's barriers: 2 x 16 stages x 8 bytes
constexpr int kStreamMaxStages = 16;
constexpr int kStreamMinIn = 5120;  // shorter rows take the resident kernel

template <int MODE>
constexpr int stream_max_threads() {
  return 32 * ((MODE == kResSwiglu ? kResMaxSlices : kStreamMaxWarps) + 1);
}

template <class T, int UPL, int MODE>
__global__ void __launch_bounds__(stream_max_threads<MODE>())
    stream_gemv_kernel(const __grid_constant__ ResidentArgs a) {
  constexpr int NM = resident_mats<MODE>();
  extern __shared__ __align__(128) uint8_t st_smem[];
  const int S = a.slices, R = a.row_lanes, NS = a.stages, consumers = S * R;
  const int64_t rb = a.row_bytes[0], stage_bytes = a.stage_bytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(st_smem);
  uint64_t* empty = full + kStreamMaxStages;
  uint8_t* ring = st_smem + kStreamBarBytes;
  int8_t* sq = reinterpret_cast<int8_t*>(ring + NS * stage_bytes);  // [in] (unless pre-quantised)
  float* sd = reinterpret_cast<float*>(sq + a.in);                  // [in / 32]
  float* part = a.xq ? reinterpret_cast<float*>(sq) : sd + a.in / qb::kActBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n_groups = (a.total_rows + R - 1) / R;
  mbar_ring_init(full, empty, NS, consumers);
  pdl_launch_dependents();

  if (warp == consumers) {  // the producer
    if (lane != 0) return;
    if constexpr (MODE == kResExperts) pdl_wait();  // expert ids come from the previous kernel
    int t = 0;
    for (int64_t g = blockIdx.x; g < n_groups; g += gridDim.x, ++t) {
      const int slot = t % NS;
      if (t >= NS) mbar_wait(&empty[slot], ((t / NS) - 1) & 1);
      // The group's rows that exist (and, for experts, have a valid id), twice: the barrier
      // learns the bytes before the copies start.
      const uint8_t* src[NM];
      uint32_t bytes = 0;
      for (int i = 0; i < R; ++i) {
        const int64_t r = g * R + i;
        if (r < a.total_rows && resident_rows<MODE>(a, a.ids, r, src)) bytes += uint32_t(NM * rb);
      }
      mbar_arrive_expect_tx(&full[slot], bytes);
      uint8_t* dst = ring + slot * stage_bytes;
      for (int i = 0; i < R; ++i) {
        const int64_t r = g * R + i;
        if (!(r < a.total_rows && resident_rows<MODE>(a, a.ids, r, src))) continue;
#pragma unroll
        for (int m = 0; m < NM; ++m)
          bulk_copy_g2s(dst + (m * R + i) * rb, src[m], uint32_t(rb), &full[slot]);
      }
    }
    return;
  }

  const int s = warp % S, rw = warp / S;
  const int n_units = a.in / unit_elems<T>();
  const int u0 = 32 * UPL * s + lane;
  const int j = lane % T::kUnits;
  pdl_wait();
  if (a.xq == nullptr) {
    quantise_x_shared(a.x, a.in, sq, sd, threadIdx.x, 32 * consumers);
    asm volatile("bar.sync 1, %0;" ::"r"(32 * consumers) : "memory");
  }
  LaneActs<T, UPL> act;
  act.load(a.xq ? a.xq : sq, a.xq ? a.xd : sd, u0, j, n_units);

  const int part_stride = R * a.max_groups;
  int t = 0;
  for (int64_t g = blockIdx.x; g < n_groups; g += gridDim.x, ++t) {
    const int slot = t % NS;
    const int64_t r = g * R + rw;
    const uint8_t* unused[NM];
    const bool ok = r < a.total_rows && resident_rows<MODE>(a, a.ids, r, unused);
    float acc[NM] = {};
    mbar_wait(&full[slot], (t / NS) & 1);
    if (ok) {
      const uint8_t* rows = ring + slot * stage_bytes + rw * rb;
#pragma unroll
      for (int m = 0; m < NM; ++m) {
#pragma unroll
        for (int i = 0; i < UPL; ++i) {
          const int u = u0 + 32 * i;
          if (u < n_units) {
            const typename T::Unit w = T::load(rows + m * R * rb + (u / T::kUnits) * T::kBytes, j);
            acc[m] += T::dot_regs(w, j, act.av[i], act.xd[i], act.xs[i]);
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
    warp_sum<NM>(acc);
    if (lane == 0 && r < a.total_rows) {
      if (S == 1) {
        resident_store<MODE>(a, r, acc, ok);
      } else {
#pragma unroll
        for (int m = 0; m < NM; ++m) part[(m * S + s) * part_stride + t * R + rw] = acc[m];
      }
    }
  }
  if (S > 1) {
    asm volatile("bar.sync 1, %0;" ::"r"(32 * consumers) : "memory");
    resident_store_partials<MODE>(a, a.ids, part, part_stride, threadIdx.x, 32 * consumers,
                                  blockIdx.x, gridDim.x);
  }
}

// kernel<<<(grid, grid_y), threads, smem, stream>>>(a), with programmatic stream serialization
// where pdl_on(), whatever the grid (a persistent grid is what fits on the GPU at once).
template <class Kernel, class Args>
void launch_pdl(Kernel* kernel, int64_t grid, int threads, size_t smem, cudaStream_t stream,
                const Args& a, unsigned grid_y = 1) {
  launch_with_pdl(pdl_on(), kernel, dim3(static_cast<unsigned>(grid), grid_y),
                  dim3(static_cast<unsigned>(threads)), smem, stream, a);
}

template <class T, int UPL, int MODE>
void launch_resident(ResidentArgs a, cudaStream_t stream, unsigned pairs = 1) {
  constexpr int NM = resident_mats<MODE>();
  auto* kernel = resident_gemv_kernel<T, UPL, MODE>;
  const int S = a.slices, R = a.row_lanes, threads = 32 * S * R;
  const int64_t groups = (a.total_rows + R - 1) / R;
  const size_t base = a.xq ? 0 : size_t(a.in) + size_t(a.in / qb::kActBlock) * 4;
  const auto part_bytes = [&](int64_t max_groups) {
    return S > 1 ? size_t(NM) * S * R * size_t(max_groups) * 4 : 0;
  };
  // kResPairs: the blocks that fit are shared out over the pairs (grid.y).
  const int64_t grid = std::max<int64_t>(
      1, persistent_grid(kernel, threads, base + part_bytes(8), groups * pairs) / pairs);
  a.max_groups = static_cast<int>((groups + grid - 1) / grid);
  const size_t smem = base + part_bytes(a.max_groups);
  if (smem > 48 * 1024) {
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  }
  launch_pdl(kernel, grid, threads, smem, stream, a, pairs);
}

// The streamed kernel (QWENRT_CUDA_STREAM=0: never). QWENRT_CUDA_STREAM_WARPS sets the consumer
// warps a block aims for (R = max(1, warps / S); default 8, at most 16), QWENRT_CUDA_STREAM_KB
// the ring's size (default 32: 48, 64 and 96 KB measured slower, fewer blocks an SM; at most 16
// stages).
int stream_env(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  return std::clamp(std::atoi(v), lo, hi);
}
bool stream_on() {
  const char* v = std::getenv("QWENRT_CUDA_STREAM");  // read per call: tests switch it
  return !(v && v[0] == '0') && sm90_or_later();
}

// Launches the streamed kernel for a (slices set, row_lanes chosen here); false, having launched
// nothing, where its layout does not fit: rows or expert strides not a multiple of 16 bytes,
// unaligned weights, fewer than two stages in the ring, or more shared memory than a block has.
template <class T, int UPL, int MODE>
bool launch_stream(ResidentArgs a, cudaStream_t stream) {
  constexpr int NM = resident_mats<MODE>();
  // Measured (bench/results/h200-decode-stream.md): faster on rows of 5120 and more (the 27B's
  // projections and FFN), slower on the 35B-A3B's 2048-wide rows and routed experts.
  if (MODE == kResExperts || MODE == kResPairs || MODE == kResCombine || a.in < kStreamMinIn ||
      !stream_on())
    return false;
  static const int warps = stream_env("QWENRT_CUDA_STREAM_WARPS", 8, 1, kStreamMaxWarps);
  static const int ring_kb = stream_env("QWENRT_CUDA_STREAM_KB", 32, 8, 200);
  const int64_t rb = a.row_bytes[0];
  if (rb % 16 != 0) return false;
  for (int m = 0; m < (MODE == kResJobs ? a.n_jobs : NM); ++m) {
    if (a.row_bytes[m] != rb || !aligned(a.data[m], 16)) return false;
  }
  if (MODE == kResExperts && (a.expert_bytes[0] % 16 != 0 || a.expert_bytes[1] % 16 != 0))
    return false;
  const int S = a.slices;
  const int R =
      std::max(1, std::min(warps / S, MODE == kResSwiglu ? kResMaxSlices : kStreamMaxWarps / S));
  if (S * R > (MODE == kResSwiglu ? kResMaxSlices : kStreamMaxWarps)) return false;
  a.row_lanes = R;
  a.stage_bytes = (NM * R * rb + 127) / 128 * 128;
  a.stages = static_cast<int>(
      std::min<int64_t>(kStreamMaxStages, int64_t{ring_kb} * 1024 / a.stage_bytes));
  if (a.stages < 2) return false;
  auto* kernel = stream_gemv_kernel<T, UPL, MODE>;
  const int threads = 32 * (S * R + 1);
  const int64_t groups = (a.total_rows + R - 1) / R;
  const size_t base = kStreamBarBytes + size_t(a.stages) * size_t(a.stage_bytes) +
                      (a.xq ? 0 : size_t(a.in) + size_t(a.in / qb::kActBlock) * 4);
  const auto part_bytes = [&](int64_t max_groups) {
    return S > 1 ? size_t(NM) * S * R * size_t(max_groups) * 4 : 0;
  };
  static const size_t kMaxSmem = max_dynamic_smem(kernel);
  if (base + part_bytes(8) > kMaxSmem) return false;
  QWENRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kMaxSmem)));
  const int64_t grid = persistent_grid(kernel, threads, base + part_bytes(8), groups);
  a.max_groups = static_cast<int>((groups + grid - 1) / grid);
  const size_t smem = base + part_bytes(a.max_groups);
  if (smem > kMaxSmem) return false;
  launch_pdl(kernel, grid, threads, smem, stream, a);
  return true;
}

// The streamed kernel where it fits, else the resident one.
template <class T, int UPL, int MODE>
void launch_gemv(const ResidentArgs& a, cudaStream_t stream, unsigned pairs) {
  if (!launch_stream<T, UPL, MODE>(a, stream)) launch_resident<T, UPL, MODE>(a, stream, pairs);
}

// The resident kernel for `m`'s type with a's in and mode; false (nothing launched) where it has
// none: other types, rows it cannot slice, unaligned x, or QWENRT_CUDA_RESIDENT=0.
template <int MODE>
bool resident(const MatArg& m, ResidentArgs a, void* workspace, cudaStream_t stream,
              unsigned pairs = 1) {
  if (resident_off() || a.in % 256 != 0 || !aligned(a.x, 16)) return false;
  // Each pair's row quantised in the kernel (never by the separate launch, which does one row).
  if (MODE == kResPairs && a.in > kResQuantiseInKernelMax) return false;
  const ResidentPlan plan = resident_plan<MODE>(m, a);
  if (plan.kind == kResNone) return false;
  const ResidentShape shape = plan.shape;
  a.slices = shape.slices;
  a.row_lanes = std::max(1, kResRowWarps / shape.slices);
  if (a.in > kResQuantiseInKernelMax && workspace != nullptr) {
    const Acts q = prepare_acts(a.x, 1, a.in, true, workspace, stream);
    a.xq = q.q;
    a.xd = q.d;
  }
  auto by_upl = [&]<class T>() {
    if constexpr (MODE == kResSwiglu) {
      launch_gemv<T, 1, MODE>(a, stream, pairs);
    } else if constexpr (unit_elems<T>() == 64) {
      if (shape.upl == 1) {
        launch_gemv<T, 1, MODE>(a, stream, pairs);
      } else {
        launch_gemv<T, 2, MODE>(a, stream, pairs);
      }
    } else {
      switch (shape.upl) {
        case 1:
          launch_gemv<T, 1, MODE>(a, stream, pairs);
          break;
        case 2:
          launch_gemv<T, 2, MODE>(a, stream, pairs);
          break;
        case 3:
          launch_gemv<T, 3, MODE>(a, stream, pairs);
          break;
        default:
          launch_gemv<T, 4, MODE>(a, stream, pairs);
          break;
      }
    }
  };
  switch (plan.kind) {
    case kResQ4K64:
      by_upl.template operator()<qb::Q4K64>();
      break;
    case kResQ4K:
      by_upl.template operator()<qb::Q4K>();
      break;
    case kResQ5K:
      by_upl.template operator()<qb::Q5K>();
      break;
    case kResIQ4XS:
      by_upl.template operator()<qb::IQ4XS>();
      break;
    default:
      by_upl.template operator()<qb::Q80S>();
      break;
  }
  return true;
}

// Shares the blocks that fit between the parts by their weight bytes (at least one each, at most
// a part's row groups) and launches.
template <class T1, int U1, int M1, class T2, int U2, int M2>
void launch_two(ResidentArgs a1, ResidentArgs a2, cudaStream_t stream) {
  auto* kernel = resident_two_kernel<T1, U1, M1, T2, U2, M2>;
  const TwoPart<T1, M1> p1{a1};
  const TwoPart<T2, M2> p2{a2};
  static const size_t kMaxSmem = max_dynamic_smem(kernel);
  QWENRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kMaxSmem)));
  const int64_t total = persistent_grid(kernel, kResRowWarps * 32, std::max(p1.smem(8), p2.smem(8)),
                                        p1.groups() + p2.groups());
  const TwoSplit sp = split_two<T1, M1, T2, M2>(a1, a2, total);
  if (sp.smem > kMaxSmem)
    cuda_fail("resident_moe_row: " + std::to_string(sp.smem) + " bytes of shared memory");
  launch_with_pdl(pdl_on(), kernel, dim3(static_cast<unsigned>(sp.b1 + sp.b2)),
                  dim3(kResRowWarps * 32), sp.smem, stream, a1, a2, static_cast<int>(sp.b1));
}

// Launches the pair's kernel if the plans are (T1, U1) and (T2, U2) (only checks where launch is
// false); whether they were.
template <class T1, int U1, int M1, class T2, int U2, int M2>
bool two_if(const ResidentPlan& p1, const ResidentPlan& p2, const ResidentArgs& a1,
            const ResidentArgs& a2, bool launch, cudaStream_t stream) {
  if (!plan_is<T1, U1>(p1) || !plan_is<T2, U2>(p2)) return false;
  if (launch) launch_two<T1, U1, M1, T2, U2, M2>(a1, a2, stream);
  return true;
}

}  // namespace

bool resident_group(const Group& g, const float* x, int64_t in, void* workspace,
                    cudaStream_t stream) {
  ResidentArgs a{};
  a.n_jobs = g.n_jobs;
  int64_t rows = 0;
  for (int i = 0; i < g.n_jobs; ++i) {
    const MatArg& m = g.job[i].m;
    if (m.dtype != g.job[0].m.dtype || m.q8s != g.job[0].m.q8s) return false;
    a.data[i] = m.data;
    a.row_bytes[i] = m.row_bytes;
    a.y[i] = g.job[i].y;
    a.first_row[i] = rows;
    rows += m.out;
  }
  a.first_row[g.n_jobs] = rows;
  a.total_rows = rows;
  a.x = x;
  a.in = static_cast<int>(in);
  return in <= (1 << 20) && resident<kResJobs>(g.job[0].m, a, workspace, stream);
}

bool resident_swiglu(const MatArg& g, const MatArg& u, const float* x, int64_t in, float* y,
                     void* workspace, cudaStream_t stream) {
  if (g.dtype != u.dtype || g.q8s != u.q8s || in > (1 << 20)) return false;
  ResidentArgs a = gate_up_args(g, u, x, in, y);
  a.total_rows = g.out;
  return resident<kResSwiglu>(g, a, workspace, stream);
}

bool resident_experts_swiglu(const MatArg& g, const MatArg& u, const int32_t* ids, int k,
                             const float* x, int64_t in, float* y, void* workspace,
                             cudaStream_t stream) {
  if (g.dtype != u.dtype || g.q8s != u.q8s || in > (1 << 20)) return false;
  ResidentArgs a = gate_up_args(g, u, x, in, y);
  a.expert_bytes[0] = g.expert_bytes;
  a.expert_bytes[1] = u.expert_bytes;
  a.ff = g.out;
  a.total_rows = int64_t{k} * g.out;
  a.ids = ids;
  a.n_expert = g.n_expert;
  return resident<kResExperts>(g, a, workspace, stream);
}

bool resident_experts_down_pairs(const MatArg& d, const int32_t* ids, const float* x, int64_t in,
                                 int64_t n_pairs, float* y, cudaStream_t stream) {
  if (in > (1 << 20) || n_pairs < 1 || n_pairs > 65535) return false;
  return resident<kResPairs>(d, down_args(d, ids, x, in, y), nullptr, stream,
                             static_cast<unsigned>(n_pairs));
}

bool resident_experts_down_combine(const MatArg& d, const int32_t* ids, const float* weights, int k,
                                   const float* x, int64_t ff, const float* shared,
                                   const float* shared_scale, float* y, int64_t n,
                                   cudaStream_t stream) {
  // Each pair's row whole superblocks; the token's k rows quantised in the kernel.
  if (ff % 256 != 0 || k < 1 || k * ff > kResQuantiseInKernelMax || n < 1 || n > 65535)
    return false;
  ResidentArgs a = down_args(d, ids, x, k * ff, y);
  a.k = k;
  a.weights = weights;
  a.shared = shared;
  a.shared_scale = shared_scale;
  return resident<kResCombine>(d, a, nullptr, stream, static_cast<unsigned>(n));
}

bool resident_moe_row(const MoeRowArgs& m, bool launch, cudaStream_t stream) {
  MoeRowParts p;
  if (!moe_row_parts(m, p)) return false;
  // Only the pairing measured faster than the two streams: the official Q4_K_M table's routed
  // Q4_K with a Q8_0 shared expert (35B-A3B +2.6-3.3% on an H100). Q8_0 throughout measured
  // slower (35B-A3B Q8_0: 340 / 347 against 394 / 392 tok/s), so it keeps the two streams, as
  // every other pairing does.
  const auto first = [&](bool go) {
    return two_if<qb::Q4K64, 1, kResExperts, qb::Q80S, 1, kResSwiglu>(p.p_gu, p.p_sgu, p.gu, p.sgu,
                                                                      go, stream);
  };
  const auto second = [&](bool go) {
    return two_if<qb::Q4K64, 2, kResCombine, qb::Q80S, 1, kResJobs>(p.p_down, p.p_sdown, p.down,
                                                                    p.sdown, go, stream);
  };
  if (!first(false) || !second(false)) return false;
  if (launch) {
    first(true);
    second(true);
  }
  return true;
}

}  // namespace qwenrt::ops::cuda::mm
