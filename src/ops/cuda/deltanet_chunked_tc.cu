// The chunked delta rule's state and output kernels on tensor cores (the default;
// deltanet_chunked.cu states the math, runs prep, and holds the fp32 form of these two kernels,
// which QWENRT_CUDA_CHUNKED_TC=0 selects).
//
// Products on tensor cores: mma.sync m16n8k8, operands rounded to tf32 (10-bit mantissa, round to
// nearest) as they are read from fp32 shared memory, fp32 accumulators:
//   prep (deltanet_chunked.cu)  k^ k^T                          [64 x 64] over D   (M)
//   state                       W S                             [64 x 32] over D   (D = U - W S)
//                               (exp(g_L - g_t) k^_t)^T D       [D x 32] over 64   (S' - Gamma_L S)
//   output                      q^ k^T                          [64 x 64] over D   (P o q^ k^T)
//                               q^ S0                           [64 x D] over D    (x Gamma_t)
//                               (P o q^ k^T) D                  [64 x D] over 64
// U, W, D, the state S (in shared memory and in the saved start states), the gates and every sum
// stay fp32; the forward substitution (I + M)^-1 stays fp32 on CUDA cores (prep).
//
// state: block = (V head, 32 value columns, span), 8 warps, the chunks of the span in order, the
//   block's columns of S in shared memory. Per chunk: D = U - W S (4 x 4 tiles of [16 x 8]: warp
//   w rows 16 (w % 4).., columns 16 (w / 4)..), then S' = Gamma_L S + (exp(g_L - g) k^)^T D
//   (D / 16 x 4 tiles: warp w rows 16 (w % (D / 16)).., its share of the 4 column tiles; each
//   accumulator starts from and goes back to the S element it owns). W and k^ of the next chunk
//   are copied by cp.async during the other product of the current one (one buffer each: W (c+1)
//   after W S, k^ (c+1) after the update), so that two blocks fit an SM (~97 KiB at D = 128).
// output: block = (V head, chunk), 8 warps. cp.async copies q^, k^ and the start state S0; then
//   A = P o (q^ k^T) (gram_rows_tc); D's rows are copied into k^'s place while O = Gamma q^ S0
//   runs (warp w rows 16 (w % 4).., columns (D / 2) (w / 4)..: D / 16 tiles); then O += A D over
//   the k tiles up to the warp's last row (A is lower triangular), and the gated RMSNorm from the
//   accumulators (a row's squares summed over its quad of lanes, then over the two warps that
//   share the row).
#include <cstdint>

#include "ops/cuda/check.h"
#include "ops/cuda/deltanet_chunked.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/paged_kv.cuh"

namespace qwenrt::ops::cuda::chunked {
namespace {

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async of kRows rows of kD floats (row t at src + t * row_floats) into dst [kRows][kStride];
// rows at or past `valid` are zero-filled. The caller commits the group.
template <int kRows, int kD, int kStride>
__device__ __forceinline__ void stage_rows(float* dst, const float* src, int64_t row_floats,
                                           int valid) {
  for (int idx = threadIdx.x; idx < kRows * (kD / 4); idx += kThreads) {
    const int t = idx / (kD / 4), c = 4 * (idx % (kD / 4));
    const bool in = t < valid;
    cp_async16(dst + t * kStride + c, in ? src + t * row_floats + c : src, in);
  }
}

// ---- 2. state ----
template <int kD>
struct StateSmem {
  static constexpr int kWStride = kD + 4;     // W: A operand (4 mod 32)
  static constexpr int kKStride = kD + 8;     // k^: A operand read transposed (8 mod 32)
  static constexpr int kSStride = kCols + 8;  // S and D tiles: B operands (8 mod 32)
  static constexpr int kW = 0;                // floats: [kL][kWStride]
  static constexpr int kK = kW + kL * kWStride;
  static constexpr int kS = kK + kL * kKStride;   // [kD][kSStride]
  static constexpr int kDn = kS + kD * kSStride;  // [kL][kSStride]
  static constexpr size_t kBytes = sizeof(float) * size_t{kDn + kL * kSStride};
};

template <int kD>
__global__ void __launch_bounds__(kThreads, 2) chunk_state_tc_kernel(const ChunkParams p) {
  using L = StateSmem<kD>;
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  float* sW = smem + L::kW;
  float* sK = smem + L::kK;
  float* sS = smem + L::kS;
  float* sDn = smem + L::kDn;
  __shared__ float s_kscale[kL];  // exp(g_L - g_t); 0 past the chunk
  __shared__ float s_decay;       // Gamma_L = exp(g_L)
  const int h = blockIdx.x, hk = h % p.Hk, col0 = blockIdx.y * kCols;
  const int tid = threadIdx.x, warp = tid / 32;
  int chunk_base = 0;
  for (int s = 0; s < static_cast<int>(blockIdx.z); ++s) chunk_base += chunks_of(p.spans[s]);
  const Span span = p.spans[blockIdx.z];
  const int n_chunks = chunks_of(span);
  const auto chunk_len = [&](int c) { return min(kL, span.count - c * kL); };
  const auto chunk_row0 = [&](int c) { return int64_t{span.begin} + int64_t{c} * kL; };
  const auto stage_w = [&](int c) {
    stage_rows<kL, kD, L::kWStride>(sW, p.w + (chunk_row0(c) * p.Hv + h) * kD, int64_t{p.Hv} * kD,
                                    chunk_len(c));
  };
  const auto stage_k = [&](int c) {
    stage_rows<kL, kD, L::kKStride>(sK, p.k + (chunk_row0(c) * p.Hk + hk) * kD, int64_t{p.Hk} * kD,
                                    chunk_len(c));
  };
  // Pending cp.async groups at the top of chunk c: W (c), then k^ (c).
  if (n_chunks > 0) {
    stage_w(0);
    cp_async_commit();
    stage_k(0);
    cp_async_commit();
  }
  float* S = p.delta_state + (int64_t{span.slot} * p.Hv + h) * kD * kD;
  for (int idx = tid; idx < kD * kCols; idx += kThreads) {  // the S0 copy below uses the same map
    const int r = idx / kCols, j = idx % kCols;
    sS[r * L::kSStride + j] = S[int64_t{r} * kD + col0 + j];
  }

  // Tiles of D [kL][kCols]: rows dm0.., columns dn0.. (two n-tiles).
  const int dm0 = 16 * (warp % 4), dn0 = 16 * (warp / 4);
  // Tiles of S' [kD][kCols]: rows sm0.., columns sn0.. (kSTiles n-tiles).
  constexpr int kRowTiles = kD / 16;
  constexpr int kSTiles = kCols / 8 / (kThreads / 32 / kRowTiles);
  static_assert(kSTiles >= 1 && kRowTiles * (kCols / 8) == kSTiles * (kThreads / 32));
  const int sm0 = 16 * (warp % kRowTiles), sn0 = 8 * kSTiles * (warp / kRowTiles);
  const auto at_w = [&](int t, int r) { return sW[t * L::kWStride + r]; };
  const auto at_s = [&](int r, int j) { return sS[r * L::kSStride + j]; };
  const auto at_kt = [&](int r, int t) { return sK[t * L::kKStride + r] * s_kscale[t]; };
  const auto at_d = [&](int t, int j) { return sDn[t * L::kSStride + j]; };

  for (int c = 0; c < n_chunks; ++c) {
    const int len = chunk_len(c);
    const int64_t row0 = chunk_row0(c);
    // (s_kscale, s_decay: their last readers passed the barrier that ended chunk c - 1.)
    if (tid < kL) {
      const float g_last = p.g[(row0 + len - 1) * p.Hv + h];
      s_kscale[tid] = tid < len ? expf(g_last - p.g[(row0 + tid) * p.Hv + h]) : 0.0f;
      if (tid == 0) s_decay = expf(g_last);
    }
    float* S0 = p.s0 + (int64_t{chunk_base + c} * p.Hv + h) * kD * kD;
    for (int idx = tid; idx < kD * kCols; idx += kThreads) {
      const int r = idx / kCols, j = idx % kCols;
      S0[int64_t{r} * kD + col0 + j] = sS[r * L::kSStride + j];
    }
    // U at this thread's D elements, loaded before the product hides their latency.
    float* u_rows = p.u + (row0 * p.Hv + h) * kD + col0;
    float uv[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = c_row(dm0, i), j = c_col(dn0 + 8 * nt, i);
        uv[nt][i] = t < len ? u_rows[int64_t{t} * p.Hv * kD + j] : 0.0f;
      }
    }
    cp_async_wait<1>();  // W (c) landed; k^ (c) may still be in flight
    __syncthreads();     // W (c), S and the scales visible to every warp

    // D = U - W S (rows past the chunk: 0).
    float dacc[2][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < kD; k0 += 8) {
      const FragA fa = load_a(at_w, dm0, k0);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) mma_tf32(dacc[nt], fa, load_b(at_s, k0, dn0 + 8 * nt));
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = c_row(dm0, i), j = c_col(dn0 + 8 * nt, i);
        const float d = t < len ? uv[nt][i] - dacc[nt][i] : 0.0f;
        if (t < len) u_rows[int64_t{t} * p.Hv * kD + j] = d;  // D goes over U
        sDn[t * L::kSStride + j] = d;
      }
    }
    cp_async_wait<0>();  // k^ (c) landed
    __syncthreads();     // D and k^ (c) visible; every read of W (c) and of S done
    if (c + 1 < n_chunks) stage_w(c + 1);
    cp_async_commit();  // (empty after the last chunk: the group count stays uniform)

    // S' = Gamma_L S + (exp(g_L - g) k^)^T D, accumulated onto the owned S elements.
    float sacc[kSTiles][4];
    const float decay = s_decay;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sacc[nt][i] = decay * sS[c_row(sm0, i) * L::kSStride + c_col(sn0 + 8 * nt, i)];
    }
#pragma unroll
    for (int k0 = 0; k0 < kL; k0 += 8) {
      const FragA fa = load_a(at_kt, sm0, k0);
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) mma_tf32(sacc[nt], fa, load_b(at_d, k0, sn0 + 8 * nt));
    }
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sS[c_row(sm0, i) * L::kSStride + c_col(sn0 + 8 * nt, i)] = sacc[nt][i];
    }
    __syncthreads();  // S' visible; every read of k^ (c), D and the scales done
    if (c + 1 < n_chunks) stage_k(c + 1);
    cp_async_commit();
  }
  for (int idx = tid; idx < kD * kCols; idx += kThreads) {
    const int r = idx / kCols, j = idx % kCols;
    S[int64_t{r} * kD + col0 + j] = sS[r * L::kSStride + j];
  }
}

// ---- 3. output ----
template <int kD>
struct OutputSmem {
  static constexpr int kQStride = kD + 4;  // q^, k^: A operand / transposed B operand (4 mod 32)
  static constexpr int kAStride = kL + 4;  // P o q^ k^T: A operand
  static constexpr int kBStride = kD + 8;  // S0, D: B operands (8 mod 32)
  static constexpr int kQ = 0;             // floats: [kL][kQStride]
  static constexpr int kA = kQ + kL * kQStride;    // [kL][kAStride]
  static constexpr int kS0 = kA + kL * kAStride;   // [kD][kBStride]
  static constexpr int kKD = kS0 + kD * kBStride;  // k^ [kL][kQStride], then D [kL][kBStride]
  static constexpr size_t kBytes = sizeof(float) * size_t{kKD + kL * kBStride};
};

template <int kD>
__global__ void __launch_bounds__(kThreads) chunk_output_tc_kernel(const ChunkParams p) {
  using L = OutputSmem<kD>;
  extern __shared__ float4 smem_f4[];
  float* smem = reinterpret_cast<float*>(smem_f4);
  float* sQ = smem + L::kQ;
  float* sA = smem + L::kA;
  float* sS0 = smem + L::kS0;
  float* sK = smem + L::kKD;
  float* sDn = smem + L::kKD;  // after A is formed
  __shared__ float s_g[kL];
  __shared__ float s_oo[2][kL];  // per column half: the row's sum of o^2
  const int h = blockIdx.x, hk = h % p.Hk;
  Span span;
  int c;
  if (!find_chunk(p, blockIdx.y, span, c)) return;
  const int len = min(kL, span.count - c * kL);
  const int64_t row0 = int64_t{span.begin} + int64_t{c} * kL;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t nk = int64_t{p.Hk} * kD, nv = int64_t{p.Hv} * kD;
  stage_rows<kL, kD, L::kQStride>(sQ, p.q + (row0 * p.Hk + hk) * kD, nk, len);
  stage_rows<kL, kD, L::kQStride>(sK, p.k + (row0 * p.Hk + hk) * kD, nk, len);
  stage_rows<kD, kD, L::kBStride>(sS0, p.s0 + (int64_t{blockIdx.y} * p.Hv + h) * kD * kD, kD, kD);
  cp_async_commit();
  if (tid < kL) s_g[tid] = tid < len ? p.g[(row0 + tid) * p.Hv + h] : 0.0f;
  cp_async_wait<0>();
  __syncthreads();  // q^, k^, S0 and g visible

  // A = exp(g_t - g_s) (q^ k^T) on and below the diagonal; 0 past the chunk.
  gram_rows_tc<kD, L::kQStride>(sQ, sK, [&](int t, int s, float dot) {
    sA[t * L::kAStride + s] = s <= t && t < len ? expf(s_g[t] - s_g[s]) * dot : 0.0f;
  });
  __syncthreads();  // A visible; every read of k^ done, so D takes its place
  stage_rows<kL, kD, L::kBStride>(sDn, p.u + (row0 * p.Hv + h) * kD, nv, len);
  cp_async_commit();

  // O = Gamma q^ S0 on this warp's tiles: rows m0.., columns n0.. (kNT n-tiles).
  constexpr int kNT = kD / 16;
  const int m0 = 16 * (warp % 4), half = warp / 4, n0 = half * (kD / 2);
  const auto at_q = [&](int t, int r) { return sQ[t * L::kQStride + r]; };
  const auto at_s0 = [&](int r, int j) { return sS0[r * L::kBStride + j]; };
  const auto at_a = [&](int t, int s) { return sA[t * L::kAStride + s]; };
  const auto at_d = [&](int s, int j) { return sDn[s * L::kBStride + j]; };
  float o[kNT][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < kD; k0 += 8) {
    const FragA fa = load_a(at_q, m0, k0);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) mma_tf32(o[nt], fa, load_b(at_s0, k0, n0 + 8 * nt));
  }
  const float gamma_lo = expf(s_g[c_row(m0, 0)]), gamma_hi = expf(s_g[c_row(m0, 2)]);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    o[nt][0] *= gamma_lo;
    o[nt][1] *= gamma_lo;
    o[nt][2] *= gamma_hi;
    o[nt][3] *= gamma_hi;
  }
  cp_async_wait<0>();
  __syncthreads();  // D visible

  // O += A D; A's columns past the warp's last row are zero.
#pragma unroll 2
  for (int k0 = 0; k0 < m0 + 16; k0 += 8) {
    const FragA fa = load_a(at_a, m0, k0);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) mma_tf32(o[nt], fa, load_b(at_d, k0, n0 + 8 * nt));
  }

  // The gated RMSNorm: rows c_row(m0, 0) (elements 0, 1) and c_row(m0, 2) (elements 2, 3).
  const float scale = rsqrtf(static_cast<float>(kD));
  float oo_lo = 0, oo_hi = 0;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[nt][i] *= scale;
    oo_lo = fmaf(o[nt][0], o[nt][0], fmaf(o[nt][1], o[nt][1], oo_lo));
    oo_hi = fmaf(o[nt][2], o[nt][2], fmaf(o[nt][3], o[nt][3], oo_hi));
  }
  for (int off = 1; off < 4; off *= 2) {  // the quad of lanes sharing the rows
    oo_lo += __shfl_xor_sync(0xffffffffu, oo_lo, off);
    oo_hi += __shfl_xor_sync(0xffffffffu, oo_hi, off);
  }
  if (lane % 4 == 0) {
    s_oo[half][c_row(m0, 0)] = oo_lo;
    s_oo[half][c_row(m0, 2)] = oo_hi;
  }
  __syncthreads();  // both halves' sums visible
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int t = c_row(m0, 2 * hi);
    if (t >= len) continue;
    const float inv_rms = 1.0f / sqrtf((s_oo[0][t] + s_oo[1][t]) / kD + p.eps);
    const int64_t at = (row0 + t) * nv + int64_t{h} * kD;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = c_col(n0 + 8 * nt, e);
        const float z = p.z[at + j];
        p.out[at + j] = output_gate(z, p.sigmoid_gate) * (o[nt][2 * hi + e] * inv_rms * p.norm[j]);
      }
    }
  }
}

}  // namespace

template <int kD>
void launch_state_output_tc(const DeviceStep& step, const ChunkParams& prm, cudaStream_t stream) {
  // Function attributes, not stream operations: allowed while a graph is captured.
  static const bool attributes_set = [] {
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(chunk_state_tc_kernel<kD>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(StateSmem<kD>::kBytes)));
    // The whole carveout as shared memory, so that two state blocks share an SM.
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(chunk_state_tc_kernel<kD>,
                                           cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
    QWENRT_CUDA_CHECK(cudaFuncSetAttribute(chunk_output_tc_kernel<kD>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(OutputSmem<kD>::kBytes)));
    return true;
  }();
  (void)attributes_set;
  const auto max_chunks = static_cast<unsigned>(step.n / kL + step.n_spans);
  const auto Hv = static_cast<unsigned>(prm.Hv);
  chunk_state_tc_kernel<kD><<<dim3(Hv, kD / kCols, static_cast<unsigned>(step.n_spans)), kThreads,
                              StateSmem<kD>::kBytes, stream>>>(prm);
  QWENRT_CUDA_CHECK_LAUNCH();
  chunk_output_tc_kernel<kD>
      <<<dim3(Hv, max_chunks), kThreads, OutputSmem<kD>::kBytes, stream>>>(prm);
  QWENRT_CUDA_CHECK_LAUNCH();
}

template void launch_state_output_tc<64>(const DeviceStep&, const ChunkParams&, cudaStream_t);
template void launch_state_output_tc<128>(const DeviceStep&, const ChunkParams&, cudaStream_t);

}  // namespace qwenrt::ops::cuda::chunked
