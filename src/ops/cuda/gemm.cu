// Prefill GEMM of the CUDA backend: y [n, out] = x [n, in] @ W^T when n is large enough that the
// weights are worth expanding (mm::gemm_rows). cuBLAS does the multiply on tensor cores:
// - quantised W: a chunk of rows at a time is dequantised to bf16 into the workspace (at most
//   kChunkBytes, so the lm head needs no 2.5 GB copy), x is converted to bf16 once per call, and
//   cublasGemmEx multiplies bf16 x bf16 with fp32 accumulation into fp32 y;
// - F32 / F16 / BF16 W: the chunk is expanded to fp32 and multiplied in fp32 (cublasSgemm, no
// TF32),
//   so float weights keep fp32 accuracy.
// In cuBLAS's column-major terms a row-major y [n, out] is out x n with ld = out, and W's rows
// (`in` contiguous) are the columns of an in x out matrix: y^T = W x^T is GEMM(T, N) with
// m = rows of the chunk, n = n, k = in, C at y + first row of the chunk.
// Each stream gets its own cuBLAS handle (the shared expert runs on a side stream: a handle's
// workspace must not be shared between streams running at once). Not used in captured decode
// steps (those have at most 16 rows).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "ops/cuda/check.h"
#include "ops/cuda/expand.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/matmul_args.cuh"
#include "ops/cuda/quant_blocks.cuh"

namespace qwenrt::ops::cuda::mm {
namespace {

constexpr int64_t kChunkBytes = int64_t{64} << 20;  // expanded weights per GEMM call
constexpr int kThreadsPerBlock = 256;
constexpr int kPerThread = 8;  // elements a dequantisation thread writes (16 bytes of bf16)

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

__device__ __forceinline__ void store(__nv_bfloat16* out, const float (&v)[kPerThread]) {
  expand::store8(out, v);
}
__device__ __forceinline__ void store(float* out, const float (&v)[kPerThread]) {
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) out[j] = v[j];
}

// out [rows, in] (row-major) = rows [0, rows) of W expanded; in % 8 == 0.
template <class E, class Out>
__global__ void __launch_bounds__(kThreadsPerBlock)
    expand_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t in, int64_t rows,
                  Out* __restrict__ out) {
  const int64_t per_row = in / kPerThread;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * per_row) return;
  const int64_t r = t / per_row, i0 = (t % per_row) * kPerThread;
  const uint8_t* row = w + r * row_bytes;
  float v[kPerThread];
  E::elem8(row, i0, v);
  store(out + r * in + i0, v);
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n8,
                               __nv_bfloat16* __restrict__ out) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n8) return;
  const float4 a = reinterpret_cast<const float4*>(x)[2 * t];
  const float4 b = reinterpret_cast<const float4*>(x)[2 * t + 1];
  const float v[kPerThread] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  store(out + kPerThread * t, v);
}

unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

template <class Out>
void expand(const Matrix& w, int64_t row0, int64_t rows, Out* out, cudaStream_t stream) {
  const auto* data = static_cast<const uint8_t*>(w.data) + row0 * w.row_bytes;
  const unsigned grid = blocks_for(rows * (w.in / kPerThread));
  const int64_t rb = w.row_bytes, in = w.in;
  const bool launched = expand::with_reader(w, [&](auto reader) {
    expand_kernel<decltype(reader), Out>
        <<<grid, kThreadsPerBlock, 0, stream>>>(data, rb, in, rows, out);
  });
  if (!launched) cuda_fail("gemm: no expansion for {}", dtype_name(w.dtype));
  QWENRT_CUDA_CHECK_LAUNCH();
}

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    cuda_fail("{} failed: {} ({})", what, cublasGetStatusName(status),
              cublasGetStatusString(status));
}

// The handle of `stream` (created on first use, kept for the process: handles are few and cheap,
// and a backend may be created many times).
cublasHandle_t handle_for(cudaStream_t stream) {
  static std::mutex mutex;
  static std::vector<std::pair<cudaStream_t, cublasHandle_t>> handles;
  int device = 0;
  QWENRT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  // Keyed by stream and device (a handle belongs to the device current when it was made).
  const auto key = reinterpret_cast<cudaStream_t>(reinterpret_cast<uintptr_t>(stream) ^
                                                  (uintptr_t(device) << 56));
  for (auto& [s, h] : handles) {
    if (s == key) {
      check_blas(cublasSetStream(h, stream), "cublasSetStream");
      return h;
    }
  }
  cublasHandle_t h = nullptr;
  check_blas(cublasCreate(&h), "cublasCreate");
  check_blas(cublasSetStream(h, stream), "cublasSetStream");
  handles.emplace_back(key, h);
  return h;
}

int64_t chunk_rows(const Matrix& w) {
  const int64_t elem = is_float(w.dtype) ? 4 : 2;
  const int64_t rows = std::max<int64_t>(128, kChunkBytes / (w.in * elem) / 128 * 128);
  return std::min(rows, w.out);
}

int64_t min_rows_from_env() {
  const char* v = std::getenv("QWENRT_CUDA_GEMM_ROWS");
  if (v == nullptr || *v == '\0') return 32;
  const long long r = std::atoll(v);
  return r <= 0 ? INT64_MAX : r;
}

}  // namespace

bool gemm_rows(const Matrix& w, int64_t n) {
  static const int64_t min_rows = min_rows_from_env();
  return n >= min_rows && w.n_expert == 1 && w.in % kPerThread == 0 && has_kernel(w.dtype);
}

int64_t gemm_act_bytes(int64_t n, int64_t in) {
  return align256(n * in * 2);  // x rounded to bf16 (float weights read the fp32 x in place)
}

int64_t gemm_workspace_bytes(const Matrix& w, int64_t n) {
  const int64_t elem = is_float(w.dtype) ? 4 : 2;
  return gemm_act_bytes(n, w.in) + align256(chunk_rows(w) * w.in * elem);
}

const void* gemm_prepare_x(const float* x, int64_t n, int64_t in, void* workspace,
                           cudaStream_t stream) {
  if ((n * in) % kPerThread != 0 || !aligned(x, 16))
    cuda_fail("gemm: x [{}, {}] is not whole 16-byte runs", n, in);
  auto* xb = static_cast<__nv_bfloat16*>(workspace);
  const int64_t n8 = n * in / kPerThread;
  to_bf16_kernel<<<blocks_for(n8), kThreadsPerBlock, 0, stream>>>(x, n8, xb);
  QWENRT_CUDA_CHECK_LAUNCH();
  return xb;
}

void gemm(const Matrix& w, const void* x, int64_t n, float* y, int64_t ldy, void* workspace,
          cudaStream_t stream) {
  if (n <= 0 || w.out <= 0) return;
  cublasHandle_t h = handle_for(stream);
  void* chunk = static_cast<uint8_t*>(workspace) + gemm_act_bytes(n, w.in);
  const int64_t step = chunk_rows(w);
  const float one = 1.0f, zero = 0.0f;
  const int k = static_cast<int>(w.in), cols = static_cast<int>(n), ld = static_cast<int>(ldy);
  for (int64_t row0 = 0; row0 < w.out; row0 += step) {
    const int64_t rows = std::min(step, w.out - row0);
    const int m = static_cast<int>(rows);
    if (is_float(w.dtype)) {
      // F32 rows are used where they are; F16 / BF16 ones are expanded to fp32 first.
      const float* wf = static_cast<const float*>(w.data) + row0 * w.in;
      if (w.dtype != DType::F32 || w.row_bytes != w.in * 4) {
        expand(w, row0, rows, static_cast<float*>(chunk), stream);
        wf = static_cast<const float*>(chunk);
      }
      check_blas(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, cols, k, &one, wf, k,
                             static_cast<const float*>(x), k, &zero, y + row0, ld),
                 "cublasSgemm");
    } else {
      auto* wb = static_cast<__nv_bfloat16*>(chunk);
      expand(w, row0, rows, wb, stream);
      check_blas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, cols, k, &one, wb, CUDA_R_16BF, k, x,
                              CUDA_R_16BF, k, &zero, y + row0, CUDA_R_32F, ld, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    }
  }
}

}  // namespace qwenrt::ops::cuda::mm
