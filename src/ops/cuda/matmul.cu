// Matmul kernels of the CUDA backend (kernels.h, "Matmul"): y [n, out] = x [n, in] @ W^T for the
// types with kernels, the fused SwiGLU of a dense FFN / shared expert and the routed experts (the
// embedding lookup is embed.cu).
//
// Design (batch-1 decode is a stream over the weights, so everything is a GEMV):
// - Quantised weights: x is quantised to int8 blocks of 32 with an fp32 scale and dotted against
//   the weight blocks with dp4a (quant_blocks.cuh). F32 / F16 / BF16 weights read x in fp32.
// - Each launcher tries, in order: the tensor-core GEMV (gemv_mma.cu; 3..32 rows), the cuBLAS
//   GEMM (gemm.cu; 32+ rows), the resident GEMV (gemv_resident.cu; one row of x, quantised inside
//   the kernel), the staged GEMV (gemv_staged.cu; n <= 8 rows), then the team kernels of this
//   file, which take every case; the activations of all but the resident GEMV are quantised first
//   (act_quant.cu).
// - A team GEMV block is 128 threads split into teams of ts = 16..128 threads, one output row per
// team
//   (rows_per_block = 128 / ts, chosen from the row length so every thread has a few 16-byte
//   units to load); a team's threads take consecutive units of its row, two loads in flight each,
//   then reduce with shuffles (and shared memory across warps). Every activation row of the pass
//   (NR = 1..8, a template argument) is dotted against each unit while it sits in registers, so
//   the weights are read once for the whole batch.
// - n > 8 (prefill): the same kernel over chunks of 8 rows (plus one launch for the n % 8 tail);
//   a block's chunk index varies fastest, so the blocks that read the same weight rows run
//   together and the weights come from DRAM about once (the rest hits L2). Compute-bound on dp4a;
//   a tiled tensor-core GEMM is the known next step.
// - Grid sizes depend only on shapes; expert ids, token ids and routing weights are read on the
//   device, so every launcher is capturable into a CUDA graph.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/dtype.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda {
using namespace mm;
namespace {

constexpr int kThreads = 128;  // threads per GEMV block (4 warps)
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 8;  // activation rows per pass over the weights

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// Float rows are read 16 bytes at a time when every row and x row start 16-byte aligned.
bool float_vec_ok(const Matrix& w, const float* x) {
  const int per_vec = w.dtype == DType::F32 ? 4 : 8;
  return aligned(w.data, 16) && w.row_bytes % 16 == 0 && w.in % per_vec == 0 &&
         (w.n_expert <= 1 || w.expert_bytes % 16 == 0) && aligned(x, 16);
}

// Units of one row a team shares out (the loop trip count the team size is chosen from).
int64_t row_units(const Matrix& w, bool vec) {
  switch (w.dtype) {
    case DType::Q8_0:
      return w.q8_superblocks ? w.in / 32 : w.in / 16;
    case DType::F32:
      return vec ? w.in / 4 : w.in;
    case DType::F16:
    case DType::BF16:
      return vec ? w.in / 8 : w.in;
    default:
      return w.in / 32;  // Q4_K, Q5_K, Q6_K, IQ4_XS: 8 units of 32 per 256; Q4_0: 1 per 32
  }
}

// Threads per output row: enough units per thread to keep two loads in flight, teams as small as
// 16 for short rows (a 512-wide expert down row is 16 Q4_K units).
int team_size(int64_t units) {
  if (units <= 32) return 16;
  if (units <= 96) return 32;
  if (units <= 256) return 64;
  return 128;
}

// Shapes and alignment the kernels rely on, checked once per call on the host.
MatArg mat_arg(const Matrix& w, const float* x, const char* what) {
  if (!has_kernel(w.dtype))
    cuda_fail("{}: no CUDA matmul kernel for {}", what, dtype_name(w.dtype));
  if (w.in <= 0 || w.out <= 0) cuda_fail("{}: empty matrix [{}, {}]", what, w.in, w.out);
  const auto& tr = traits(w.dtype);
  if (w.in % tr.block_elems != 0)
    cuda_fail("{}: in = {} is not a multiple of {}'s block of {}", what, w.in, dtype_name(w.dtype),
              tr.block_elems);
  // Q4_K / Q5_K units are 16-byte loads, IQ4_XS 8-byte, the rest 2-byte (F32 4-byte).
  if (w.q8_superblocks && (w.dtype != DType::Q8_0 || w.in % qb::Q80S::kElems != 0))
    cuda_fail("{}: a {} matrix with in = {} cannot be in Q8_0 superblocks", what,
              dtype_name(w.dtype), w.in);
  const int64_t need = w.dtype == DType::Q4_K || w.dtype == DType::Q5_K || w.q8_superblocks ? 16
                       : w.dtype == DType::IQ4_XS                                           ? 8
                       : w.dtype == DType::F32                                              ? 4
                                                                                            : 2;
  if (!aligned(w.data, need) || w.row_bytes % need != 0 ||
      (w.n_expert > 1 && w.expert_bytes % need != 0))
    cuda_fail("{}: {} rows must be {}-byte aligned (data {}, row_bytes {}, expert_bytes {})", what,
              dtype_name(w.dtype), need, w.data, w.row_bytes, w.expert_bytes);
  const bool vec = !is_quantised(w.dtype) && float_vec_ok(w, x);
  return {.data = static_cast<const uint8_t*>(w.data),
          .row_bytes = w.row_bytes,
          .expert_bytes = w.expert_bytes,
          .out = w.out,
          .n_expert = w.n_expert,
          .dtype = w.dtype,
          .vec = vec,
          .q8s = w.q8_superblocks};
}

// ---- Per-thread partial dot products --------------------------------------------------------
// acc[r] += this thread's share (units lane, lane + ts, ...) of row . activation row r.
template <class T, int NR>
__device__ __forceinline__ void quant_partial(const uint8_t* row, const Acts& a, int lane, int ts,
                                              float (&acc)[NR]) {
  const int64_t units = a.in / T::kElems * T::kUnits;
  for (int64_t u0 = lane; u0 < units; u0 += 2 * ts) {
    // Both units' weight loads are issued before either is used: two loads in flight a thread.
    const int64_t u1 = u0 + ts;
    const bool has1 = u1 < units;
    const int64_t b0 = u0 / T::kUnits, b1 = u1 / T::kUnits;
    const int j0 = int(u0 % T::kUnits), j1 = int(u1 % T::kUnits);
    const typename T::Unit w0 = T::load(row + b0 * T::kBytes, j0);
    const typename T::Unit w1 = has1 ? T::load(row + b1 * T::kBytes, j1) : w0;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const int64_t e0 = r * a.in + b0 * T::kElems;
      acc[r] += T::dot(w0, j0, a.q + e0, a.d + e0 / qb::kActBlock);
    }
    if (has1) {
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const int64_t e1 = r * a.in + b1 * T::kElems;
        acc[r] += T::dot(w1, j1, a.q + e1, a.d + e1 / qb::kActBlock);
      }
    }
  }
}

template <class F, int NR>
__device__ __forceinline__ void float_partial(bool vec, const uint8_t* row, const Acts& a, int lane,
                                              int ts, float (&acc)[NR]) {
  if (vec) {
    const int64_t units = a.in / F::kPerVec;
    for (int64_t u = lane; u < units; u += ts) {
      float w[F::kPerVec];
      F::unpack(qb::load16(row + 16 * u), w);
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float4* xr = reinterpret_cast<const float4*>(a.x + r * a.in + u * F::kPerVec);
#pragma unroll
        for (int v = 0; v < F::kPerVec / 4; ++v) {
          const float4 xv = xr[v];
          acc[r] +=
              w[4 * v] * xv.x + w[4 * v + 1] * xv.y + w[4 * v + 2] * xv.z + w[4 * v + 3] * xv.w;
        }
      }
    }
  } else {
    for (int64_t i = lane; i < a.in; i += ts) {
      const float w = F::elem(row, i);
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] += w * a.x[r * a.in + i];
    }
  }
}

// The type is a runtime value uniform over the block (one branch per row), so one kernel serves
// a group of projections of mixed types.
template <int NR>
__device__ __forceinline__ void row_partial(const MatArg& m, const uint8_t* row, const Acts& a,
                                            int lane, int ts, float (&acc)[NR]) {
  switch (m.dtype) {
    case DType::Q4_K:
      quant_partial<qb::Q4K, NR>(row, a, lane, ts, acc);
      break;
    case DType::Q5_K:
      quant_partial<qb::Q5K, NR>(row, a, lane, ts, acc);
      break;
    case DType::Q6_K:
      quant_partial<qb::Q6K, NR>(row, a, lane, ts, acc);
      break;
    case DType::Q8_0:
      if (m.q8s) {
        quant_partial<qb::Q80S, NR>(row, a, lane, ts, acc);
      } else {
        quant_partial<qb::Q80, NR>(row, a, lane, ts, acc);
      }
      break;
    case DType::Q4_0:
      quant_partial<qb::Q40, NR>(row, a, lane, ts, acc);
      break;
    case DType::IQ4_XS:
      quant_partial<qb::IQ4XS, NR>(row, a, lane, ts, acc);
      break;
    case DType::F32:
      float_partial<F32W, NR>(m.vec, row, a, lane, ts, acc);
      break;
    case DType::F16:
      float_partial<F16W, NR>(m.vec, row, a, lane, ts, acc);
      break;
    case DType::BF16:
      float_partial<BF16W, NR>(m.vec, row, a, lane, ts, acc);
      break;
    default:
      break;  // has_kernel() was checked on the host
  }
}

// Sums v over each team of ts threads (aligned runs of threads, ts in 16..128); the team's first
// thread ends with the sums. Every thread of the block must call it (it may __syncthreads).
// The order of additions is fixed, so results are deterministic.
template <int NV>
__device__ __forceinline__ void team_sum(float (&v)[NV], int ts, float (&smem)[kWarps][NV]) {
  const int width = ts < 32 ? ts : 32;
  for (int off = width / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
  }
  if (ts > 32) {  // ts is uniform over the block, so every thread takes this branch or none
    const int warp = threadIdx.x / 32;
    __syncthreads();  // smem may still be read by a previous call's team leaders
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int i = 0; i < NV; ++i) smem[warp][i] = v[i];
    }
    __syncthreads();
    if (threadIdx.x % ts == 0) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        float s = 0.0f;
        for (int w = 0; w < ts / 32; ++w) s += smem[warp + w][i];
        v[i] = s;
      }
    }
  }
}

// ---- GEMV over a group of matrices --------------------------------------------------------------
template <int NR>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ Group g, Acts a) {
  pdl_launch_dependents();
  __shared__ float smem[kWarps][NR];
  const int64_t chunk = blockIdx.x % g.n_chunks, row_block = blockIdx.x / g.n_chunks;
  int j = 0;
  while (j + 1 < g.n_jobs && row_block >= g.job[j + 1].first_block) ++j;
  const Job& job = g.job[j];
  const int team = threadIdx.x / g.ts, lane = threadIdx.x % g.ts;
  const int64_t row = (row_block - job.first_block) * g.rows_per_block + team;
  const Acts ac = shift_rows(a, chunk * NR);
  float acc[NR] = {};
  if (row < job.m.out)
    row_partial<NR>(job.m, job.m.data + row * job.m.row_bytes, ac, lane, g.ts, acc);
  team_sum<NR>(acc, g.ts, smem);
  if (lane == 0 && row < job.m.out) {
#pragma unroll
    for (int r = 0; r < NR; ++r) job.y[(chunk * NR + r) * job.y_stride + row] = acc[r];
  }
}

// y = silu(x @ gate^T) * (x @ up^T): both rows of a team's output row in one pass.
template <int NR>
__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(MatArg gate, MatArg up, float* y, int ts, int rows_per_block, int64_t n_chunks,
                  Acts a) {
  pdl_launch_dependents();
  __shared__ float smem[kWarps][2 * NR];
  const int64_t chunk = blockIdx.x % n_chunks, row_block = blockIdx.x / n_chunks;
  const int team = threadIdx.x / ts, lane = threadIdx.x % ts;
  const int64_t row = row_block * rows_per_block + team;
  const Acts ac = shift_rows(a, chunk * NR);
  float g[NR] = {}, u[NR] = {};
  if (row < gate.out) {
    row_partial<NR>(gate, gate.data + row * gate.row_bytes, ac, lane, ts, g);
    row_partial<NR>(up, up.data + row * up.row_bytes, ac, lane, ts, u);
  }
  float v[2 * NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    v[r] = g[r];
    v[NR + r] = u[r];
  }
  team_sum<2 * NR>(v, ts, smem);
  if (lane == 0 && row < gate.out) {
#pragma unroll
    for (int r = 0; r < NR; ++r) y[(chunk * NR + r) * gate.out + row] = silu(v[r]) * v[NR + r];
  }
}

// Routed experts' gate/up: pair p = (row p / k, choice p % k) uses expert ids[p]; blockIdx.y
// walks the pairs (stride gridDim.y), blockIdx.x the rows of ff. An id outside [0, n_expert)
// writes NaN (moe_route never makes one; this keeps a bad id visible instead of reading past
// the tensor).
__global__ void __launch_bounds__(kThreads)
    experts_swiglu_kernel(MatArg gate, MatArg up, const int32_t* __restrict__ ids, int k,
                          float* __restrict__ y, int64_t n_pairs, int ts, int rows_per_block,
                          Acts a) {
  pdl_launch_dependents();
  __shared__ float smem[kWarps][2];
  const int team = threadIdx.x / ts, lane = threadIdx.x % ts;
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + team;
  const int64_t ff = gate.out;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    const int32_t e = ids[p];
    const bool ok = e >= 0 && e < gate.n_expert;
    const Acts ac = shift_rows(a, p / k);
    float g[1] = {0.0f}, u[1] = {0.0f};
    if (row < ff && ok) {
      row_partial<1>(gate, gate.data + e * gate.expert_bytes + row * gate.row_bytes, ac, lane, ts,
                     g);
      row_partial<1>(up, up.data + e * up.expert_bytes + row * up.row_bytes, ac, lane, ts, u);
    }
    float v[2] = {g[0], u[0]};
    team_sum<2>(v, ts, smem);
    if (lane == 0 && row < ff)
      y[p * ff + row] = ok ? silu(v[0]) * v[1] : __int_as_float(0x7fc00000);
  }
}

// Routed experts' down and the weighted sum over the k choices: a team owns one output row of
// one token row and loops over the choices, so the sum needs no atomics and is deterministic.
__global__ void __launch_bounds__(kThreads)
    experts_down_kernel(MatArg down, const int32_t* __restrict__ ids,
                        const float* __restrict__ weights, int k, float* __restrict__ y, int64_t n,
                        int ts, int rows_per_block, Acts a) {
  pdl_launch_dependents();
  __shared__ float smem[kWarps][1];
  const int team = threadIdx.x / ts, lane = threadIdx.x % ts;
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + team;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    float acc[1] = {0.0f};
    bool ok = true;
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      const int32_t e = ids[p];
      if (e < 0 || e >= down.n_expert) {
        ok = false;
        continue;
      }
      if (row < down.out) {
        float part[1] = {0.0f};
        row_partial<1>(down, down.data + e * down.expert_bytes + row * down.row_bytes,
                       shift_rows(a, p), lane, ts, part);
        acc[0] += weights[p] * part[0];
      }
    }
    team_sum<1>(acc, ts, smem);
    if (lane == 0 && row < down.out)
      y[t * down.out + row] = ok ? acc[0] : __int_as_float(0x7fc00000);
  }
}

// Launches gemv_kernel<NR> for a runtime nr in 1..8.
void launch_gemv(int nr, const Group& g, int64_t grid, const Acts& a, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(grid);
  switch (nr) {
#define QWENRT_GEMV_CASE(R)                                \
  case R:                                                  \
    gemv_kernel<R><<<blocks, kThreads, 0, stream>>>(g, a); \
    break;
    QWENRT_GEMV_CASE(1)
    QWENRT_GEMV_CASE(2)
    QWENRT_GEMV_CASE(3)
    QWENRT_GEMV_CASE(4)
    QWENRT_GEMV_CASE(5)
    QWENRT_GEMV_CASE(6)
    QWENRT_GEMV_CASE(7)
    QWENRT_GEMV_CASE(8)
#undef QWENRT_GEMV_CASE
    default:
      cuda_fail("launch_gemv: {} rows per pass", nr);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(int nr, const MatArg& gate, const MatArg& up, float* y, int ts, int rpb,
                   int64_t n_chunks, int64_t grid, const Acts& a, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(grid);
  switch (nr) {
#define QWENRT_SWIGLU_CASE(R)                                                             \
  case R:                                                                                 \
    swiglu_kernel<R><<<blocks, kThreads, 0, stream>>>(gate, up, y, ts, rpb, n_chunks, a); \
    break;
    QWENRT_SWIGLU_CASE(1)
    QWENRT_SWIGLU_CASE(2)
    QWENRT_SWIGLU_CASE(3)
    QWENRT_SWIGLU_CASE(4)
    QWENRT_SWIGLU_CASE(5)
    QWENRT_SWIGLU_CASE(6)
    QWENRT_SWIGLU_CASE(7)
    QWENRT_SWIGLU_CASE(8)
#undef QWENRT_SWIGLU_CASE
    default:
      cuda_fail("launch_swiglu: {} rows per pass", nr);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

// Q8_0 superblocks: word w of a 272-byte superblock is the scale of block w (w < 8), else two
// quant bytes of block (2 (w - 8)) / 32.
__global__ void repack_q8_0_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst,
                                   int64_t n_words) {
  pdl_launch_dependents();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_words) return;
  constexpr int kWords = qb::Q80S::kBytes / 2;  // 136
  const int64_t sb = i / kWords;
  const int w = int(i % kWords);
  int from;  // word index in the GGUF blocks of this superblock (17 words a block)
  if (w < 8) {
    from = 17 * w;
  } else {
    const int o = 2 * (w - 8);  // byte offset in the 256 quant bytes
    from = 17 * (o / 32) + 1 + (o % 32) / 2;
  }
  dst[i] = src[sb * kWords + from];
}

// Runs `launch(nr, n_chunks, row0)` over n rows: full passes of 8 rows in one launch, then the
// n % 8 tail (row0 is where the tail's rows start).
template <class Launch>
void over_row_chunks(int64_t n, Launch&& launch) {
  const int64_t full = n / kMaxRows, tail = n % kMaxRows;
  if (full > 0) launch(kMaxRows, full, int64_t{0});
  if (tail > 0) launch(static_cast<int>(tail), int64_t{1}, full * kMaxRows);
}

void run_group(const Projection* p, int n_p, const float* x, int64_t n, void* workspace,
               cudaStream_t stream) {
  if (n <= 0) return;
  if (n_p < 1 || n_p > kMaxJobs) cuda_fail("matmul_group: {} projections (1..{})", n_p, kMaxJobs);
  const int64_t in = p[0].w.in;
  for (int i = 1; i < n_p; ++i) {
    if (p[i].w.in != in)
      cuda_fail("matmul_group: projection {} has in = {}, projection 0 has {}", i, p[i].w.in, in);
  }
  const auto mmq_takes = [n](const Matrix& w) {
    return mmq_dense_kind(w) && mmq_dense_wide(n, w.out, false);
  };
  if (mmq_dense_rows(n) &&
      std::any_of(p, p + n_p, [&](const Projection& q) { return mmq_takes(q.w); })) {
    // The int8 GEMM for the matrices it takes; the rest (float or narrow ones) as a group of
    // their own after it (the stream orders their use of the workspace after its reads).
    Projection rest[kMaxJobs];
    int n_rest = 0;
    const Acts a = prepare_acts(x, n, in, true, workspace, stream);
    for (int i = 0; i < n_p; ++i) {
      if (mmq_takes(p[i].w)) {
        mmq_dense(mat_arg(p[i].w, x, "matmul"), a, n, p[i].y, p[i].w.out, stream);
      } else {
        rest[n_rest++] = p[i];
      }
    }
    if (n_rest > 0) run_group(rest, n_rest, x, n, workspace, stream);
    return;
  }
  bool any_quant = false;
  int64_t max_units = 0;
  Group g{};
  g.n_jobs = n_p;
  for (int i = 0; i < n_p; ++i) {
    g.job[i].m = mat_arg(p[i].w, x, "matmul");
    g.job[i].y = p[i].y;
    g.job[i].y_stride = p[i].w.out;
    any_quant = any_quant || is_quantised(p[i].w.dtype);
    max_units = std::max(max_units, row_units(p[i].w, g.job[i].m.vec));
  }
  g.ts = team_size(max_units);
  g.rows_per_block = kThreads / g.ts;
  int64_t blocks = 0;
  for (int i = 0; i < n_p; ++i) {
    g.job[i].first_block = blocks;
    blocks += (p[i].w.out + g.rows_per_block - 1) / g.rows_per_block;
  }
  if (mma_rows(n) && std::all_of(p, p + n_p, [](const Projection& q) { return mma_kind(q.w); })) {
    const bool tiles = std::any_of(p, p + n_p, [](const Projection& q) { return mma_tiled(q.w); });
    const Acts a = prepare_acts(x, n, in, true, workspace, stream, tiles);
    if (mma_group(g, n, a, stream)) return;
  }
  if (std::all_of(p, p + n_p, [&](const Projection& q) { return gemm_rows(q.w, n); })) {
    const void* xb = any_quant ? gemm_prepare_x(x, n, in, workspace, stream) : nullptr;
    for (int i = 0; i < n_p; ++i)
      gemm(p[i].w, is_quantised(p[i].w.dtype) ? xb : x, n, p[i].y, p[i].w.out, workspace, stream);
    return;
  }
  if (n == 1 && any_quant && resident_group(g, x, in, workspace, stream)) return;
  const Acts a = prepare_acts(x, n, in, any_quant, workspace, stream);
  if (any_quant && staged_group(g, n, a, stream)) return;
  over_row_chunks(n, [&](int nr, int64_t n_chunks, int64_t row0) {
    Group gc = g;
    gc.n_chunks = n_chunks;
    for (int i = 0; i < n_p; ++i) gc.job[i].y += row0 * gc.job[i].y_stride;
    launch_gemv(nr, gc, blocks * n_chunks, shift_rows(a, row0), stream);
  });
}

}  // namespace

namespace mm {

bool is_quantised(DType t) {
  switch (t) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

}  // namespace mm

bool q8_0_superblocks_fit(int64_t in) {
  return in > 0 && in % qb::Q80S::kElems == 0;
}

void repack_q8_0_superblocks(const void* src, void* dst, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0 || bytes % qb::Q80S::kBytes != 0)
    cuda_fail("repack_q8_0_superblocks: {} bytes is not whole superblocks of {}", bytes,
              qb::Q80S::kBytes);
  if (!aligned(src, 16) || !aligned(dst, 16))
    cuda_fail("repack_q8_0_superblocks: unaligned src {} or dst {}", src, dst);
  const int64_t n_words = bytes / 2;
  if (n_words == 0) return;
  constexpr int kThreadsPerBlock = 256;
  repack_q8_0_kernel<<<static_cast<unsigned>((n_words + kThreadsPerBlock - 1) / kThreadsPerBlock),
                       kThreadsPerBlock, 0, stream>>>(static_cast<const uint16_t*>(src),
                                                      static_cast<uint16_t*>(dst), n_words);
  QWENRT_CUDA_CHECK_LAUNCH();
}

bool has_kernel(DType type) {
  return is_quantised(type) || type == DType::F32 || type == DType::F16 || type == DType::BF16;
}

int64_t matmul_workspace_bytes(const Matrix& w, int64_t n) {
  const int64_t quant = is_quantised(w.dtype) ? quant_act_bytes(n, w.in) : 0;
  if (gemm_rows(w, n)) return std::max(quant, gemm_workspace_bytes(w, n));
  return quant;
}

int64_t matmul_swiglu_workspace_bytes(const Matrix& gate, int64_t n) {
  const int64_t quant = matmul_workspace_bytes(gate, n);
  if (gemm_rows(gate, n))
    return std::max(quant, gemm_workspace_bytes(gate, n) + align256(n * gate.out * 4));
  return quant;
}

void matmul(const Matrix& w, const float* x, float* y, int64_t n, void* workspace,
            cudaStream_t stream) {
  const Projection p{.w = w, .y = y};
  run_group(&p, 1, x, n, workspace, stream);
}

int64_t matmul_group_workspace_bytes(const Projection* p, int n_p, int64_t n) {
  int64_t bytes = 0;
  for (int i = 0; i < n_p; ++i) bytes = std::max(bytes, matmul_workspace_bytes(p[i].w, n));
  return bytes;
}

void matmul_group(const Projection* p, int n_p, const float* x, int64_t n, void* workspace,
                  cudaStream_t stream) {
  run_group(p, n_p, x, n, workspace, stream);
}

void matmul_swiglu(const Matrix& gate, const Matrix& up, const float* x, float* y, int64_t n,
                   void* workspace, cudaStream_t stream) {
  if (n <= 0) return;
  if (gate.in != up.in || gate.out != up.out)
    cuda_fail("matmul_swiglu: gate [{}, {}] and up [{}, {}] differ", gate.in, gate.out, up.in,
              up.out);
  const MatArg g = mat_arg(gate, x, "matmul_swiglu gate"), u = mat_arg(up, x, "matmul_swiglu up");
  const int ts = team_size(std::max(row_units(gate, g.vec), row_units(up, u.vec)));
  const int rpb = kThreads / ts;
  const int64_t row_blocks = (gate.out + rpb - 1) / rpb;
  if (mmq_dense_rows(n) && mmq_dense_swiglu_kind(gate, up) && mmq_dense_wide(n, gate.out, true)) {
    const Acts a = prepare_acts(x, n, gate.in, true, workspace, stream);
    mmq_dense_swiglu(g, u, a, n, y, stream);
    return;
  }
  if (mma_rows(n) && mma_kind(gate) && mma_kind(up)) {
    const Acts a = prepare_acts(x, n, gate.in, true, workspace, stream, mma_tiled(gate));
    if (mma_swiglu(g, u, y, n, a, stream)) return;
  }
  if (gemm_rows(gate, n) && gemm_rows(up, n) &&
      is_quantised(gate.dtype) == is_quantised(up.dtype)) {
    // gate into y, up into the workspace after the GEMM's own, then y = silu(y) * up.
    const bool quant = is_quantised(gate.dtype) || is_quantised(up.dtype);
    const void* xb = quant ? gemm_prepare_x(x, n, gate.in, workspace, stream) : nullptr;
    auto* up_y = reinterpret_cast<float*>(
        static_cast<uint8_t*>(workspace) +
        std::max(gemm_workspace_bytes(gate, n), gemm_workspace_bytes(up, n)));
    gemm(gate, is_quantised(gate.dtype) ? xb : x, n, y, gate.out, workspace, stream);
    gemm(up, is_quantised(up.dtype) ? xb : x, n, up_y, up.out, workspace, stream);
    silu_mul(y, up_y, y, n * gate.out, stream);
    return;
  }
  if (n == 1 && resident_swiglu(g, u, x, gate.in, y, workspace, stream)) return;
  const Acts a = prepare_acts(x, n, gate.in, is_quantised(gate.dtype) || is_quantised(up.dtype),
                              workspace, stream);
  if (is_quantised(gate.dtype) && staged_swiglu(g, u, y, n, a, stream)) return;
  over_row_chunks(n, [&](int nr, int64_t n_chunks, int64_t row0) {
    launch_swiglu(nr, g, u, y + row0 * gate.out, ts, rpb, n_chunks, row_blocks * n_chunks,
                  shift_rows(a, row0), stream);
  });
}

bool matmul_mmq(const Matrix& w, const float* x, float* y, int64_t n, void* workspace,
                int tile_rows, cudaStream_t stream) {
  if (!mmq_dense_kind(w)) return false;
  const Acts a = prepare_acts(x, n, w.in, true, workspace, stream);
  mmq_dense(mat_arg(w, x, "matmul_mmq"), a, n, y, w.out, stream, tile_rows);
  return true;
}

bool matmul_swiglu_mmq(const Matrix& gate, const Matrix& up, const float* x, float* y, int64_t n,
                       void* workspace, int tile_rows, cudaStream_t stream) {
  if (!mmq_dense_swiglu_kind(gate, up)) return false;
  const Acts a = prepare_acts(x, n, gate.in, true, workspace, stream);
  mmq_dense_swiglu(mat_arg(gate, x, "matmul_swiglu_mmq gate"),
                   mat_arg(up, x, "matmul_swiglu_mmq up"), a, n, y, stream, tile_rows);
  return true;
}

void experts_swiglu(const Matrix& gate, const Matrix& up, const int32_t* ids, int k, const float* x,
                    float* y, int64_t n, void* workspace, cudaStream_t stream, int64_t step_rows) {
  if (n <= 0) return;
  if (gate.in != up.in || gate.out != up.out || gate.n_expert != up.n_expert)
    cuda_fail("experts_swiglu: gate [{}, {}, {}] and up [{}, {}, {}] differ", gate.in, gate.out,
              gate.n_expert, up.in, up.out, up.n_expert);
  if (k < 1) cuda_fail("experts_swiglu: k = {}", k);
  const MatArg g = mat_arg(gate, x, "experts_swiglu gate");
  const MatArg u = mat_arg(up, x, "experts_swiglu up");
  const int ts = team_size(std::max(row_units(gate, g.vec), row_units(up, u.vec)));
  const int rpb = kThreads / ts;
  const int64_t n_pairs = n * k;
  if ((step_rows > 0 ? step_rows : n) == 1 &&
      resident_experts_swiglu(g, u, ids, k, x, gate.in, y, workspace, stream))
    return;
  const Acts a = prepare_acts(x, n, gate.in, is_quantised(gate.dtype) || is_quantised(up.dtype),
                              workspace, stream);
  if (is_quantised(gate.dtype) && staged_experts_swiglu(g, u, ids, k, y, n_pairs, a, stream))
    return;
  const dim3 grid(static_cast<unsigned>((gate.out + rpb - 1) / rpb),
                  static_cast<unsigned>(std::min<int64_t>(n_pairs, kMaxGridY)));
  experts_swiglu_kernel<<<grid, kThreads, 0, stream>>>(g, u, ids, k, y, n_pairs, ts, rpb, a);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void experts_down(const Matrix& down, const int32_t* ids, const float* weights, int k,
                  const float* x, float* y, int64_t n, void* workspace, cudaStream_t stream) {
  if (n <= 0) return;
  if (k < 1) cuda_fail("experts_down: k = {}", k);
  const MatArg d = mat_arg(down, x, "experts_down");
  const int ts = team_size(row_units(down, d.vec));
  const int rpb = kThreads / ts;
  const Acts a = prepare_acts(x, n * k, down.in, is_quantised(down.dtype), workspace, stream);
  if (is_quantised(down.dtype) && staged_experts_down(d, ids, weights, k, y, n, a, stream)) return;
  const dim3 grid(static_cast<unsigned>((down.out + rpb - 1) / rpb),
                  static_cast<unsigned>(std::min<int64_t>(n, kMaxGridY)));
  experts_down_kernel<<<grid, kThreads, 0, stream>>>(d, ids, weights, k, y, n, ts, rpb, a);
  QWENRT_CUDA_CHECK_LAUNCH();
}

// Pairs (rows x k) up to which experts_down_pairs tries the resident kernel.
constexpr int64_t kResidentPairsMax = 128;

bool experts_down_pairs(const Matrix& down, const int32_t* ids, int k, const float* x,
                        float* y_pairs, int64_t n, void* workspace, cudaStream_t stream,
                        int64_t step_rows) {
  if (n <= 0) return true;
  if (!is_quantised(down.dtype)) return false;
  const MatArg d = mat_arg(down, x, "experts_down_pairs");
  // A decode step's few pairs: the resident kernel (no quantisation launch; ncu on the 35B-A3B's
  // Q4_K down, one row: 9.5 us staged plus 2.2 us quantising).
  if ((step_rows > 0 ? step_rows : n) * k <= kResidentPairsMax &&
      resident_experts_down_pairs(d, ids, x, down.in, n * k, y_pairs, stream))
    return true;
  if (staging_off() || staged_vec_of(d) < 4) return false;
  const Acts a = prepare_acts(x, n * k, down.in, true, workspace, stream);
  if (!staged_experts_down_pairs(d, ids, y_pairs, n * k, a, stream)) {
    cuda_fail("experts_down_pairs: no staged kernel for {}", dtype_name(down.dtype));
  }
  return true;
}

bool experts_down_combine(const Matrix& down, const int32_t* ids, const float* weights, int k,
                          const float* x, const float* shared, const float* shared_scale, float* y,
                          int64_t n, cudaStream_t stream, int64_t step_rows) {
  if (n <= 0) return true;
  if (!is_quantised(down.dtype) || (step_rows > 0 ? step_rows : n) * k > kResidentPairsMax)
    return false;
  const MatArg d = mat_arg(down, x, "experts_down_combine");
  return resident_experts_down_combine(d, ids, weights, k, x, down.in, shared, shared_scale, y, n,
                                       stream);
}

bool moe_row(const MoeRow& row, bool launch, cudaStream_t stream, const NormRouteArgs* route) {
  for (const Matrix* w :
       {&row.gate, &row.up, &row.down, &row.shared_gate, &row.shared_up, &row.shared_down}) {
    if (!is_quantised(w->dtype) || !has_kernel(w->dtype)) return false;
  }
  const MoeRowArgs a{.gate = mat_arg(row.gate, row.h, "moe_row"),
                     .up = mat_arg(row.up, row.h, "moe_row"),
                     .down = mat_arg(row.down, row.mid, "moe_row"),
                     .shared_gate = mat_arg(row.shared_gate, row.h, "moe_row"),
                     .shared_up = mat_arg(row.shared_up, row.h, "moe_row"),
                     .shared_down = mat_arg(row.shared_down, row.shared_mid, "moe_row"),
                     .ids = row.ids,
                     .weights = row.weights,
                     .k = row.k,
                     .h = row.h,
                     .dim = row.down.out,
                     .ff = row.gate.out,
                     .shared_ff = row.shared_gate.out,
                     .mid = row.mid,
                     .shared_mid = row.shared_mid,
                     .shared_scale = row.shared_scale,
                     .out = row.out};
  if (row.gate.in != a.dim || row.shared_gate.in != a.dim || row.down.in != a.ff ||
      row.shared_down.in != a.shared_ff)
    return false;
  return route ? resident_moe_fused(a, *route, launch, stream)
               : resident_moe_row(a, launch, stream);
}

}  // namespace qwenrt::ops::cuda
