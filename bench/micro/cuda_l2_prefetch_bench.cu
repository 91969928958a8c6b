// Does pulling a decode GEMV's weights into L2 ahead of it pay? For the shapes of a 35B-A3B
// decode step (Q8_0 DeltaNet projections and output, the F32 router, 8 routed Q4_K experts'
// gate + up), each GEMV at batch 1 is timed alone with CUDA events after a spin kernel that keeps
// the GPU busy without touching memory (the small kernels between two GEMVs of a step), in four
// settings:
//   cold      its weights not in L2 (copies rotated over more than L2 holds);
//   warm      the same weights read by a GEMV just before the spin (the best L2 can do);
//   prefetch  l2_prefetch of its weights launched before the spin;
//   pf-late   l2_prefetch launched right before the GEMV (no spin between them).
//
//   cuda_l2_prefetch_bench [reps] [spin_us,...]   (default 50 reps, spins 5,10,20)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "ops/cuda/kernels.h"

namespace {

using qwenrt::DType;
using namespace qwenrt::ops::cuda;

constexpr int64_t kRotateBytes = 512ll << 20;
constexpr int kExperts = 256, kTopK = 8;

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct Shape {
  const char* name;
  DType type;
  int block_elems, block_bytes;
  bool q8_superblocks;
  int64_t in, out;
  bool experts;  // 8 of 256 experts' gate + up through experts_swiglu
};
const Shape kShapes[] = {
    {"Q8_0 2048x12288 (projections)", DType::Q8_0, 32, 34, true, 2048, 12288, false},
    {"Q8_0 4096x2048 (output)", DType::Q8_0, 32, 34, true, 4096, 2048, false},
    {"F32 2048x256 (router)", DType::F32, 1, 4, false, 2048, 256, false},
    {"Q4_K 2048x512 x8 experts", DType::Q4_K, 256, 144, false, 2048, 512, true},
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  std::vector<int> spins = {5, 10, 20};
  if (argc > 2) spins = parse_int_list(argv[2], 0);
  int dev = 0, clock_khz = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::printf("%-32s %7s %9s %9s %9s %9s\n", "shape", "spin us", "cold us", "warm us", "prefetch",
              "pf-late");
  for (const Shape& s : kShapes) {
    const int64_t row_bytes = s.in / s.block_elems * s.block_bytes;
    const int64_t n_mat = s.experts ? kExperts : 1;
    const int64_t tensor_bytes = row_bytes * s.out * n_mat;
    const int64_t copy_bytes = tensor_bytes * (s.experts ? 2 : 1);
    const int n_copies = static_cast<int>(std::max<int64_t>(2, kRotateBytes / copy_bytes));
    std::vector<void*> gates(n_copies), ups(n_copies, nullptr);
    for (int c = 0; c < n_copies; ++c) {
      BENCH_CUDA(cudaMalloc(&gates[c], tensor_bytes));
      BENCH_CUDA(cudaMemset(gates[c], 0x11, tensor_bytes));
      if (s.experts) {
        BENCH_CUDA(cudaMalloc(&ups[c], tensor_bytes));
        BENCH_CUDA(cudaMemset(ups[c], 0x11, tensor_bytes));
      }
    }
    Matrix w{.dtype = s.type,
             .in = s.in,
             .out = s.out,
             .n_expert = n_mat,
             .row_bytes = row_bytes,
             .expert_bytes = row_bytes * s.out,
             .data = nullptr,
             .q8_superblocks = s.q8_superblocks};
    std::vector<float> hx(s.in);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = float((i * 7919) % 1000) / 500.0f - 1.0f;
    std::vector<int32_t> hids(kTopK);
    for (int j = 0; j < kTopK; ++j) hids[j] = (j * 37 + 5) % kExperts;
    float *x, *y;
    int32_t* ids;
    void* ws;
    const int64_t ws_bytes = std::max<int64_t>(16, matmul_workspace_bytes(w, 1));
    BENCH_CUDA(cudaMalloc(&x, hx.size() * 4));
    BENCH_CUDA(cudaMalloc(&y, int64_t{kTopK} * s.out * 4));
    BENCH_CUDA(cudaMalloc(&ids, kTopK * 4));
    BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
    BENCH_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(ids, hids.data(), kTopK * 4, cudaMemcpyHostToDevice));

    auto gemv = [&](int c) {
      Matrix g = w;
      g.data = gates[c];
      if (s.experts) {
        Matrix u = g;
        u.data = ups[c];
        experts_swiglu(g, u, ids, kTopK, x, y, 1, ws, stream);
      } else {
        matmul(g, x, y, 1, ws, stream);
      }
    };
    auto prefetch = [&](int c) {
      if (!s.experts) {
        l2_prefetch(gates[c], tensor_bytes, stream);
        return;
      }
      for (int j = 0; j < kTopK; ++j) {
        const int64_t off = int64_t{hids[j]} * w.expert_bytes;
        l2_prefetch(static_cast<char*>(gates[c]) + off, w.expert_bytes, stream);
        l2_prefetch(static_cast<char*>(ups[c]) + off, w.expert_bytes, stream);
      }
    };
    for (int spin_us : spins) {
      const long long cycles = static_cast<long long>(spin_us) * clock_khz / 1000;
      auto spin = [&] { spin_kernel<<<1, 32, 0, stream>>>(cycles); };
      // mode 0 cold, 1 warm, 2 prefetch, 3 prefetch late
      double us[4];
      for (int mode = 0; mode < 4; ++mode) {
        double total = 0;
        for (int r = -3; r < reps; ++r) {
          const int c = (r + 3) % n_copies;
          if (mode == 1) gemv(c);
          if (mode == 2) prefetch(c);
          spin();
          if (mode == 3) prefetch(c);
          BENCH_CUDA(cudaEventRecord(start, stream));
          gemv(c);
          BENCH_CUDA(cudaEventRecord(stop, stream));
          BENCH_CUDA(cudaEventSynchronize(stop));
          float ms = 0;
          BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
          if (r >= 0) total += ms;
        }
        us[mode] = 1e3 * total / reps;
      }
      std::printf("%-32s %7d %9.2f %9.2f %9.2f %9.2f\n", s.name, spin_us, us[0], us[1], us[2],
                  us[3]);
    }
    BENCH_CUDA(cudaFree(x));
    BENCH_CUDA(cudaFree(y));
    BENCH_CUDA(cudaFree(ids));
    BENCH_CUDA(cudaFree(ws));
    for (int c = 0; c < n_copies; ++c) {
      BENCH_CUDA(cudaFree(gates[c]));
      if (ups[c]) BENCH_CUDA(cudaFree(ups[c]));
    }
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}
