// The tensor-core GEMV (matmul_args.cuh, "gemv_mma.cu"): quantised weights against 3..32
// activation rows already quantised to int8, for batched decode and speculative checks.
//
// The staged GEMV dots every activation row against each weight unit with dp4a, so each row
// beyond the first costs about a third of a one-row pass (measured: 8 rows cost 3.0-3.4 one-row
// steps on the H200). Here the integer dot products run as mma.sync int8 (m16n8k32, and m16n8k16
// for Q6_K's 16-element scales): 16 weight rows x 8 activation rows x one 32-element block per
// instruction, so the cost per activation row is small and the pass stays a stream over the
// weights.
// - A block owns 16 weight rows (of one matrix, or a gate and up pair) and all activation rows (n
//   up to 8 * NT); its W warps split the row's 256-element superblocks (warp w takes w, w + W,
//   ...) and sum their partial tiles through shared memory in warp order (deterministic).
// - Lane (g, t) = (lane / 4, lane % 4) loads its fragments straight from global memory: rows g and
//   g + 8 of the tile, bytes 8t..8t+7 of each 32-element run, and the same bytes of activation row
//   g. The mma's k slots t*4..t*4+3 and 16+t*4..16+t*4+3 thus hold elements 8t..8t+7: one
//   permutation of k, the same for weights and activations, which leaves the dot product as it
//   is. (Q6_K's k16 form keeps the natural order.)
// - The int32 dot of each 32-element block (16 for Q6_K) is scaled in fp32 as the dp4a kernels do:
//   x = d sc level - dmin m, so a block adds xd (d sc <level, q>) - dmin m xs with xs = xd sum(q)
//   (the activation sums quantize_q8_kernel writes). The same integer dots as the staged GEMV;
//   only the fp32 summation order differs.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/mma_quant.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

constexpr int kTileRows = 16;            // weight rows per block (the mma's M)
constexpr int kMaxWarps = 8;             // warps splitting a row's superblocks
constexpr int kReduceBytes = 48 * 1024;  // shared memory for the warps' partial tiles (at most)
using mmaq::act_lane;
using mmaq::ActLane;
using mmaq::kSuperElems;

// The job of row tile `tile` (NM = 2: gate and up are jobs 0 and 1 and share every tile).
template <int NM>
__device__ __forceinline__ int tile_job(const Group& g, int64_t tile) {
  int j = 0;
  if constexpr (NM == 1) {
    while (j + 1 < g.n_jobs && tile >= g.job[j + 1].first_block) ++j;
  }
  return j;
}

// The warps' partial tiles into shared memory, thread tid of the block's warps:
// red[(((m * MT + mt) * NT + nt) * 4 + i) * warps * 32 + tid].
template <int NM, int MT, int NT>
__device__ __forceinline__ void put_partials(float* red, const float (&acc)[NM][MT][NT][4],
                                             int warps, int tid) {
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          red[(((m * MT + mt) * NT + nt) * 4 + i) * warps * 32 + tid] = acc[m][mt][nt][i];
}

// The tile's outputs (16 MT rows of job j from row0, n activation rows) from the partials, summed
// in warp order, by threads tid of nthreads; NM = 2: silu(gate) * up. After put_partials and a
// barrier of the same threads.
template <int NM, int MT, int NT>
__device__ __forceinline__ void store_tile(const Group& g, int j, int64_t row0, int n,
                                           const float* red, int warps, int tid, int nthreads) {
  const int64_t out = g.job[j].m.out;
  for (int e = tid; e < MT * NT * 4 * 32; e += nthreads) {
    const int l = e % 32, v = e / 32;  // v = (mt * NT + nt) * 4 + i
    const int mt = v / (NT * 4), nt = v / 4 % NT, i = v % 4;
    const int64_t row = row0 + kTileRows * mt + l / 4 + 8 * (i / 2);
    const int col = 8 * nt + 2 * (l % 4) + (i % 2);
    float sum[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      sum[m] = 0.0f;
      for (int w = 0; w < warps; ++w)
        sum[m] += red[(m * MT * NT * 4 + v) * warps * 32 + w * 32 + l];
    }
    if (row >= out || col >= n) continue;
    const float r = NM == 2 ? silu(sum[0]) * sum[NM - 1] : sum[0];
    g.job[j].y[int64_t{col} * g.job[j].y_stride + row] = r;
  }
}

// ---- The kernel -----------------------------------------------------------------------------
// NM = 1: a group of matrices (blockIdx.x over every job's row tiles, jobs of one type);
// NM = 2: job 0 is gate, job 1 up, y = silu(gate) * up into job 0's y.
// MT: m-tiles of 16 rows a block (types with T::kCached). A warp loads a superblock's activation
// fragments once and applies them to all MT tiles: with MT = 1 the activation loads outnumber the
// weight loads and the kernel is bound by the L1 (ncu, Q4_K 2048 x 248320 at 8 rows: L1/TEX 90%
// busy, DRAM 36%). Each output's sum is the same for every MT (same superblocks per warp, same
// order, the warps' tiles summed in warp order).
// TL: the activations are read in the tile order (Acts::tq / tq16; types with T::kTiles): a
// warp's activation loads are contiguous runs instead of 8 rows' cache lines each (Q4_K 5120 x
// 17408 SwiGLU at 8 rows 36.6% -> 42.9% of the bandwidth, 16 rows 22.5% -> 28.0%). The values
// and the order of the sums are those of the row-major reads.
template <class T, int NT, int NM, int MT, bool TL>
__global__ void __launch_bounds__(kMaxWarps * 32)
    mma_gemv_kernel(const __grid_constant__ Group g, int n, Acts a) {
  pdl_launch_dependents();
  extern __shared__ float red[];  // NM * MT * NT * 4 * 32 floats per warp
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = lane / 4, t = lane % 4;
  const int j = tile_job<NM>(g, blockIdx.x);
  const int64_t row0 = (int64_t{blockIdx.x} - g.job[j].first_block) * kTileRows * MT;
  const int64_t out = g.job[j].m.out;
  const int64_t n_sb = a.in / kSuperElems;
  const ActLane al = act_lane(a, gq, t);
  const mmaq::ActTiles at = mmaq::act_tiles(a, gq, t);
  float acc[NM][MT][NT][4] = {};
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const MatArg& w = g.job[j + m].m;
    // Rows past the end read the last row (their outputs are not written).
    const uint8_t* w0[MT];
    const uint8_t* w1[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      w0[mt] = w.data + min(row0 + kTileRows * mt + gq, out - 1) * w.row_bytes;
      w1[mt] = w.data + min(row0 + kTileRows * mt + gq + 8, out - 1) * w.row_bytes;
    }
    // (Loading the next superblock before computing this one measured slower: 515 -> 478 tok/s
    // on the 27B at 8 rows; the registers cost more warps than the loads in flight gain.)
    for (int64_t sb = warp; sb < n_sb; sb += warps) {
      if constexpr (MT == 1 && !TL) {
        const typename T::Raw r = T::load(w0[0] + sb * T::kBytes, w1[0] + sb * T::kBytes, t);
        T::template compute<NT>(r, sb, t, al, acc[m][0]);
      } else {
        // k32 types take ActK32 (tile or row-major order), Q6_K ActK16 (tile order only).
        using X = std::conditional_t<T::kK32, mmaq::ActK32<NT, T::kMin>, mmaq::ActK16<NT>>;
        X x;
        if constexpr (TL) {
          x.load(at, sb);
        } else {
          x.load(al, sb, t);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const typename T::Raw r = T::load(w0[mt] + sb * T::kBytes, w1[mt] + sb * T::kBytes, t);
          mmaq::apply(T::decode(r), x, acc[m][mt]);
        }
      }
    }
  }
  put_partials(red, acc, warps, threadIdx.x);
  __syncthreads();
  store_tile<NM, MT, NT>(g, j, row0, n, red, warps, threadIdx.x, blockDim.x);
}

// ---- The ring form (sm_90): the weights through shared memory ---------------------------------
// The kernel above loads each lane's weight fragments from global memory as it needs them, a few
// hundred bytes a warp in flight: at 8 rows the 27B's GEMVs stream at 35-53% of the bandwidth
// (bench/results/h100-batched-decode-2026-12-06.md). Here the blocks are persistent and one
// producer warp lands the weights in a ring of shared-memory stages with bulk copies
// (bulk_copy.cuh), tens of kilobytes ahead of the W consumer warps; the next tile's weights load
// while this tile's partials are summed, and before the previous kernel has finished (PDL: the
// weights are no earlier kernel's output).
// - A tile is the old kernel's block (16 MT rows of one matrix, or of gate and up); its k-step c
//   is superblocks c W .. c W + W - 1, a stage: matrix m's m-tile mt row i of the tile at slot
//   (m MT + mt) 16 + i of `slot` bytes (W superblocks, plus 16 where a row's bytes need not start
//   16-byte aligned (Q6_K: the copy starts at the 16-byte boundary below, the lane reads from
//   the row's own offset), padded so that the slots of rows g = 0..7 fall on four different bank
//   quarters).
// - Consumer warp w takes superblock c W + w of each k-step: the superblocks of the old kernel's
//   warp w in the same order, and the partial tiles meet in the same warp order, so the outputs
//   are the old kernel's bit for bit (CudaMatmulLaunchers.MmaGemvRingEqualsLoads).
constexpr int kRingMaxStages = 16;
constexpr int kRingBarBytes = 2 * kRingMaxStages * 8;

// Bytes a row's slot of W superblocks of T takes (a multiple of 16 that is 32 more than a
// multiple of 128).
template <class T>
constexpr int ring_slot_bytes(int warps) {
  int s = (warps * T::kBytes + (T::kBytes % 16 != 0 ? 16 : 0) + 15) / 16 * 16;
  while (s % 128 != 32) s += 16;
  return s;
}

// Threads a block of the ring kernel may have: warps_for's consumers (4 up to two n-tiles, 8
// above) and the producer. The bound is the kernel's: at (8 + 1) x 32 for every NT, ptxas gave
// the kernels of one and two n-tiles 168 registers and spilled the two m-tiles' fragments (Q4_K
// 5120 x 17408 SwiGLU at 8 rows 0.93x the kernel above, H100) and some of four n-tiles 32
// registers and kilobytes of spills (the same at 32 rows: 18x slower).
template <int NT>
constexpr int ring_max_threads() {
  return 32 * ((NT <= 2 ? 4 : kMaxWarps) + 1);
}

template <class T, int NT, int NM, int MT, bool TL>
__global__ void __launch_bounds__(ring_max_threads<NT>(), NT <= 2 ? 2 : 1)
    mma_ring_kernel(const __grid_constant__ Group g, int n, Acts a, int64_t tiles, int stages) {
  constexpr int kRows = NM * MT * kTileRows;  // weight rows a stage holds
  extern __shared__ __align__(128) uint8_t rg_smem[];
  const int warps = blockDim.x / 32 - 1;  // consumers; the last warp produces
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = ring_slot_bytes<T>(warps);
  const int64_t stage_bytes = int64_t{kRows} * slot;
  uint64_t* full = reinterpret_cast<uint64_t*>(rg_smem);
  uint64_t* empty = full + kRingMaxStages;
  float* red = reinterpret_cast<float*>(rg_smem + kRingBarBytes);  // NM MT NT 4 32 floats a warp
  uint8_t* ring =
      rg_smem + kRingBarBytes + (size_t{NM} * MT * NT * 4 * 32 * 4 * warps + 127) / 128 * 128;
  const int64_t n_sb = a.in / kSuperElems;
  const int64_t ksteps = (n_sb + warps - 1) / warps;
  mbar_ring_init(full, empty, stages, warps);
  pdl_launch_dependents();
  // Where row r (< out) of matrix w has superblock sb0's bytes: their offset from the 16-byte
  // boundary below (0 for the types of 16-byte blocks: the launcher asks for 16-byte aligned
  // data, mma_fits for rows of a multiple of 16 bytes).
  auto misalign = [](const MatArg& w, int64_t r, int64_t sb0) {
    if constexpr (T::kBytes % 16 == 0) return 0;
    return static_cast<int>(
        (reinterpret_cast<uintptr_t>(w.data) + r * w.row_bytes + sb0 * T::kBytes) % 16);
  };

  if (warp == warps) {  // the producer: lane i copies stage rows i, i + 32
    int64_t it = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int j = tile_job<NM>(g, tile);
      const int64_t row0 = (tile - g.job[j].first_block) * kTileRows * MT;
      for (int64_t c = 0; c < ksteps; ++c, ++it) {
        const int q = static_cast<int>(it % stages);
        if (it >= stages) mbar_wait(&empty[q], ((it / stages) - 1) & 1);
        const int64_t sb0 = c * warps;
        const int64_t bytes = min(int64_t{warps}, n_sb - sb0) * T::kBytes;
        uint8_t* dst = ring + q * stage_bytes;
        // Each lane's copies: [lo, hi) from the 16-byte boundary below the row's bytes to the one
        // above, except at the end of the matrix (no read past it): the last bytes then by plain
        // loads, before the arrival that publishes them.
        uintptr_t lo[kRows / 32 + 1], hi[kRows / 32 + 1];
        uint32_t total = 0;
#pragma unroll
        for (int k = 0; k < kRows / 32 + 1; ++k) {
          const int r = lane + 32 * k;
          lo[k] = hi[k] = 0;
          if (r >= kRows) continue;
          const MatArg& w = g.job[j + r / (MT * kTileRows)].m;
          const int64_t row = min(row0 + r % (MT * kTileRows), w.out - 1);
          const uintptr_t begin =
              reinterpret_cast<uintptr_t>(w.data) + row * w.row_bytes + sb0 * T::kBytes;
          const uintptr_t end = begin + bytes;
          const uintptr_t matrix_end = reinterpret_cast<uintptr_t>(w.data) + w.out * w.row_bytes;
          lo[k] = begin / 16 * 16;
          hi[k] = (end + 15) / 16 * 16;
          if (hi[k] > matrix_end) {
            hi[k] = end / 16 * 16;
            uint8_t* d = dst + r * slot;
            for (uintptr_t p = hi[k]; p < end; p += 2)
              *reinterpret_cast<uint16_t*>(d + (p - lo[k])) = *reinterpret_cast<const uint16_t*>(p);
          }
          total += static_cast<uint32_t>(hi[k] - lo[k]);
        }
        total = __reduce_add_sync(0xffffffffu, total);
        __syncwarp();
        if (lane == 0) mbar_arrive_expect_tx(&full[q], total);
        __syncwarp();
#pragma unroll
        for (int k = 0; k < kRows / 32 + 1; ++k) {
          const int r = lane + 32 * k;
          if (r < kRows && hi[k] > lo[k])
            bulk_copy_g2s(dst + r * slot, reinterpret_cast<const void*>(lo[k]),
                          static_cast<uint32_t>(hi[k] - lo[k]), &full[q]);
        }
      }
    }
    return;
  }

  const int gq = lane / 4, t = lane % 4;
  pdl_wait();  // the activations come from the previous kernel
  const ActLane al = act_lane(a, gq, t);
  const mmaq::ActTiles at = mmaq::act_tiles(a, gq, t);
  const int consumers = 32 * warps;
  int64_t it = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int j = tile_job<NM>(g, tile);
    const int64_t row0 = (tile - g.job[j].first_block) * kTileRows * MT;
    const int64_t out = g.job[j].m.out;
    float acc[NM][MT][NT][4] = {};
    for (int64_t c = 0; c < ksteps; ++c, ++it) {
      const int q = static_cast<int>(it % stages);
      mbar_wait(&full[q], (it / stages) & 1);
      const int64_t sb0 = c * warps, sb = sb0 + warp;
      if (sb < n_sb) {
        const uint8_t* st = ring + q * stage_bytes + warp * T::kBytes;
        using X = std::conditional_t<T::kK32, mmaq::ActK32<NT, T::kMin>, mmaq::ActK16<NT>>;
        [[maybe_unused]] X x;
        if constexpr (!(MT == 1 && !TL)) {
          if constexpr (TL) {
            x.load(at, sb);
          } else {
            x.load(al, sb, t);
          }
        }
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          const MatArg& w = g.job[j + m].m;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int s0 = (m * MT + mt) * kTileRows + gq;
            const int64_t r0 = min(row0 + kTileRows * mt + gq, out - 1);
            const int64_t r1 = min(row0 + kTileRows * mt + gq + 8, out - 1);
            const uint8_t* p0 = st + s0 * slot + misalign(w, r0, sb0);
            const uint8_t* p1 = st + (s0 + 8) * slot + misalign(w, r1, sb0);
            const typename T::Raw r = T::load(p0, p1, t);
            if constexpr (MT == 1 && !TL) {
              T::template compute<NT>(r, sb, t, al, acc[m][0]);
            } else {
              mmaq::apply(T::decode(r), x, acc[m][mt]);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[q]);
    }
    // The warps' partial tiles, summed in warp order as mma_gemv_kernel does.
    asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");  // the last tile's reads done
    put_partials(red, acc, warps, threadIdx.x);
    asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
    store_tile<NM, MT, NT>(g, j, row0, n, red, warps, threadIdx.x, consumers);
  }
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atoi(v);
}
// The most warps a block splits a row over (a measurement knob; default: warps_for's rule).
int max_warps() {
  static const int w = std::clamp(env_int("QWENRT_CUDA_MMA_WARPS", 0), 0, kMaxWarps);
  return w;
}

int max_rows_from_env() {
  const char* v = std::getenv("QWENRT_CUDA_MMA_ROWS");
  if (v == nullptr || *v == '\0') return 32;
  const long long r = std::atoll(v);
  return r <= 1 ? 0 : static_cast<int>(std::min<long long>(r, 64));
}

// Calls f.template operator()<T>() for the matrix's type, or returns false.
template <class F>
bool with_mma_type(const MatArg& m, F&& f) {
  return mmaq::with_type(m.dtype, m.q8s, std::forward<F>(f));
}

// Whether a matrix of type t (q8s: Q8_0 in superblocks) has a kernel here.
bool mma_dtype(DType t, bool q8s) {
  return mmaq::has_type(t, q8s);
}
bool mma_type_ok(const MatArg& m) {
  return mma_dtype(m.dtype, m.q8s);
}

template <class F>
void with_nt(int64_t n, F&& f) {
  if (n <= 8) {
    f.template operator()<1>();
  } else if (n <= 16) {
    f.template operator()<2>();
  } else if (n <= 32) {
    f.template operator()<4>();
  } else {
    f.template operator()<8>();
  }
}

// Warps per block: up to one per superblock of a row, no more than the partial tiles' shared
// memory holds; 4 for up to 16 rows and 8 above (27B on the H200, rows 8 / 16 / 32: 496 / 722 /
// 835 tok/s with 4 warps, 478 / 659 / 862 with 8).
int warps_for(int64_t n_sb, int nm, int mt, int nt) {
  const int by_smem = kReduceBytes / (nm * mt * nt * 4 * 32 * 4);
  const int64_t by_row = std::max<int64_t>(1, n_sb);
  const int most = max_warps() > 0 ? max_warps() : nt <= 2 ? 4 : kMaxWarps;
  return static_cast<int>(std::min<int64_t>({most, by_smem, by_row}));
}

// Where blocks take two m-tiles (up to 16 rows): 1 for the types with a cached form (Q4_K, Q5_K;
// the default), 0 nowhere (QWENRT_CUDA_MMA_MT=1), 2 for every type (QWENRT_CUDA_MMA_MT=2; a
// measurement knob; Q6_K only with the tile order). Read per call: tests switch it.
// Measured on the H200 (bench/results/h200-mma-gemv-2026-12-04.md): Q4_K 5120 x 17408 SwiGLU
// 29.6% -> 37.2% of the bandwidth at 8 rows, 18.6% -> 22.6% at 16; 27B x16 decode 694 -> 756
// tok/s; Q8_0 slower with two (row-major activations).
int two_m_tiles() {
  const char* v = std::getenv("QWENRT_CUDA_MMA_MT");
  return v && v[0] == '1' ? 0 : v && v[0] == '2' ? 2 : 1;
}

// Whether Q8_0 superblocks read the tile order too (QWENRT_CUDA_MMA_TILED=2; a measurement knob:
// by default they read row-major, measured faster on 5120-wide rows). Read per call.
bool q8_0_tiles() {
  const char* v = std::getenv("QWENRT_CUDA_MMA_TILED");
  return v && v[0] == '2';
}

bool mma_fits(const MatArg& m, const Acts& a) {
  if (!mma_type_ok(m) || m.n_expert != 1 || a.in % kSuperElems != 0 || a.s == nullptr) return false;
  const int64_t need = m.dtype == DType::Q6_K ? 2 : 16;
  return aligned(m.data, need) && m.row_bytes % need == 0;
}

// The ring form on sm_90 unless QWENRT_CUDA_MMA_RING=0 (read per call: tests switch it), its ring
// QWENRT_CUDA_MMA_RING_KB kilobytes a block (default 64; at least two stages). The default since
// session 34: 27B x8 +13%, 4- and 8-row checks 7-11% cheaper, x16 even (docs/decisions.md).
bool ring_on() {
  const char* v = std::getenv("QWENRT_CUDA_MMA_RING");
  return !(v && v[0] == '0') && sm90_or_later();
}

// Launches mma_ring_kernel over g's `tiles` tiles with `warps` consumer warps; false, having
// launched nothing, where it is off or does not fit (weights not 16-byte aligned, more shared
// memory than a block has).
template <class T, int NT, int NM, int MT, bool TL>
bool launch_ring(const Group& g, int64_t n, const Acts& a, int64_t tiles, int warps,
                 cudaStream_t stream) {
  // Not where ptxas spills the consumers' fragments at the ring's register bound: two m-tiles
  // of two n-tiles with mins (Q4_K / Q5_K at 9..16 rows, 88-432 bytes) and gate and up at four
  // n-tiles (about a kilobyte); nor eight n-tiles (more rows than the launchers send).
  constexpr bool kFits = NT <= 4 && !(NT == 2 && MT == 2 && T::kMin) && !(NT == 4 && NM == 2);
  if constexpr (!kFits) {
    return false;
  } else {
    if (!ring_on()) return false;
    for (int i = 0; i < (NM == 1 ? g.n_jobs : 2); ++i)
      if (!aligned(g.job[i].m.data, 16)) return false;
    static const int ring_kb = std::clamp(env_int("QWENRT_CUDA_MMA_RING_KB", 64), 8, 200);
    const int64_t stage = int64_t{NM} * MT * kTileRows * ring_slot_bytes<T>(warps);
    const int stages =
        static_cast<int>(std::clamp<int64_t>(int64_t{ring_kb} * 1024 / stage, 2, kRingMaxStages));
    const size_t red = (size_t{NM} * MT * NT * 4 * 32 * 4 * warps + 127) / 128 * 128;
    const size_t smem = kRingBarBytes + red + size_t(stages) * size_t(stage);
    auto* kernel = mma_ring_kernel<T, NT, NM, MT, TL>;
    static const size_t kMaxSmem = max_dynamic_smem(kernel);
    if (smem > kMaxSmem) return false;
    const int threads = 32 * (warps + 1);
    if (threads > ring_max_threads<NT>()) return false;  // (QWENRT_CUDA_MMA_WARPS above the rule)
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kMaxSmem)));
    int per_sm = 0;
    QWENRT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const int64_t grid = std::min<int64_t>(tiles, int64_t{std::max(per_sm, 1)} * sm_count());
    launch_dependent(kernel, dim3(static_cast<unsigned>(grid)), dim3(threads), smem, stream, g,
                     static_cast<int>(n), a, tiles, stages);
    return true;
  }
}

// g's jobs get their first row blocks here (NM = 2: gate and up share them).
template <int NM>
bool launch_mma(Group g, int64_t n, const Acts& a, cudaStream_t stream) {
  return with_mma_type(g.job[0].m, [&]<class T>() {
    with_nt(n, [&]<int NT>() {
      auto launch = [&]<int MT, bool TL>() {
        int64_t blocks = 0;
        for (int i = 0; i < g.n_jobs; ++i) {
          g.job[i].first_block = NM == 1 ? blocks : 0;
          if (NM == 1 || i == 0) blocks += (g.job[i].m.out + kTileRows * MT - 1) / (kTileRows * MT);
        }
        const int warps = warps_for(a.in / kSuperElems, NM, MT, NT);
        if (launch_ring<T, NT, NM, MT, TL>(g, n, a, blocks, warps, stream)) return;
        const size_t smem = size_t{NM} * MT * NT * 4 * 32 * 4 * warps;
        mma_gemv_kernel<T, NT, NM, MT, TL>
            <<<static_cast<unsigned>(blocks), warps * 32, smem, stream>>>(g, static_cast<int>(n),
                                                                          a);
      };
      // False where there is no kernel: two m-tiles of Q6_K need the tile order.
      auto with_tl = [&]<int MT>() {
        if constexpr (T::kTiles || T::kK32) {
          if (a.tq != nullptr && (T::kTiles || q8_0_tiles())) {
            launch.template operator()<MT, true>();
            return true;
          }
        }
        if constexpr (MT == 1 || T::kK32) {
          launch.template operator()<MT, false>();
          return true;
        }
        return false;
      };
      if constexpr (NT <= 2) {
        const int mode = two_m_tiles();
        if ((mode == 2 || (mode == 1 && T::kCached)) && with_tl.template operator()<2>()) return;
      }
      with_tl.template operator()<1>();
    });
    QWENRT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

bool mma_rows(int64_t n) {
  static const int max_rows = max_rows_from_env();
  // From 3 rows: at 2 the staged GEMV measured faster (27B, 2-row checks: 79.9 against 61.0
  // checks/s; every micro-benchmark shape 0.5-0.8x), from 4 rows (Q4_K) and 5 (end to end) slower.
  static const int min_rows = std::max(2, env_int("QWENRT_CUDA_MMA_MIN_ROWS", 3));
  return n >= min_rows && n <= max_rows;
}

bool mma_tiled(const Matrix& w) {
  bool tiles = false;
  mmaq::with_type(w.dtype, w.q8_superblocks,
                  [&]<class T>() { tiles = T::kTiles || (T::kK32 && q8_0_tiles()); });
  return tiles && mma_kind(w);
}

bool mma_kind(const Matrix& w) {
  return mma_dtype(w.dtype, w.q8_superblocks) && w.n_expert == 1 && w.in % kSuperElems == 0;
}

bool mma_group(const Group& g, int64_t n, const Acts& a, cudaStream_t stream) {
  if (!mma_rows(n)) return false;
  for (int i = 0; i < g.n_jobs; ++i)
    if (!mma_fits(g.job[i].m, a)) return false;
  // One launch per run of jobs of one type (a group may mix types: Q4_K q / k with a Q6_K v).
  for (int i = 0; i < g.n_jobs;) {
    Group sg{};
    sg.n_jobs = 0;
    int e = i;
    while (e < g.n_jobs && g.job[e].m.dtype == g.job[i].m.dtype) sg.job[sg.n_jobs++] = g.job[e++];
    launch_mma<1>(sg, n, a, stream);
    i = e;
  }
  return true;
}

bool mma_swiglu(const MatArg& gate, const MatArg& up, float* y, int64_t n, const Acts& a,
                cudaStream_t stream) {
  if (!mma_rows(n) || gate.dtype != up.dtype || gate.q8s != up.q8s || !mma_fits(gate, a) ||
      !mma_fits(up, a) || gate.out != up.out)
    return false;
  Group sg{};
  sg.n_jobs = 2;
  sg.job[0] = {.m = gate, .y = y, .y_stride = gate.out, .first_block = 0};
  sg.job[1] = {.m = up, .y = y, .y_stride = gate.out, .first_block = 0};
  return launch_mma<2>(sg, n, a, stream);
}

}  // namespace qwenrt::ops::cuda::mm
