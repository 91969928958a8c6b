// Weight-streaming bandwidth of the CUDA GEMV kernels (ops/cuda/matmul.cu) for batch-1..8 decode:
// for every type with a kernel, the shapes that dominate a decode step (lm head 2048 x 248320,
// FFN up 5120 x 17408 (alone and as a SwiGLU gate + up pair) and down 17408 x 5120, a 5120 x 10240
// projection group, and 8 routed 2048 x 512 experts through
// experts_swiglu), n = 1, 4, 8 activation rows. Each launch is timed with CUDA events over many
// reps that rotate among enough weight copies to exceed the 60 MB L2, and reported as weight
// bytes per second and the share of the card's bandwidth: 4.27 TB/s (the H200's measured copy
// bandwidth), 3.35 TB/s on an H100 (its rated HBM3 bandwidth), or QWENRT_BENCH_PEAK_GBS.
//
//   cuda_gemv_bench [reps] [rows]   (default 50 reps; rows: n values, default 1,4,8)
// QWENRT_BENCH_TYPES=Q4_K,Q8_0sb limits the types. With n >= 32 the launchers run the prefill GEMM
// (QWENRT_CUDA_GEMM_ROWS=0 keeps them on the GEMV kernels): the last column is then TFLOP/s.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "ops/cuda/kernels.h"

namespace {

using qwenrt::DType;
using namespace qwenrt::ops::cuda;

// The bandwidth "% peak" is against (GB/s): QWENRT_BENCH_PEAK_GBS, else by the device's name.
double roofline_gbs(const char* device_name) {
  if (const char* v = std::getenv("QWENRT_BENCH_PEAK_GBS"); v && std::atof(v) > 0)
    return std::atof(v);
  return std::strstr(device_name, "H100") ? 3350.0 : 4270.0;
}
constexpr int64_t kRotateBytes = 256ll << 20;  // rotate over at least this much weight data
constexpr int64_t kMaxCopyBytes = 6ll << 30;   // but hold no more than this at once

struct TypeInfo {
  DType type;
  const char* name;
  int block_elems, block_bytes;
  bool q8_superblocks = false;  // Q8_0 as the backend places it (repacked at load)
};
const TypeInfo kTypes[] = {{DType::Q4_K, "Q4_K", 256, 144}, {DType::Q5_K, "Q5_K", 256, 176},
                           {DType::Q6_K, "Q6_K", 256, 210}, {DType::IQ4_XS, "IQ4_XS", 256, 136},
                           {DType::Q8_0, "Q8_0", 32, 34},   {DType::Q8_0, "Q8_0sb", 32, 34, true},
                           {DType::Q4_0, "Q4_0", 32, 18},   {DType::F16, "F16", 1, 2},
                           {DType::BF16, "BF16", 1, 2},     {DType::F32, "F32", 1, 4}};

struct Shape {
  const char* name;
  int64_t in, out;
  bool experts;         // 8 routed experts of 256 per row through experts_swiglu (gate + up)
  bool swiglu = false;  // a dense gate and up pair through matmul_swiglu
};
const Shape kShapes[] = {{"2048x248320", 2048, 248320, false},
                         {"5120x17408", 5120, 17408, false},
                         {"5120x17408 swiglu", 5120, 17408, false, true},
                         {"17408x5120", 17408, 5120, false},
                         {"5120x10240", 5120, 10240, false},
                         {"2048x512 x8 experts", 2048, 512, true}};
constexpr int kExperts = 256, kTopK = 8;

// One weight copy: a matrix (or a gate and an up expert tensor) filled with a constant byte,
// which decodes to small finite values for every type.
struct Copy {
  void* gate = nullptr;
  void* up = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  std::vector<int> rows_list = {1, 4, 8};
  if (argc > 2) rows_list = parse_int_list(argv[2], 1);
  const char* type_filter = std::getenv("QWENRT_BENCH_TYPES");
  auto wanted = [&](const char* name) {
    if (type_filter == nullptr || *type_filter == '\0') return true;
    const std::string list = std::string(",") + type_filter + ",";
    return list.find(std::string(",") + name + ",") != std::string::npos;
  };
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));

  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double peak_gbs = roofline_gbs(prop.name);
  std::printf("# %s, %% peak of %.0f GB/s\n", prop.name, peak_gbs);
  std::printf("%-8s %-20s %4s %10s %9s %7s %8s\n", "type", "shape", "n", "us/launch", "GB/s",
              "% peak", "TFLOP/s");
  for (const Shape& s : kShapes) {
    for (const TypeInfo& t : kTypes) {
      if (!wanted(t.name)) continue;
      const int64_t row_bytes = s.in / t.block_elems * t.block_bytes;
      const int64_t n_mat = s.experts ? kExperts : 1;
      const int64_t tensor_bytes = row_bytes * s.out * n_mat;
      const bool pair = s.experts || s.swiglu;
      const int64_t copy_bytes = tensor_bytes * (pair ? 2 : 1);
      int n_copies =
          static_cast<int>(std::max<int64_t>(2, (kRotateBytes + copy_bytes - 1) / copy_bytes));
      n_copies = static_cast<int>(
          std::min<int64_t>(n_copies, std::max<int64_t>(1, kMaxCopyBytes / copy_bytes)));
      std::vector<Copy> copies(n_copies);
      for (Copy& c : copies) {
        BENCH_CUDA(cudaMalloc(&c.gate, tensor_bytes));
        BENCH_CUDA(cudaMemset(c.gate, 0x11, tensor_bytes));
        if (pair) {
          BENCH_CUDA(cudaMalloc(&c.up, tensor_bytes));
          BENCH_CUDA(cudaMemset(c.up, 0x11, tensor_bytes));
        }
      }
      for (int n : rows_list) {
        Matrix w{.dtype = t.type,
                 .in = s.in,
                 .out = s.out,
                 .n_expert = n_mat,
                 .row_bytes = row_bytes,
                 .expert_bytes = row_bytes * s.out,
                 .data = nullptr,
                 .q8_superblocks = t.q8_superblocks};
        const int64_t x_rows = n;
        const int64_t y_rows = s.experts ? int64_t{n} * kTopK : n;  // swiglu: [n, out] as well
        std::vector<float> hx(x_rows * s.in);
        for (size_t i = 0; i < hx.size(); ++i) hx[i] = float((i * 7919) % 1000) / 500.0f - 1.0f;
        // Distinct experts for every (row, choice), so each pair streams its own weights.
        std::vector<int32_t> hids(int64_t{n} * kTopK);
        for (size_t i = 0; i < hids.size(); ++i)
          hids[i] = static_cast<int32_t>((i * 37) % kExperts);
        float *x, *y;
        int32_t* ids;
        void* ws;
        const int64_t ws_bytes =
            std::max<int64_t>({16, matmul_workspace_bytes(w, x_rows),
                               s.experts ? 0 : matmul_swiglu_workspace_bytes(w, x_rows)});
        BENCH_CUDA(cudaMalloc(&x, hx.size() * 4));
        BENCH_CUDA(cudaMalloc(&y, y_rows * s.out * 4));
        BENCH_CUDA(cudaMalloc(&ids, hids.size() * 4));
        BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
        BENCH_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(ids, hids.data(), hids.size() * 4, cudaMemcpyHostToDevice));

        auto launch = [&](int rep) {
          const Copy& c = copies[rep % n_copies];
          Matrix gw = w;
          gw.data = c.gate;
          if (s.experts) {
            Matrix uw = gw;
            uw.data = c.up;
            experts_swiglu(gw, uw, ids, kTopK, x, y, n, ws, stream);
          } else if (s.swiglu) {
            Matrix uw = gw;
            uw.data = c.up;
            matmul_swiglu(gw, uw, x, y, n, ws, stream);
          } else {
            matmul(gw, x, y, n, ws, stream);
          }
        };
        for (int r = 0; r < n_copies + 2; ++r) launch(r);  // warm-up
        BENCH_CUDA(cudaEventRecord(start, stream));
        for (int r = 0; r < reps; ++r) launch(r);
        BENCH_CUDA(cudaEventRecord(stop, stream));
        BENCH_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
        const double us = 1e3 * ms / reps;
        // Weight bytes one launch reads: the matrix, or gate + up of n * 8 experts.
        const double bytes = s.experts  ? 2.0 * n * kTopK * row_bytes * s.out
                             : s.swiglu ? 2.0 * row_bytes * s.out
                                        : double(row_bytes) * s.out;
        const double gbs = bytes / (us * 1e-6) / 1e9;
        const double flops = 2.0 * n * s.in * s.out * (pair ? 2 : 1) * (s.experts ? kTopK : 1);
        std::printf("%-8s %-20s %4d %10.2f %9.1f %6.1f%% %8.1f\n", t.name, s.name, n, us, gbs,
                    100.0 * gbs / peak_gbs, flops / (us * 1e-6) / 1e12);
        BENCH_CUDA(cudaFree(x));
        BENCH_CUDA(cudaFree(y));
        BENCH_CUDA(cudaFree(ids));
        BENCH_CUDA(cudaFree(ws));
      }
      for (Copy& c : copies) {
        BENCH_CUDA(cudaFree(c.gate));
        if (c.up) BENCH_CUDA(cudaFree(c.up));
      }
    }
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}
