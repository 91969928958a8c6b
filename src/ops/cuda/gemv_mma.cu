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
  int j = 0;
  if constexpr (NM == 1) {
    while (j + 1 < g.n_jobs && int64_t{blockIdx.x} >= g.job[j + 1].first_block) ++j;
  }
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
  // The warps' partial tiles: red[(((m * MT + mt) * NT + nt) * 4 + i) * warps * 32 + warp * 32 +
  // lane].
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          red[(((m * MT + mt) * NT + nt) * 4 + i) * warps * 32 + threadIdx.x] = acc[m][mt][nt][i];
  __syncthreads();
  for (int e = threadIdx.x; e < MT * NT * 4 * 32; e += blockDim.x) {
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
