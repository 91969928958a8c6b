// The staged GEMV (matmul_args.cuh, "gemv_staged.cu"): quantised weights, n <= 8 activation rows
// already quantised to int8.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "ops/cuda/check.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

// ---- Staged GEMV: the decode path (n <= 8) for quantised weights --------------------------------
// One warp per output row. The row is read in tiles of 64 units (kStageUnits / T::kUnits blocks)
// copied to shared memory with coalesced cp.async loads of 16, 8 or 4 bytes (GGUF blocks of 34 or
// 210 bytes are only 2-byte aligned: read in place, every lane's loads would touch a different
// sector), double-buffered so the next tile is in flight while this one is computed; each lane
// then computes two units of the tile from shared memory with the type's dot product. Weights are
// read once for all NR activation rows. The warp sums in a fixed order (deterministic).
constexpr int kStageUnits = 64;
constexpr int kStageWarps = 8;

template <class T>
constexpr int stage_blocks() {
  return kStageUnits / T::kUnits;
}
// Bytes of one tile buffer (a multiple of 16, so every warp's pair of buffers stays aligned).
template <class T>
constexpr int stage_tile() {
  return (stage_blocks<T>() * T::kBytes + 15) / 16 * 16;
}

// Copies `bytes` (even) from global src to shared dst: VEC-byte cp.async chunks by the warp, the
// tail of bytes % VEC as 2-byte stores by lane 0.
template <int VEC>
__device__ __forceinline__ void stage_copy(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
  const int n_vec = bytes / VEC;
  for (int i = lane; i < n_vec; i += 32) {
    const unsigned saddr = static_cast<unsigned>(__cvta_generic_to_shared(dst + i * VEC));
    if constexpr (VEC == 16) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(src + i * VEC));
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(saddr), "l"(src + i * VEC),
                   "n"(VEC));
    }
  }
  if (lane == 0) {
    for (int b = n_vec * VEC; b < bytes; b += 2)
      *reinterpret_cast<uint16_t*>(dst + b) = *reinterpret_cast<const uint16_t*>(src + b);
  }
}
__device__ __forceinline__ void stage_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void stage_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// acc[r] += row . activation row r (rows x_stride activations apart), the whole row, by one warp.
// buf: this warp's two tiles of shared memory.
template <class T, int NR, int VEC>
__device__ __forceinline__ void staged_row(const uint8_t* row, const Acts& a, int64_t x_stride,
                                           uint8_t (*buf)[stage_tile<T>()], int lane,
                                           float (&acc)[NR]) {
  constexpr int kTb = stage_blocks<T>();
  const int n_blocks = static_cast<int>(a.in / T::kElems);
  const int n_tiles = (n_blocks + kTb - 1) / kTb;
  auto tile_bytes = [&](int t) { return min(kTb, n_blocks - t * kTb) * T::kBytes; };
  stage_copy<VEC>(buf[0], row, tile_bytes(0), lane);
  stage_commit();
  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      stage_copy<VEC>(buf[(t + 1) & 1], row + int64_t{t + 1} * kTb * T::kBytes, tile_bytes(t + 1),
                      lane);
      stage_commit();
      stage_wait<1>();
    } else {
      stage_wait<0>();
    }
    __syncwarp();
    const uint8_t* tile = buf[t & 1];
    const int units = min(kTb, n_blocks - t * kTb) * T::kUnits;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int u = lane + 32 * h;
      if (u < units) {
        const int b = u / T::kUnits, j = u % T::kUnits;
        const typename T::Unit w = T::load(tile + b * T::kBytes, j);
        const int64_t e = int64_t{t * kTb + b} * T::kElems;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const int64_t er = r * x_stride + e;
          acc[r] += T::dot(w, j, a.q + er, a.d + er / qb::kActBlock);
        }
      }
    }
    __syncwarp();  // the tile is refilled two iterations on
  }
}

// matmul / matmul_group: warp w of the grid owns global row w; the job whose rows hold it.
template <class T, int NR, int VEC>
__global__ void __launch_bounds__(kStageWarps * 32)
    staged_gemv_kernel(const __grid_constant__ Group g, int64_t total_rows, Acts a) {
  pdl_launch_dependents();
  __shared__ __align__(16) uint8_t buf[kStageWarps][2][stage_tile<T>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kStageWarps + warp;
  if (grow >= total_rows) return;  // whole warps only: no block-level barrier below
  int j = 0;
  while (j + 1 < g.n_jobs && grow >= g.job[j + 1].first_block) ++j;  // first_block: first row
  const Job& job = g.job[j];
  const int64_t row = grow - job.first_block;
  float acc[NR] = {};
  staged_row<T, NR, VEC>(job.m.data + row * job.m.row_bytes, a, a.in, buf[warp], lane, acc);
  warp_sum<NR>(acc);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < NR; ++r) job.y[r * job.y_stride + row] = acc[r];
  }
}

// y [NR, ff] = silu(x gate^T) * (x up^T).
template <class T, int NR, int VEC>
__global__ void __launch_bounds__(kStageWarps * 32)
    staged_swiglu_kernel(MatArg gate, MatArg up, float* __restrict__ y, Acts a) {
  pdl_launch_dependents();
  __shared__ __align__(16) uint8_t buf[kStageWarps][2][stage_tile<T>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * kStageWarps + warp;
  if (row >= gate.out) return;
  float g[NR] = {}, u[NR] = {};
  staged_row<T, NR, VEC>(gate.data + row * gate.row_bytes, a, a.in, buf[warp], lane, g);
  staged_row<T, NR, VEC>(up.data + row * up.row_bytes, a, a.in, buf[warp], lane, u);
  warp_sum<NR>(g);
  warp_sum<NR>(u);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < NR; ++r) y[r * gate.out + row] = silu(g[r]) * u[r];
  }
}

// Routed experts' gate/up: global row = pair * ff + row, pair p = (token p / k, choice p % k).
template <class T, int VEC>
__global__ void __launch_bounds__(kStageWarps * 32)
    staged_experts_swiglu_kernel(MatArg gate, MatArg up, const int32_t* __restrict__ ids, int k,
                                 float* __restrict__ y, int64_t n_pairs, Acts a) {
  pdl_launch_dependents();
  __shared__ __align__(16) uint8_t buf[kStageWarps][2][stage_tile<T>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ff = gate.out;
  const int64_t grow = int64_t{blockIdx.x} * kStageWarps + warp;
  if (grow >= n_pairs * ff) return;
  const int64_t p = grow / ff, row = grow % ff;
  const int32_t e = ids[p];
  if (e < 0 || e >= gate.n_expert) {
    if (lane == 0) y[p * ff + row] = __int_as_float(0x7fc00000);
    return;
  }
  const Acts ac = shift_rows(a, p / k);
  float g[1] = {}, u[1] = {};
  staged_row<T, 1, VEC>(gate.data + e * gate.expert_bytes + row * gate.row_bytes, ac, a.in,
                        buf[warp], lane, g);
  staged_row<T, 1, VEC>(up.data + e * up.expert_bytes + row * up.row_bytes, ac, a.in, buf[warp],
                        lane, u);
  warp_sum<1>(g);
  warp_sum<1>(u);
  if (lane == 0) y[p * ff + row] = silu(g[0]) * u[0];
}

// Routed experts' down with the weighted sum over the k choices: global row = token * out + row.
template <class T, int VEC>
__global__ void __launch_bounds__(kStageWarps * 32)
    staged_experts_down_kernel(MatArg down, const int32_t* __restrict__ ids,
                               const float* __restrict__ weights, int k, float* __restrict__ y,
                               int64_t n, Acts a) {
  pdl_launch_dependents();
  __shared__ __align__(16) uint8_t buf[kStageWarps][2][stage_tile<T>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kStageWarps + warp;
  if (grow >= n * down.out) return;
  const int64_t t = grow / down.out, row = grow % down.out;
  float acc = 0.0f;
  bool ok = true;
  for (int j = 0; j < k; ++j) {
    const int64_t p = t * k + j;
    const int32_t e = ids[p];
    if (e < 0 || e >= down.n_expert) {
      ok = false;
      continue;
    }
    float part[1] = {};
    staged_row<T, 1, VEC>(down.data + e * down.expert_bytes + row * down.row_bytes,
                          shift_rows(a, p), a.in, buf[warp], lane, part);
    warp_sum<1>(part);
    acc += weights[p] * part[0];
  }
  if (lane == 0) y[t * down.out + row] = ok ? acc : __int_as_float(0x7fc00000);
}

// Routed experts' down without the sum: y_pairs [n * k, out], global row = pair * out + row, so
// the k experts of a token are read by different warps at once (a warp looping over them waits
// one round trip per expert); moe_combine_pairs adds them up.
template <class T, int VEC>
__global__ void __launch_bounds__(kStageWarps * 32)
    staged_experts_down_pairs_kernel(MatArg down, const int32_t* __restrict__ ids,
                                     float* __restrict__ y, int64_t n_pairs, Acts a) {
  pdl_launch_dependents();
  __shared__ __align__(16) uint8_t buf[kStageWarps][2][stage_tile<T>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t{blockIdx.x} * kStageWarps + warp;
  if (grow >= n_pairs * down.out) return;
  const int64_t p = grow / down.out, row = grow % down.out;
  const int32_t e = ids[p];
  if (e < 0 || e >= down.n_expert) {
    if (lane == 0) y[p * down.out + row] = __int_as_float(0x7fc00000);
    return;
  }
  float acc[1] = {};
  staged_row<T, 1, VEC>(down.data + e * down.expert_bytes + row * down.row_bytes, shift_rows(a, p),
                        a.in, buf[warp], lane, acc);
  warp_sum<1>(acc);
  if (lane == 0) y[p * down.out + row] = acc[0];
}

// The widest copy every tile start allows: the data, every row, every expert and every full tile
// start at multiples of it.
template <class T>
int stage_vec(const MatArg& m) {
  const auto base = reinterpret_cast<uintptr_t>(m.data);
  for (int v : {16, 8, 4}) {
    if (base % v == 0 && m.row_bytes % v == 0 && (m.n_expert <= 1 || m.expert_bytes % v == 0) &&
        (stage_blocks<T>() * T::kBytes) % v == 0)
      return v;
  }
  return 2;
}

// Calls fn.template operator()<T, VEC>() for the staged types; false for the others.
template <class Fn>
bool with_staged_type(DType type, bool q8s, int vec, Fn&& fn) {
  auto by_vec = [&]<class T>() {
    switch (vec) {
      case 16:
        fn.template operator()<T, 16>();
        break;
      case 8:
        fn.template operator()<T, 8>();
        break;
      case 4:
        fn.template operator()<T, 4>();
        break;
      default:
        return false;  // 2-byte aligned only: the unstaged kernels
    }
    return true;
  };
  switch (type) {
    case DType::Q4_K:
      return by_vec.template operator()<qb::Q4K>();
    case DType::Q5_K:
      return by_vec.template operator()<qb::Q5K>();
    case DType::Q6_K:
      return by_vec.template operator()<qb::Q6K>();
    case DType::Q8_0:
      return q8s ? by_vec.template operator()<qb::Q80S>() : by_vec.template operator()<qb::Q80>();
    case DType::Q4_0:
      return by_vec.template operator()<qb::Q40>();
    case DType::IQ4_XS:
      return by_vec.template operator()<qb::IQ4XS>();
    default:
      return false;
  }
}

// Launches one of the staged kernels for nr = 1..8 activation rows.
template <int NR, class Launch>
void for_nr(int nr, Launch&& launch) {
  if constexpr (NR <= 8) {
    if (nr == NR) return launch.template operator()<NR>();
    for_nr<NR + 1>(nr, launch);
  }
}

}  // namespace

int staged_vec_of(const MatArg& m) {
  switch (m.dtype) {
    case DType::Q4_K:
      return stage_vec<qb::Q4K>(m);
    case DType::Q5_K:
      return stage_vec<qb::Q5K>(m);
    case DType::Q6_K:
      return stage_vec<qb::Q6K>(m);
    case DType::Q8_0:
      return m.q8s ? stage_vec<qb::Q80S>(m) : stage_vec<qb::Q80>(m);
    case DType::Q4_0:
      return stage_vec<qb::Q40>(m);
    case DType::IQ4_XS:
      return stage_vec<qb::IQ4XS>(m);
    default:
      return 0;
  }
}

bool staging_off() {
  static const bool off = [] {
    const char* v = std::getenv("QWENRT_CUDA_STAGED");
    return v && v[0] == '0';
  }();
  return off;
}

// The staged path of run_group when every job has the same staged type (n <= 8).
bool staged_group(const Group& g, int64_t n, const Acts& a, cudaStream_t stream) {
  if (staging_off() || n > 8 || n < 1) return false;
  const DType type = g.job[0].m.dtype;
  int vec = 16;
  int64_t rows = 0;
  for (int i = 0; i < g.n_jobs; ++i) {
    if (g.job[i].m.dtype != type || g.job[i].m.q8s != g.job[0].m.q8s) return false;
    vec = std::min(vec, staged_vec_of(g.job[i].m));
    rows += g.job[i].m.out;
  }
  Group sg = g;
  int64_t first = 0;
  for (int i = 0; i < g.n_jobs; ++i) {
    sg.job[i].first_block = first;  // first row here
    first += g.job[i].m.out;
  }
  const unsigned grid = static_cast<unsigned>((rows + kStageWarps - 1) / kStageWarps);
  return with_staged_type(type, g.job[0].m.q8s, vec, [&]<class T, int VEC>() {
    for_nr<1>(static_cast<int>(n), [&]<int NR>() {
      staged_gemv_kernel<T, NR, VEC><<<grid, kStageWarps * 32, 0, stream>>>(sg, rows, a);
    });
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

bool staged_swiglu(const MatArg& g, const MatArg& u, float* y, int64_t n, const Acts& a,
                   cudaStream_t stream) {
  if (staging_off() || n > 8 || n < 1 || g.dtype != u.dtype || g.q8s != u.q8s) return false;
  const int vec = std::min(staged_vec_of(g), staged_vec_of(u));
  const unsigned grid = static_cast<unsigned>((g.out + kStageWarps - 1) / kStageWarps);
  return with_staged_type(g.dtype, g.q8s, vec, [&]<class T, int VEC>() {
    for_nr<1>(static_cast<int>(n), [&]<int NR>() {
      staged_swiglu_kernel<T, NR, VEC><<<grid, kStageWarps * 32, 0, stream>>>(g, u, y, a);
    });
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

bool staged_experts_swiglu(const MatArg& g, const MatArg& u, const int32_t* ids, int k, float* y,
                           int64_t n_pairs, const Acts& a, cudaStream_t stream) {
  if (staging_off() || g.dtype != u.dtype || g.q8s != u.q8s) return false;
  const int vec = std::min(staged_vec_of(g), staged_vec_of(u));
  const int64_t rows = n_pairs * g.out;
  if ((rows + kStageWarps - 1) / kStageWarps > int64_t{0x7fffffff}) return false;
  const unsigned grid = static_cast<unsigned>((rows + kStageWarps - 1) / kStageWarps);
  return with_staged_type(g.dtype, g.q8s, vec, [&]<class T, int VEC>() {
    staged_experts_swiglu_kernel<T, VEC>
        <<<grid, kStageWarps * 32, 0, stream>>>(g, u, ids, k, y, n_pairs, a);
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

bool staged_experts_down_pairs(const MatArg& d, const int32_t* ids, float* y, int64_t n_pairs,
                               const Acts& a, cudaStream_t stream) {
  if (staging_off()) return false;
  const int vec = staged_vec_of(d);
  const int64_t rows = n_pairs * d.out;
  if ((rows + kStageWarps - 1) / kStageWarps > int64_t{0x7fffffff}) return false;
  const unsigned grid = static_cast<unsigned>((rows + kStageWarps - 1) / kStageWarps);
  return with_staged_type(d.dtype, d.q8s, vec, [&]<class T, int VEC>() {
    staged_experts_down_pairs_kernel<T, VEC>
        <<<grid, kStageWarps * 32, 0, stream>>>(d, ids, y, n_pairs, a);
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

bool staged_experts_down(const MatArg& d, const int32_t* ids, const float* weights, int k, float* y,
                         int64_t n, const Acts& a, cudaStream_t stream) {
  if (staging_off()) return false;
  const int vec = staged_vec_of(d);
  const int64_t rows = n * d.out;
  if ((rows + kStageWarps - 1) / kStageWarps > int64_t{0x7fffffff}) return false;
  const unsigned grid = static_cast<unsigned>((rows + kStageWarps - 1) / kStageWarps);
  return with_staged_type(d.dtype, d.q8s, vec, [&]<class T, int VEC>() {
    staged_experts_down_kernel<T, VEC>
        <<<grid, kStageWarps * 32, 0, stream>>>(d, ids, weights, k, y, n, a);
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace qwenrt::ops::cuda::mm
