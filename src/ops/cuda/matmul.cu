// Matmul kernels of the CUDA backend (kernels.h, "Matmul"): y [n, out] = x [n, in] @ W^T for the
// types with kernels, the fused SwiGLU of a dense FFN / shared expert, the routed experts, and the
// embedding lookup.
//
// Design (batch-1 decode is a stream over the weights, so everything is a GEMV):
// - Quantised weights: x is quantised once per input to int8 blocks of 32 with an fp32 scale
//   (quantize_q8_kernel, its own launch) and dotted against the weight blocks with dp4a
//   (quant_blocks.cuh). F32 / F16 / BF16 weights read x in fp32.
// - A GEMV block is 128 threads split into teams of ts = 16..128 threads, one output row per team
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
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kThreads = 128;  // threads per GEMV block (4 warps)
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 8;  // activation rows per pass over the weights
constexpr int kMaxJobs = 8;  // matrices of one matmul_group launch
constexpr int kMaxGridY = 65535;

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

// Call errors go through cuda_fail (check.h: .cu files cannot use fmt), with the message built
// here: each "{}" of `format` becomes the next argument.
std::string to_text(std::string_view s) {
  return std::string(s);
}
std::string to_text(const char* s) {
  return s;
}
std::string to_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
template <class T>
requires std::is_integral_v<T> std::string to_text(T v) {
  return std::to_string(v);
}
template <class... Args>
[[noreturn]] void bad_call(const char* format, const Args&... args) {
  const std::vector<std::string> parts{to_text(args)...};
  std::string message;
  size_t next = 0;
  for (const char* c = format; *c; ++c) {
    if (c[0] == '{' && c[1] == '}' && next < parts.size()) {
      message += parts[next++];
      ++c;
    } else {
      message += *c;
    }
  }
  cuda_fail(message);
}

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

bool aligned(const void* p, int64_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

// ---- Float weights ----------------------------------------------------------------------------
// Element access for F32 / F16 / BF16 rows: `elem` at any alignment the type allows, `unpack` of
// one 16-byte vector (kPerVec elements) when the rows are 16-byte aligned.
struct F32W {
  static constexpr int kPerVec = 4;
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return __ldg(reinterpret_cast<const float*>(row) + i);
  }
  static __device__ __forceinline__ void unpack(const int4& v, float (&f)[kPerVec]) {
    f[0] = __int_as_float(v.x);
    f[1] = __int_as_float(v.y);
    f[2] = __int_as_float(v.z);
    f[3] = __int_as_float(v.w);
  }
};
struct F16W {
  static constexpr int kPerVec = 8;
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return qb::half_bits_to_float(qb::load2(row + 2 * i));
  }
  static __device__ __forceinline__ void unpack(const int4& v, float (&f)[kPerVec]) {
    const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = qb::half_bits_to_float(w[i] & 0xffff);
      f[2 * i + 1] = qb::half_bits_to_float(w[i] >> 16);
    }
  }
};
struct BF16W {
  static constexpr int kPerVec = 8;
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return qb::bf16_bits_to_float(qb::load2(row + 2 * i));
  }
  static __device__ __forceinline__ void unpack(const int4& v, float (&f)[kPerVec]) {
    const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

// ---- What the kernels read ----------------------------------------------------------------------
// The activations of a pass: row r's int8 values at q + r * in, scales at d + r * in / 32, and the
// fp32 row at x + r * in (float weights use x; quantised ones q and d).
struct Acts {
  const int8_t* q;
  const float* d;
  const float* x;
  int64_t in;
};
__host__ __device__ inline Acts shift_rows(Acts a, int64_t rows) {
  a.q = a.q ? a.q + rows * a.in : nullptr;
  a.d = a.d ? a.d + rows * (a.in / qb::kActBlock) : nullptr;
  a.x = a.x ? a.x + rows * a.in : nullptr;
  return a;
}

// A weight matrix as a kernel reads it; vec: float rows may be read 16 bytes at a time.
struct MatArg {
  const uint8_t* data;
  int64_t row_bytes, expert_bytes, out, n_expert;
  DType dtype;
  bool vec;
  bool q8s;  // Q8_0 in superblocks (qb::Q80S)
};

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
  if (!has_kernel(w.dtype)) bad_call("{}: no CUDA matmul kernel for {}", what, dtype_name(w.dtype));
  if (w.in <= 0 || w.out <= 0) bad_call("{}: empty matrix [{}, {}]", what, w.in, w.out);
  const auto& tr = traits(w.dtype);
  if (w.in % tr.block_elems != 0)
    bad_call("{}: in = {} is not a multiple of {}'s block of {}", what, w.in, dtype_name(w.dtype),
             tr.block_elems);
  // Q4_K / Q5_K units are 16-byte loads, IQ4_XS 8-byte, the rest 2-byte (F32 4-byte).
  if (w.q8_superblocks && (w.dtype != DType::Q8_0 || w.in % qb::Q80S::kElems != 0))
    bad_call("{}: a {} matrix with in = {} cannot be in Q8_0 superblocks", what,
             dtype_name(w.dtype), w.in);
  const int64_t need = w.dtype == DType::Q4_K || w.dtype == DType::Q5_K || w.q8_superblocks ? 16
                       : w.dtype == DType::IQ4_XS                                           ? 8
                       : w.dtype == DType::F32                                              ? 4
                                                                                            : 2;
  if (!aligned(w.data, need) || w.row_bytes % need != 0 ||
      (w.n_expert > 1 && w.expert_bytes % need != 0))
    bad_call("{}: {} rows must be {}-byte aligned (data {}, row_bytes {}, expert_bytes {})", what,
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

__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}

// ---- Activation quantisation ----------------------------------------------------------------
// One warp per block of 32: d = max|x| / 127, q = round(x / d). n_blocks = n * in / 32 (rows are
// contiguous and in is a multiple of 32, so a flat index is row-major). A NaN input gives a NaN
// scale, so it reaches the output as the reference would.
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_blocks,
                                   int8_t* __restrict__ q, float* __restrict__ d) {
  pdl_launch_dependents();
  const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= n_blocks) return;  // uniform over the warp
  const float v = x[blk * 32 + lane];
  float amax = fabsf(v);
  for (int off = 16; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const bool bad = __any_sync(0xffffffffu, isnan(v));
  const float scale = bad ? __int_as_float(0x7fc00000) : amax / 127.0f;
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  q[blk * 32 + lane] = static_cast<int8_t>(__float2int_rn(v * inv));
  if (lane == 0) d[blk] = scale;
}

// The quantised activations' place in the workspace: q [rows, in], then d [rows, in / 32].
struct QuantAct {
  int8_t* q;
  float* d;
};
int64_t quant_act_bytes(int64_t rows, int64_t in) {
  return align256(rows * in) + align256(rows * in / qb::kActBlock * 4);
}
QuantAct quant_act_at(void* workspace, int64_t rows, int64_t in) {
  if (!aligned(workspace, 16)) bad_call("matmul workspace {} is not 16-byte aligned", workspace);
  auto* base = static_cast<int8_t*>(workspace);
  return {base, reinterpret_cast<float*>(base + align256(rows * in))};
}

// Quantises x [rows, in] into the workspace (when `needed`) and returns the activations a kernel
// reads.
Acts prepare_acts(const float* x, int64_t rows, int64_t in, bool needed, void* workspace,
                  cudaStream_t stream) {
  Acts a{nullptr, nullptr, x, in};
  if (!needed || rows == 0) return a;
  if (in % qb::kActBlock != 0) bad_call("matmul: in = {} is not a multiple of 32", in);
  if (workspace == nullptr) bad_call("matmul: quantised weights need a workspace");
  const QuantAct qa = quant_act_at(workspace, rows, in);
  const int64_t n_blocks = rows * in / qb::kActBlock;
  constexpr int kBlocksPerCta = 256 / 32;
  const int64_t grid = (n_blocks + kBlocksPerCta - 1) / kBlocksPerCta;
  quantize_q8_kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(x, n_blocks, qa.q, qa.d);
  QWENRT_CUDA_CHECK_LAUNCH();
  a.q = qa.q;
  a.d = qa.d;
  return a;
}

// ---- GEMV over a group of matrices --------------------------------------------------------------
struct Job {
  MatArg m;
  float* y;             // [rows, y_stride]
  int64_t y_stride;     // = m.out
  int64_t first_block;  // the job's first row block
};
struct Group {
  Job job[kMaxJobs];
  int n_jobs;
  int ts, rows_per_block;
  int64_t n_chunks;  // passes of NR activation rows; block b is chunk b % n_chunks
};

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
      bad_call("launch_gemv: {} rows per pass", nr);
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
      bad_call("launch_swiglu: {} rows per pass", nr);
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

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

template <int NV>
__device__ __forceinline__ void warp_sum(float (&v)[NV]) {
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
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

// Launches one of the staged kernels for nr = 1..8 activation rows.
template <int NR, class Launch>
void for_nr(int nr, Launch&& launch) {
  if constexpr (NR <= 8) {
    if (nr == NR) return launch.template operator()<NR>();
    for_nr<NR + 1>(nr, launch);
  }
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

// ---- Resident GEMV: the batch-1 decode path (n = 1) ------------------------------------------
// For the types whose 256-element blocks split into 8 units of 32 that load with 16- or 8-byte
// loads (Q4_K, Q5_K, IQ4_XS, Q8_0 in superblocks). The staged kernel above re-reads the
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
constexpr int kResRowWarps = 8;    // warps a block aims for (S x R)
constexpr int kResMaxSlices = 18;  // rows up to 18432 wide (the 27B's FFN rows are 17408)

// The three shapes of work: matmul / matmul_group (jobs), a dense SwiGLU (gate and up rows
// together), routed experts' gate/up (rows pair * ff + row of expert ids[pair]).
enum ResidentMode { kResJobs = 0, kResSwiglu = 1, kResExperts = 2 };

struct ResidentArgs {
  const uint8_t* data[kMaxJobs];
  int64_t row_bytes[kMaxJobs];
  int64_t expert_bytes[2];
  float* y[kMaxJobs];
  int64_t first_row[kMaxJobs + 1];  // kResJobs: job j holds rows [first_row[j], first_row[j + 1])
  int n_jobs;
  int64_t total_rows;
  int64_t ff;             // kResExperts: rows per pair
  const int32_t* ids;     // kResExperts
  int64_t n_expert;       // kResExperts
  const float* x;         // [in], 16-byte aligned
  const int8_t* xq;       // x already quantised (quantize_q8_kernel; long rows), or null
  const float* xd;        // its scales
  int in;                 // a multiple of 256
  int slices, row_lanes;  // S, R
  int max_groups;         // row groups a block visits, at most (the partials' shared memory)
};

template <int MODE>
constexpr int resident_mats() {
  return MODE == kResJobs ? 1 : 2;
}
// Rows a warp has in flight beyond the one it computes: with one unit a lane there are registers
// for three (two with two matrices); with more units a lane, one.
template <int UPL, int MODE>
constexpr int resident_depth() {
  return UPL > 1 ? 1 : MODE == kResJobs ? 3 : 2;
}
// Threads a block may have: slices of one unit a lane make up to 18 warps; with more units a lane
// a block has at most 8 (and the registers that UPL x (1 + depth) units need).
template <int UPL>
constexpr int resident_max_threads() {
  return UPL == 1 ? kResMaxSlices * 32 : kResRowWarps * 32;
}

// The weight rows of global row r (false: an expert id out of range; nothing to read).
template <int MODE>
__device__ __forceinline__ bool resident_rows(const ResidentArgs& a, int64_t r,
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
  } else {
    const int64_t p = r / a.ff, row = r % a.ff;
    const int32_t e = a.ids[p];
    if (e < 0 || e >= a.n_expert) return false;
    ptr[0] = a.data[0] + e * a.expert_bytes[0] + row * a.row_bytes[0];
    ptr[1] = a.data[1] + e * a.expert_bytes[1] + row * a.row_bytes[1];
    return true;
  }
}

template <int MODE>
__device__ __forceinline__ void resident_store(const ResidentArgs& a, int64_t r,
                                               const float (&v)[resident_mats<MODE>()], bool ok) {
  if constexpr (MODE == kResJobs) {
    int j = 0;
    while (j + 1 < a.n_jobs && r >= a.first_row[j + 1]) ++j;
    a.y[j][r - a.first_row[j]] = v[0];
  } else {
    a.y[0][r] = ok ? silu(v[0]) * v[1] : __int_as_float(0x7fc00000);
  }
}

template <class T, int UPL, int MODE>
__device__ __forceinline__ bool resident_load(const ResidentArgs& a, int64_t r, int u0, int j,
                                              int n_units,
                                              typename T::Unit (&w)[resident_mats<MODE>()][UPL]) {
  constexpr int NM = resident_mats<MODE>();
  const uint8_t* ptr[NM];
  if (!resident_rows<MODE>(a, r, ptr)) return false;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int i = 0; i < UPL; ++i) {
      const int u = u0 + 32 * i;
      if (u < n_units) w[m][i] = T::load(ptr[m] + (u / T::kUnits) * T::kBytes, j);
    }
  }
  return true;
}

template <class T, int UPL, int MODE>
__global__ void __launch_bounds__(resident_max_threads<UPL>())
    resident_gemv_kernel(const __grid_constant__ ResidentArgs a) {
  constexpr int NM = resident_mats<MODE>();
  constexpr int DEPTH = resident_depth<UPL, MODE>(), NB = DEPTH + 1;
  static_assert(T::kElems == 256 && T::kUnits == 8, "resident GEMV: 256-element blocks of 8 units");
  extern __shared__ __align__(16) uint8_t res_smem[];
  int8_t* sq = reinterpret_cast<int8_t*>(res_smem);       // [in] (unless pre-quantised)
  float* sd = reinterpret_cast<float*>(res_smem + a.in);  // [in / 32]
  float* part = a.xq ? reinterpret_cast<float*>(res_smem) : sd + a.in / qb::kActBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int S = a.slices, R = a.row_lanes;
  const int s = warp % S, rw = warp / S;
  const int n_units = a.in / 32;
  const int u0 = 32 * UPL * s + lane;  // this lane's units of every row: u0 + 32 i, i < UPL
  const int j = lane % T::kUnits;      // their place in their blocks
  const int64_t stride = int64_t{gridDim.x} * R;
  const int64_t r0 = int64_t{blockIdx.x} * R + rw;

  pdl_launch_dependents();
  typename T::Unit w[NB][NM][UPL];
  bool ok[NB];
  auto load_ahead = [&]() {
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) {
      const int64_t r = r0 + q * stride;
      ok[q] = r < a.total_rows && resident_load<T, UPL, MODE>(a, r, u0, j, n_units, w[q]);
    }
  };
  if constexpr (MODE != kResExperts) load_ahead();  // expert ids come from the previous kernel
  pdl_wait();
  if constexpr (MODE == kResExperts) load_ahead();

  if (a.xq == nullptr) {
    // x into shared memory as int8 blocks of 32: four threads a block, eight elements each (in
    // / 8 is a multiple of 32, so whole warps take part in each round of shuffles).
    for (int t = threadIdx.x; t < a.in / 8; t += blockDim.x) {
      const float4 v0 = reinterpret_cast<const float4*>(a.x)[2 * t];
      const float4 v1 = reinterpret_cast<const float4*>(a.x)[2 * t + 1];
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
    __syncthreads();
  }
  // This lane's units of x: pre-quantised (long rows) or from shared memory.
  const int8_t* aq = a.xq ? a.xq : sq;
  const float* ad = a.xq ? a.xd : sd;
  int4 av[UPL][2];
  float xd[UPL][2], xs[UPL][2];
#pragma unroll
  for (int i = 0; i < UPL; ++i) {
    const int u = u0 + 32 * i;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      av[i][k] = make_int4(0, 0, 0, 0);
      xd[i][k] = xs[i][k] = 0.0f;
      if (u < n_units) {
        const int e = (u / T::kUnits) * T::kElems + T::act_offset(j, k);
        av[i][k] = *reinterpret_cast<const int4*>(aq + e);
        xd[i][k] = ad[e / qb::kActBlock];
        const int4 v = av[i][k];
        xs[i][k] = xd[i][k] * float(qb::sum4(v.w, qb::sum4(v.z, qb::sum4(v.y, qb::sum4(v.x, 0)))));
      }
    }
  }

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
        ok[ahead] =
            rn < a.total_rows && resident_load<T, UPL, MODE>(a, rn, u0, j, n_units, w[ahead]);
      }
      float acc[NM] = {};
      if (ok[q]) {
#pragma unroll
        for (int m = 0; m < NM; ++m) {
#pragma unroll
          for (int i = 0; i < UPL; ++i) {
            if (u0 + 32 * i < n_units) acc[m] += T::dot_regs(w[q][m][i], j, av[i], xd[i], xs[i]);
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
    for (int l = threadIdx.x; l < part_stride; l += blockDim.x) {
      const int64_t row = (int64_t{blockIdx.x} + int64_t{l / R} * gridDim.x) * R + l % R;
      if (row >= a.total_rows) continue;
      float v[NM];
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        float sum = 0.0f;
        for (int q = 0; q < S; ++q) sum += part[(m * S + q) * part_stride + l];
        v[m] = sum;
      }
      bool row_ok = true;
      if constexpr (MODE == kResExperts) {
        const int32_t e = a.ids[row / a.ff];
        row_ok = e >= 0 && e < a.n_expert;
      }
      resident_store<MODE>(a, row, v, row_ok);
    }
  }
}

bool resident_off() {
  static const bool off = [] {
    const char* v = std::getenv("QWENRT_CUDA_RESIDENT");
    return v && v[0] == '0';
  }();
  return off;
}

// Programmatic dependent launch: sm_90 and later, unless QWENRT_CUDA_PDL=0.
bool pdl_on() {
  static const bool on = [] {
    const char* v = std::getenv("QWENRT_CUDA_PDL");
    if (v && v[0] == '0') return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    QWENRT_CUDA_CHECK(cudaGetDevice(&dev));
    QWENRT_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  return n;
}

template <class T, int UPL, int MODE>
void launch_resident(ResidentArgs a, cudaStream_t stream) {
  constexpr int NM = resident_mats<MODE>();
  auto* kernel = resident_gemv_kernel<T, UPL, MODE>;
  const int S = a.slices, R = a.row_lanes, threads = 32 * S * R;
  const int64_t groups = (a.total_rows + R - 1) / R;
  const size_t base = a.xq ? 0 : size_t(a.in) + size_t(a.in / qb::kActBlock) * 4;
  const auto part_bytes = [&](int64_t max_groups) {
    return S > 1 ? size_t(NM) * S * R * size_t(max_groups) * 4 : 0;
  };
  int per_sm = 0;
  QWENRT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                                  base + part_bytes(8)));
  const int64_t grid =
      std::max<int64_t>(1, std::min<int64_t>(groups, int64_t{std::max(per_sm, 1)} * sm_count()));
  a.max_groups = static_cast<int>((groups + grid - 1) / grid);
  const size_t smem = base + part_bytes(a.max_groups);
  if (smem > 48 * 1024) {
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_on() ? 1 : 0;
  QWENRT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
}

// Rows longer than this take their activations quantised by quantize_q8_kernel (one launch)
// instead of every block quantising the whole row itself (a 17408-wide row is 70 KB of floats a
// block reads from L2 before its weights can be used).
constexpr int kResQuantiseInKernelMax = 8192;

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
template <int MODE>
ResidentShape resident_shape(int n_units) {
  if constexpr (MODE == kResSwiglu) {
    return {(n_units + 31) / 32, 1};
  } else {
    int S = 1;
    while (S < kResRowWarps && S * 32 * 4 < n_units) S *= 2;
    return {S, (n_units + 32 * S - 1) / (32 * S)};
  }
}

// The resident kernel for `m`'s type with a's in and mode; false (nothing launched) where it has
// none: other types, rows it cannot slice, unaligned x, or QWENRT_CUDA_RESIDENT=0.
template <int MODE>
bool resident(const MatArg& m, ResidentArgs a, void* workspace, cudaStream_t stream) {
  if (resident_off() || a.in % 256 != 0 || !aligned(a.x, 16)) return false;
  const ResidentShape shape = resident_shape<MODE>(a.in / 32);
  if (shape.slices > kResMaxSlices || shape.upl > 4) return false;
  switch (m.dtype) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::IQ4_XS:
      // A single 4-bit matrix with rows this long streams faster through the staged kernel
      // (Q4_K 17408 x 5120: 29.6 us against 35.4 us here, quantisation launch included).
      if (MODE == kResJobs && a.in > kResQuantiseInKernelMax) return false;
      break;
    case DType::Q8_0:
      if (!m.q8s) return false;
      // An lm-head-sized Q8_0 matrix streams faster through the staged kernel (94% of the
      // bandwidth against 85% here, 2048 x 248320).
      if (MODE == kResJobs && a.total_rows >= 131072) return false;
      break;
    default:
      return false;
  }
  a.slices = shape.slices;
  a.row_lanes = std::max(1, kResRowWarps / shape.slices);
  if (a.in > kResQuantiseInKernelMax && workspace != nullptr) {
    const Acts q = prepare_acts(a.x, 1, a.in, true, workspace, stream);
    a.xq = q.q;
    a.xd = q.d;
  }
  auto by_upl = [&]<class T>() {
    if constexpr (MODE == kResSwiglu) {
      launch_resident<T, 1, MODE>(a, stream);
    } else {
      switch (shape.upl) {
        case 1:
          launch_resident<T, 1, MODE>(a, stream);
          break;
        case 2:
          launch_resident<T, 2, MODE>(a, stream);
          break;
        case 3:
          launch_resident<T, 3, MODE>(a, stream);
          break;
        default:
          launch_resident<T, 4, MODE>(a, stream);
          break;
      }
    }
  };
  switch (m.dtype) {
    case DType::Q4_K:
      by_upl.template operator()<qb::Q4K>();
      break;
    case DType::Q5_K:
      by_upl.template operator()<qb::Q5K>();
      break;
    case DType::IQ4_XS:
      by_upl.template operator()<qb::IQ4XS>();
      break;
    default:
      by_upl.template operator()<qb::Q80S>();
      break;
  }
  return true;
}

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
  ResidentArgs a{};
  a.data[0] = g.data;
  a.data[1] = u.data;
  a.row_bytes[0] = g.row_bytes;
  a.row_bytes[1] = u.row_bytes;
  a.y[0] = y;
  a.total_rows = g.out;
  a.x = x;
  a.in = static_cast<int>(in);
  return resident<kResSwiglu>(g, a, workspace, stream);
}

bool resident_experts_swiglu(const MatArg& g, const MatArg& u, const int32_t* ids, int k,
                             const float* x, int64_t in, float* y, void* workspace,
                             cudaStream_t stream) {
  if (g.dtype != u.dtype || g.q8s != u.q8s || in > (1 << 20)) return false;
  ResidentArgs a{};
  a.data[0] = g.data;
  a.data[1] = u.data;
  a.row_bytes[0] = g.row_bytes;
  a.row_bytes[1] = u.row_bytes;
  a.expert_bytes[0] = g.expert_bytes;
  a.expert_bytes[1] = u.expert_bytes;
  a.y[0] = y;
  a.ff = g.out;
  a.total_rows = int64_t{k} * g.out;
  a.ids = ids;
  a.n_expert = g.n_expert;
  a.x = x;
  a.in = static_cast<int>(in);
  return resident<kResExperts>(g, a, workspace, stream);
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
  if (n_p < 1 || n_p > kMaxJobs) bad_call("matmul_group: {} projections (1..{})", n_p, kMaxJobs);
  const int64_t in = p[0].w.in;
  bool any_quant = false;
  int64_t max_units = 0;
  Group g{};
  g.n_jobs = n_p;
  for (int i = 0; i < n_p; ++i) {
    if (p[i].w.in != in)
      bad_call("matmul_group: projection {} has in = {}, projection 0 has {}", i, p[i].w.in, in);
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

// ---- Embedding ----------------------------------------------------------------------------------
template <class T>
struct QuantElem {
  static __device__ __forceinline__ float elem(const uint8_t* row, int64_t i) {
    return qb::dequant_element<T>(row, i);
  }
};

// out [n, dim] = rows tokens[0..n) of the table; blockIdx.y walks tokens (stride gridDim.y).
template <class E>
__global__ void embed_kernel(const uint8_t* __restrict__ table, int64_t row_bytes, int64_t n_vocab,
                             int64_t dim, const int32_t* __restrict__ tokens, int64_t n,
                             float* __restrict__ out) {
  pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const int32_t id = tokens[t];
    // Ids are checked on the host; one outside the table still must not read past it.
    out[t * dim + i] =
        id >= 0 && id < n_vocab ? E::elem(table + id * row_bytes, i) : __int_as_float(0x7fc00000);
  }
}

}  // namespace

bool q8_0_superblocks_fit(int64_t in) {
  return in > 0 && in % qb::Q80S::kElems == 0;
}

void repack_q8_0_superblocks(const void* src, void* dst, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0 || bytes % qb::Q80S::kBytes != 0)
    bad_call("repack_q8_0_superblocks: {} bytes is not whole superblocks of {}", bytes,
             qb::Q80S::kBytes);
  if (!aligned(src, 16) || !aligned(dst, 16))
    bad_call("repack_q8_0_superblocks: unaligned src {} or dst {}", src, dst);
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
  return is_quantised(w.dtype) ? quant_act_bytes(n, w.in) : 0;
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
    bad_call("matmul_swiglu: gate [{}, {}] and up [{}, {}] differ", gate.in, gate.out, up.in,
             up.out);
  const MatArg g = mat_arg(gate, x, "matmul_swiglu gate"), u = mat_arg(up, x, "matmul_swiglu up");
  const int ts = team_size(std::max(row_units(gate, g.vec), row_units(up, u.vec)));
  const int rpb = kThreads / ts;
  const int64_t row_blocks = (gate.out + rpb - 1) / rpb;
  if (n == 1 && resident_swiglu(g, u, x, gate.in, y, workspace, stream)) return;
  const Acts a = prepare_acts(x, n, gate.in, is_quantised(gate.dtype) || is_quantised(up.dtype),
                              workspace, stream);
  if (is_quantised(gate.dtype) && staged_swiglu(g, u, y, n, a, stream)) return;
  over_row_chunks(n, [&](int nr, int64_t n_chunks, int64_t row0) {
    launch_swiglu(nr, g, u, y + row0 * gate.out, ts, rpb, n_chunks, row_blocks * n_chunks,
                  shift_rows(a, row0), stream);
  });
}

void experts_swiglu(const Matrix& gate, const Matrix& up, const int32_t* ids, int k, const float* x,
                    float* y, int64_t n, void* workspace, cudaStream_t stream) {
  if (n <= 0) return;
  if (gate.in != up.in || gate.out != up.out || gate.n_expert != up.n_expert)
    bad_call("experts_swiglu: gate [{}, {}, {}] and up [{}, {}, {}] differ", gate.in, gate.out,
             gate.n_expert, up.in, up.out, up.n_expert);
  if (k < 1) bad_call("experts_swiglu: k = {}", k);
  const MatArg g = mat_arg(gate, x, "experts_swiglu gate");
  const MatArg u = mat_arg(up, x, "experts_swiglu up");
  const int ts = team_size(std::max(row_units(gate, g.vec), row_units(up, u.vec)));
  const int rpb = kThreads / ts;
  const int64_t n_pairs = n * k;
  if (n == 1 && resident_experts_swiglu(g, u, ids, k, x, gate.in, y, workspace, stream)) return;
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
  if (k < 1) bad_call("experts_down: k = {}", k);
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

bool experts_down_pairs(const Matrix& down, const int32_t* ids, int k, const float* x,
                        float* y_pairs, int64_t n, void* workspace, cudaStream_t stream) {
  if (n <= 0) return true;
  if (!is_quantised(down.dtype) || staging_off()) return false;
  const MatArg d = mat_arg(down, x, "experts_down_pairs");
  if (staged_vec_of(d) < 4) return false;
  const Acts a = prepare_acts(x, n * k, down.in, true, workspace, stream);
  if (!staged_experts_down_pairs(d, ids, y_pairs, n * k, a, stream)) {
    bad_call("experts_down_pairs: no staged kernel for {}", dtype_name(down.dtype));
  }
  return true;
}

void embed_rows(const Matrix& table, const int32_t* tokens, int64_t n, float* out,
                cudaStream_t stream) {
  if (n <= 0) return;
  if (!has_kernel(table.dtype))
    bad_call("embed_rows: no CUDA kernel for {}", dtype_name(table.dtype));
  constexpr int kEmbedThreads = 256;
  const dim3 grid(static_cast<unsigned>((table.in + kEmbedThreads - 1) / kEmbedThreads),
                  static_cast<unsigned>(std::min<int64_t>(n, kMaxGridY)));
  const auto* data = static_cast<const uint8_t*>(table.data);
  switch (table.dtype) {
#define QWENRT_EMBED_CASE(TYPE, ELEM)                                                        \
  case DType::TYPE:                                                                          \
    embed_kernel<ELEM><<<grid, kEmbedThreads, 0, stream>>>(data, table.row_bytes, table.out, \
                                                           table.in, tokens, n, out);        \
    break;
    QWENRT_EMBED_CASE(Q4_K, QuantElem<qb::Q4K>)
    QWENRT_EMBED_CASE(Q5_K, QuantElem<qb::Q5K>)
    QWENRT_EMBED_CASE(Q6_K, QuantElem<qb::Q6K>)
    case DType::Q8_0:
      if (table.q8_superblocks) {
        embed_kernel<QuantElem<qb::Q80S>><<<grid, kEmbedThreads, 0, stream>>>(
            data, table.row_bytes, table.out, table.in, tokens, n, out);
      } else {
        embed_kernel<QuantElem<qb::Q80>><<<grid, kEmbedThreads, 0, stream>>>(
            data, table.row_bytes, table.out, table.in, tokens, n, out);
      }
      break;
      QWENRT_EMBED_CASE(Q4_0, QuantElem<qb::Q40>)
      QWENRT_EMBED_CASE(IQ4_XS, QuantElem<qb::IQ4XS>)
      QWENRT_EMBED_CASE(F32, F32W)
      QWENRT_EMBED_CASE(F16, F16W)
      QWENRT_EMBED_CASE(BF16, BF16W)
#undef QWENRT_EMBED_CASE
    default:
      break;
  }
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
