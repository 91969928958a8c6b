// What the CUDA micro-benchmarks (bench/micro/cuda_*.cu) share: a checked CUDA call and a
// comma-separated list of integers from the command line.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define BENCH_CUDA(expr)                                                                     \
  do {                                                                                       \
    const cudaError_t bench_err_ = (expr);                                                   \
    if (bench_err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(bench_err_), \
                   __FILE__, __LINE__);                                                      \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// "1,4,8" -> {1, 4, 8}, each at least `min`.
inline std::vector<int> parse_int_list(const char* p, int min) {
  std::vector<int> out;
  while (*p) {
    out.push_back(std::max(min, std::atoi(p)));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}
