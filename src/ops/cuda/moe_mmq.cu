// MoE prefill on int8 tensor cores (kernels.h, "MoE prefill on int8 tensor cores"): the routed
// experts of many rows as grouped GEMMs over the pairs ordered by expert (order_by_expert), the
// weights read as stored and the activations quantised to int8 blocks of 32 (act_quant.cu's form).
// The integer dots and their fp32 scaling are mma_quant.cuh's, those of the tensor-core GEMV
// (gemv_mma.cu); moe_gemm.cu's bf16 kernels instead dequantise every weight tile in every block,
// which costs more than the products.
//
// A block owns one tile of up to R = 8 NT pairs of one expert (the pairs' activation rows are the
// mma's n) and 16 weight rows a warp (its m). The tile's activations are staged in shared memory
// a superblock (256 elements) at a time by cp.async into two buffers, so each activation byte is
// read from L2 once a block, not once a warp; each warp loads its weight rows' next superblock
// into registers while it multiplies the current one.
// - swiglu: blockIdx.y = a run of 16 W / 2 hidden columns (W warps a block, 4 by default); the
//   first W / 2 warps take those gate rows, the others the same up rows. The epilogue forms
//   silu(gate) * up for each pair and quantises it (a warp a block of 32, quantize_block32) into
//   the hidden activations at the pair's sorted position: down's input, in expert order, never
//   stored in fp32.
// - down: blockIdx.y = a run of 16 W output rows (W warps x 16); reads the hidden rows of the
//   tile's sorted positions, writes y_pairs [pair, out].
// Dense matrices of many rows (mm::mmq_dense, mm::mmq_dense_swiglu: batched decode, between the
// tensor-core GEMV and the bf16 cuBLAS GEMM) run the same kernels as one expert whose pairs are
// the rows in order (MmqArgs::dense_n > 0: no ExpertOrder); the SwiGLU form then writes
// silu(gate) * up in fp32 (the dense FFN's down is a matmul of its own).
// Staged rows are 288 bytes apart (256 + 32): lane (g, t) reads 8 bytes at row g, byte 8t + 32j,
// so the 32 lanes cover all 32 banks twice (the least for 256 bytes).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "ops/cuda/check.h"
#include "ops/cuda/expert_order.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/mma_quant.cuh"
#include "ops/cuda/paged_kv.cuh"
#include "ops/cuda/pdl.cuh"

namespace qwenrt::ops::cuda {
namespace {

using mm::mmaq::ActLane;
using mm::mmaq::kSuperElems;

constexpr int kWarpRows = 16;  // weight rows a warp (the mma's m)
// Blocks of W warps: a SwiGLU block W / 2 gate warps and W / 2 up warps over 16 (W / 2) hidden
// columns (whole blocks of 32), a down block 16 W output rows.
template <int W>
constexpr int swiglu_cols() {
  return W / 2 * kWarpRows;
}
template <int W>
constexpr int down_rows() {
  return W * kWarpRows;
}
constexpr int kQStride = kSuperElems + 32;            // bytes between staged activation rows
constexpr int kBlocks = kSuperElems / qb::kActBlock;  // activation blocks a superblock (8)

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One superblock of the tile's R activation rows.
template <int R>
struct alignas(16) Stage {
  int8_t q[R][kQStride];
  float d[R][kBlocks];
  float s[R][kBlocks];
};

struct MmqArgs {
  const uint8_t* w0;  // gate (SwiGLU) or down; expert e at + e * expert_bytes
  const uint8_t* w1;  // up (SwiGLU)
  int64_t row_bytes, expert_bytes, out;
  // Activations: SwiGLU x [n, in] (pair p reads row p / k); down the hidden rows [n_pairs, in] in
  // sorted order.
  mm::Acts a;
  int k;
  ExpertOrder order;
  // SwiGLU: the hidden activations written in sorted order, q [n_pairs, out], d and s
  // [n_pairs, out / 32]. Down: y [n_pairs, out] by pair index.
  int8_t* hq;
  float* hd;
  float* hs;
  float* y;
  int64_t ldy;  // y's row stride (down), yf's (dense SwiGLU)
  // Dense: rows 0..dense_n of a.a against the matrix (expert 0), tile t holding rows R t ..; the
  // SwiGLU form writes yf [dense_n, ldy] in fp32 instead of hq / hd / hs.
  int64_t dense_n;
  float* yf;
};

// W = 8: one block an SM (~190 registers), the next superblock's weights loaded during this one's
// products. W = 4: three blocks an SM (registers capped at 170), no weight prefetch.
template <class T, int NT, bool kSwiGlu, int W>
__global__ void __launch_bounds__(W * 32, W == 8 ? 1 : 3)
    mmq_kernel(const __grid_constant__ MmqArgs a) {
  constexpr int R = 8 * NT, kThreads = W * 32, kHalf = W / 2;
  constexpr int kSwigluCols = swiglu_cols<W>(), kDownRows = down_rows<W>();
  constexpr bool kPrefetch = W == 8;
  const ExpertOrder& o = a.order;
  const int tile = blockIdx.x;
  const bool dense = a.dense_n > 0;
  int e = 0;
  int64_t m0 = int64_t{tile} * R;
  if (dense) {
    if (m0 >= a.dense_n) return;
  } else {
    if (tile >= o.tile_start[o.n_expert]) return;
    e = tile_expert(o, tile);
    m0 = o.pair_start[e] + int64_t(tile - o.tile_start[e]) * R;
  }
  const int rows =
      static_cast<int>(min(int64_t{R}, (dense ? a.dense_n : o.pair_start[e + 1]) - m0));

  __shared__ Stage<R> st[2];
  __shared__ int32_t s_src[R];   // the activation row of each tile row, -1 past `rows`
  __shared__ int32_t s_pair[R];  // its pair index (dense: its row)
  if (threadIdx.x < R) {
    const int r = threadIdx.x;
    const auto row = static_cast<int32_t>(m0 + r);
    const int32_t p = r < rows ? (dense ? row : o.pairs[m0 + r]) : -1;
    s_pair[r] = p;
    s_src[r] = r < rows ? (kSwiGlu && !dense ? p / a.k : row) : -1;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The warp's 16 weight rows: their first row, and the matrix (gate or up, the expert's).
  const int64_t row0 = kSwiGlu ? int64_t{blockIdx.y} * kSwigluCols + (warp % kHalf) * kWarpRows
                               : int64_t{blockIdx.y} * kDownRows + warp * kWarpRows;
  const uint8_t* wbase = (kSwiGlu && warp >= kHalf ? a.w1 : a.w0) + e * a.expert_bytes;
  // Rows past the end read the last row (their outputs are not written).
  const uint8_t* w0 = wbase + min(row0 + g, a.out - 1) * a.row_bytes;
  const uint8_t* w1 = wbase + min(row0 + g + 8, a.out - 1) * a.row_bytes;
  const int64_t in = a.a.in, nb = in / qb::kActBlock, n_sb = in / kSuperElems;

  // Superblock sb of the tile's rows into buffer `buf` (rows past `rows` zero-filled): per row 16
  // chunks of q, 2 of d, 2 of s.
  auto stage = [&](int buf, int64_t sb) {
    Stage<R>& s = st[buf];
    for (int i = threadIdx.x; i < R * 20; i += kThreads) {
      const int r = i / 20, c = i % 20;
      const int32_t src = s_src[r];
      const bool ok = src >= 0;
      const int64_t row = ok ? src : 0;
      if (c < 16) {
        cp_async16(&s.q[r][16 * c], a.a.q + row * in + sb * kSuperElems + 16 * c, ok);
      } else if (c < 18) {
        cp_async16(&s.d[r][4 * (c - 16)], a.a.d + row * nb + sb * kBlocks + 4 * (c - 16), ok);
      } else {
        cp_async16(&s.s[r][4 * (c - 18)], a.a.s + row * nb + sb * kBlocks + 4 * (c - 18), ok);
      }
    }
    cp_async_commit();
  };

  float acc[NT][4] = {};
  stage(0, 0);
  typename T::Raw raw = T::load(w0, w1, t);
  for (int64_t sb = 0; sb < n_sb; ++sb) {
    const int buf = static_cast<int>(sb & 1);
    const bool more = sb + 1 < n_sb;
    if (more) {
      stage(buf ^ 1, sb + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const Stage<R>& s = st[buf];
    const ActLane al{&s.q[g][0], &s.d[2 * t][0], &s.s[2 * t][0], 8 * kQStride, kBlocks};
    if constexpr (kPrefetch) {
      typename T::Raw next = raw;
      if (more) next = T::load(w0 + (sb + 1) * T::kBytes, w1 + (sb + 1) * T::kBytes, t);
      T::template compute<NT>(raw, 0, t, al, acc);
      raw = next;
    } else {
      if (sb > 0) raw = T::load(w0 + sb * T::kBytes, w1 + sb * T::kBytes, t);
      T::template compute<NT>(raw, 0, t, al, acc);
    }
    __syncthreads();  // the buffer is refilled by the next iteration's stage
  }

  // acc[nt][i]: weight row row0 + g + 8 (i / 2), tile row 8 nt + 2t + i % 2.
  if constexpr (kSwiGlu) {
    constexpr int kLd = kSwigluCols + 1;
    static_assert(sizeof(float) * 2 * R * kLd <= sizeof(Stage<R>) * 2, "epilogue tile fits");
    float* sh = reinterpret_cast<float*>(st);  // [2 (gate, up)][R][kLd]
    const int half = warp / kHalf, c0 = (warp % kHalf) * kWarpRows;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sh[(half * R + 8 * nt + 2 * t + i % 2) * kLd + c0 + g + 8 * (i / 2)] = acc[nt][i];
    __syncthreads();
    const int64_t nbo = a.out / qb::kActBlock;
    constexpr int kQBlocks = kSwigluCols / 32;
    for (int item = warp; item < R * kQBlocks; item += W) {
      const int r = item / kQBlocks, b = item % kQBlocks;
      if (r >= rows) continue;  // uniform over the warp
      const int col = 32 * b + lane;
      const float v = mm::silu(sh[r * kLd + col]) * sh[(R + r) * kLd + col];
      const int64_t pos = m0 + r, blk = int64_t{blockIdx.y} * kQBlocks + b;
      if (dense) {
        a.yf[pos * a.ldy + blk * 32 + lane] = v;
      } else {
        mm::quantize_block32(v, lane, a.hq + pos * a.out + blk * 32, a.hd + pos * nbo + blk,
                             a.hs + pos * nbo + blk);
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 8 * nt + 2 * t + i % 2;
        const int64_t row = row0 + g + 8 * (i / 2);
        if (col < rows && row < a.out) a.y[int64_t{s_pair[col]} * a.ldy + row] = acc[nt][i];
      }
  }
}

// Blocks of 4 warps by default; QWENRT_CUDA_MMQ_WARPS=8 (a measurement knob). One device call,
// 35B-A3B Q4_K_M: pp512 13,486 / 11,678 tok/s, pp4096 19,804 / 18,833, aggregate decode of 128
// sequences 4,435 / 3,957 with 4 / 8 warps.
int mmq_warps() {
  static const int w = [] {
    const char* v = std::getenv("QWENRT_CUDA_MMQ_WARPS");
    return v != nullptr && std::string(v) == "8" ? 8 : 4;
  }();
  return w;
}

bool type_fits(const Matrix& w) {
  if (!mm::mmaq::has_type(w.dtype, w.q8_superblocks) || w.in % kSuperElems != 0) return false;
  const int64_t need = w.dtype == DType::Q6_K ? 2 : 16;
  return mm::aligned(w.data, need) && w.row_bytes % need == 0 && w.expert_bytes % need == 0;
}

template <class T, int NT, bool kSwiGlu, int W>
void launch_kernel(const MmqArgs& a, dim3 grid, cudaStream_t stream) {
  mmq_kernel<T, NT, kSwiGlu, W><<<grid, W * 32, 0, stream>>>(a);
}

// A launch of tiles x (out / rows a block) blocks of tiles of tile_rows (16, 32 or 64) pairs.
template <bool kSwiGlu>
void launch(const MmqArgs& a, DType dtype, bool q8s, unsigned tiles, int tile_rows,
            cudaStream_t stream) {
  auto go = [&]<int W>() {
    const int64_t per = kSwiGlu ? swiglu_cols<W>() : down_rows<W>();
    const dim3 grid(tiles, static_cast<unsigned>((a.out + per - 1) / per));
    return mm::mmaq::with_type(dtype, q8s, [&]<class T>() {
      switch (tile_rows) {
        case 16:
          launch_kernel<T, 2, kSwiGlu, W>(a, grid, stream);
          break;
        case 32:
          launch_kernel<T, 4, kSwiGlu, W>(a, grid, stream);
          break;
        case 64:
          launch_kernel<T, 8, kSwiGlu, W>(a, grid, stream);
          break;
        default:
          cuda_fail("mmq: tiles of {} rows (16, 32 or 64)", tile_rows);
      }
    });
  };
  const bool launched =
      mmq_warps() == 4 ? go.template operator()<4>() : go.template operator()<8>();
  if (!launched) cuda_fail("mmq: no kernel for {}", dtype_name(dtype));
  QWENRT_CUDA_CHECK_LAUNCH();
}

template <bool kSwiGlu>
void launch_experts(const Matrix& w0, const Matrix* w1, const ExpertOrder& order, int k,
                    mm::Acts acts, int8_t* hq, float* hd, float* hs, float* y,
                    cudaStream_t stream) {
  MmqArgs a{};
  a.w0 = static_cast<const uint8_t*>(w0.data);
  a.w1 = w1 ? static_cast<const uint8_t*>(w1->data) : nullptr;
  a.row_bytes = w0.row_bytes;
  a.expert_bytes = w0.expert_bytes;
  a.out = w0.out;
  a.a = acts;
  a.k = k;
  a.order = order;
  a.hq = hq;
  a.hd = hd;
  a.hs = hs;
  a.y = y;
  a.ldy = w0.out;
  launch<kSwiGlu>(a, w0.dtype, w0.q8_superblocks, static_cast<unsigned>(order.max_tiles),
                  order.tile_rows, stream);
}

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

bool mmq_experts_enabled() {
  const char* v = std::getenv("QWENRT_CUDA_MOE_MMQ");
  return !(v && std::string(v) == "0");
}

bool mmq_experts_fit(const Matrix& gate, const Matrix& up, const Matrix& down) {
  return type_fits(gate) && type_fits(up) && type_fits(down) && gate.dtype == up.dtype &&
         gate.q8_superblocks == up.q8_superblocks && gate.in == up.in && gate.out == up.out &&
         gate.row_bytes == up.row_bytes && gate.expert_bytes == up.expert_bytes &&
         down.in == gate.out && gate.out % swiglu_cols<8>() == 0;
}

int mmq_tile_rows(int64_t n_pairs, int n_expert) {
  // Pairs an expert on average: tiles of 64 waste little from ~40 (a 4,096-token prompt of the
  // 35B-A3B averages 128), smaller ones keep short prompts from multiplying empty rows.
  const int64_t per = n_pairs / std::max(1, n_expert);
  return per >= 40 ? 64 : per >= 20 ? 32 : 16;
}

int64_t mmq_experts_workspace_bytes(int64_t n, int64_t in, int64_t n_pairs, int64_t ff) {
  return align256(mm::quant_act_bytes(n, in)) + align256(n_pairs * ff) +
         2 * align256(n_pairs * (ff / qb::kActBlock) * 4);
}

void mmq_experts(const Matrix& gate, const Matrix& up, const Matrix& down, const ExpertOrder& order,
                 int k, const float* x, int64_t n, float* y_pairs, void* workspace,
                 cudaStream_t stream) {
  if (order.n_pairs == 0) return;
  if (!mmq_experts_fit(gate, up, down)) cuda_fail("mmq experts: shapes or types do not fit");
  if (!mm::aligned(workspace, 256)) cuda_fail("mmq experts: workspace {} not aligned", workspace);
  const int64_t ff = gate.out, n_pairs = order.n_pairs;
  auto* base = static_cast<uint8_t*>(workspace);
  const mm::Acts xa = mm::prepare_acts(x, n, gate.in, true, base, stream);
  base += align256(mm::quant_act_bytes(n, gate.in));
  auto* hq = reinterpret_cast<int8_t*>(base);
  base += align256(n_pairs * ff);
  auto* hd = reinterpret_cast<float*>(base);
  base += align256(n_pairs * (ff / qb::kActBlock) * 4);
  auto* hs = reinterpret_cast<float*>(base);
  launch_experts<true>(gate, &up, order, k, xa, hq, hd, hs, nullptr, stream);
  const mm::Acts ha{hq, hd, nullptr, ff, hs};
  launch_experts<false>(down, nullptr, order, 1, ha, nullptr, nullptr, nullptr, y_pairs, stream);
}

namespace mm {
namespace {

// QWENRT_CUDA_DENSE_MMQ="lo,hi": the dense matmuls of lo..hi rows run here ("0": never). Default
// 33..64, from aggregate decode on an H100 (27B Q4_K_M, 16 steps of 64 / 128 sequences): 1,107 /
// 1,357 tok/s here against 996 / 1,644 with the bf16 cuBLAS GEMM; 35B-A3B at 64 sequences 2,574
// against 2,621 (bench/results/h100-batched-decode-2026-12-06.md). Up to 32 rows the tensor-core
// GEMV is faster still.
std::pair<int64_t, int64_t> dense_range() {
  const char* v = std::getenv("QWENRT_CUDA_DENSE_MMQ");
  if (v == nullptr || *v == '\0') return {33, 64};
  long long lo = 0, hi = 0;
  if (std::sscanf(v, "%lld,%lld", &lo, &hi) != 2 || lo < 1 || hi < lo) return {1, 0};
  return {lo, hi};
}

// Weight rows (SwiGLU: hidden columns) a block of mmq_warps() warps covers.
int64_t block_rows(bool swiglu) {
  const int w = mmq_warps();
  return swiglu ? (w == 8 ? swiglu_cols<8>() : swiglu_cols<4>())
                : (w == 8 ? down_rows<8>() : down_rows<4>());
}

// Rows a tile: the largest of 64 and 32 that still gives two blocks an SM, else 16 (the tiles of
// one run of weight rows then read them from L2, not DRAM). QWENRT_CUDA_DENSE_MMQ_TILE=16|32|64
// fixes it (a measurement knob).
int dense_tile_rows(int64_t n, int64_t out, bool swiglu) {
  static const int fixed = [] {
    const char* v = std::getenv("QWENRT_CUDA_DENSE_MMQ_TILE");
    const int r = v ? std::atoi(v) : 0;
    return r == 16 || r == 32 || r == 64 ? r : 0;
  }();
  if (fixed) return fixed;
  const int64_t per = block_rows(swiglu);
  const int64_t col_blocks = (out + per - 1) / per;
  for (int r : {64, 32}) {
    if ((n + r - 1) / r * col_blocks >= 2 * int64_t{sm_count()}) return r;
  }
  return 16;
}

MmqArgs dense_args(const MatArg& w, const Acts& a, int64_t n) {
  MmqArgs args{};
  args.w0 = w.data;
  args.row_bytes = w.row_bytes;
  args.out = w.out;
  args.a = a;
  args.k = 1;
  args.dense_n = n;
  return args;
}

}  // namespace

bool mmq_dense_rows(int64_t n) {
  static const std::pair<int64_t, int64_t> range = dense_range();
  return n >= range.first && n <= range.second;
}

bool mmq_dense_wide(int64_t n, int64_t out, bool swiglu) {
  const int64_t per = block_rows(swiglu);
  return (n + 15) / 16 * ((out + per - 1) / per) >= int64_t{sm_count()};
}

bool mmq_dense_kind(const Matrix& w) {
  return w.n_expert == 1 && type_fits(w);
}

bool mmq_dense_swiglu_kind(const Matrix& gate, const Matrix& up) {
  return mmq_dense_kind(gate) && mmq_dense_kind(up) && gate.dtype == up.dtype &&
         gate.q8_superblocks == up.q8_superblocks && gate.in == up.in && gate.out == up.out &&
         gate.row_bytes == up.row_bytes && gate.out % swiglu_cols<8>() == 0;
}

void mmq_dense(const MatArg& w, const Acts& a, int64_t n, float* y, int64_t ldy,
               cudaStream_t stream, int tile_rows) {
  if (n <= 0 || w.out <= 0) return;
  MmqArgs args = dense_args(w, a, n);
  args.y = y;
  args.ldy = ldy;
  const int tile = tile_rows ? tile_rows : dense_tile_rows(n, w.out, false);
  launch<false>(args, w.dtype, w.q8s, static_cast<unsigned>((n + tile - 1) / tile), tile, stream);
}

void mmq_dense_swiglu(const MatArg& gate, const MatArg& up, const Acts& a, int64_t n, float* y,
                      cudaStream_t stream, int tile_rows) {
  if (n <= 0 || gate.out <= 0) return;
  MmqArgs args = dense_args(gate, a, n);
  args.w1 = up.data;
  args.yf = y;
  args.ldy = gate.out;
  const int tile = tile_rows ? tile_rows : dense_tile_rows(n, gate.out, true);
  launch<true>(args, gate.dtype, gate.q8s, static_cast<unsigned>((n + tile - 1) / tile), tile,
               stream);
}

}  // namespace mm
}  // namespace qwenrt::ops::cuda
