// What the CUDA matmul tests share (test_cuda_matmul.cpp, test_cuda_gemv_resident.cpp): random
// quantised weights on the host and placed on the device as the backend places them, device
// buffers (NaN-poisoned outputs), and the error measures and tolerances of the int8 paths.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "quant/quant.h"
#include "support/model_files.h"

namespace qwenrt::ops::cuda {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Random weights with per-row scales and a few outliers, quantised with quant/'s reference
// quantisers: [in, out, n_mat] as GGUF stores them.
struct HostWeight {
  std::vector<uint8_t> bytes;
  TensorView view;
  int64_t row_bytes = 0;
};
inline HostWeight make_weight(DType type, int64_t in, int64_t out, int64_t n_mat,
                              std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> row_scale(0.005f, 0.05f);
  std::vector<float> values(in * out * n_mat);
  for (int64_t r = 0; r < out * n_mat; ++r) {
    const float s = row_scale(rng);
    for (int64_t i = 0; i < in; ++i) {
      float v = normal(rng) * s;
      if (rng() % 97 == 0) v *= 6;
      values[r * in + i] = v;
    }
  }
  const auto& tr = traits(type);
  HostWeight w;
  w.row_bytes = in / tr.block_elems * tr.block_bytes;
  w.bytes.resize(w.row_bytes * out * n_mat);
  quant::quantize(type, values.data(), w.bytes.data(), in * out * n_mat);
  w.view = TensorView::contiguous(type, n_mat > 1 ? 3 : 2, {in, out, n_mat, 1}, w.bytes.data());
  return w;
}

inline std::vector<float> random_floats(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

using testing_support::rel_l2;

inline bool int8_path(DType t) {
  return t != DType::F32 && t != DType::F16 && t != DType::BF16;
}
// The error of every output against the scale of its dot product: max |got - want| /
// (|x_r| |w_o|). 8-bit activations in blocks of 32 (scale max/127) leave about 0.006 / sqrt(in)
// of that (Gaussian x), fp32 far less; a wrong decode or index gives ~1. (A relative error per
// shape is a single noisy sample where a shape has one small output: measured on the H200,
// Q4_K in=768 out=1 n=1 gave 2.5 relative with a correct kernel.)
inline double scaled_max_err(const std::vector<float>& got, const std::vector<float>& want,
                             const std::vector<float>& x, const HostWeight& w, int64_t n,
                             int64_t in, int64_t out) {
  std::vector<float> wf(in * out);
  qwenrt::quant::dequantize(w.view.dtype, w.view.data, wf.data(), in * out);
  double worst = 0;
  for (int64_t r = 0; r < n; ++r) {
    double xx = 0;
    for (int64_t i = 0; i < in; ++i) xx += double(x[r * in + i]) * x[r * in + i];
    for (int64_t o = 0; o < out; ++o) {
      double ww = 0;
      for (int64_t i = 0; i < in; ++i) ww += double(wf[o * in + i]) * wf[o * in + i];
      const double d = std::fabs(double(got[r * out + o]) - want[r * out + o]);
      const double e = d / std::max(std::sqrt(xx * ww), 1e-30);
      worst = std::isnan(e) ? 1e30 : std::max(worst, e);  // NaN: an unwritten element
    }
  }
  return worst;
}
inline double scaled_tol(DType t) {
  return int8_path(t) ? 5e-3 : 1e-6;
}

// Device memory owned by a test.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(int64_t bytes) {
    if (cudaMalloc(&ptr, std::max<int64_t>(bytes, 16)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(ptr); }
};
inline std::unique_ptr<DeviceBuffer> to_device(const void* host, int64_t bytes) {
  auto b = std::make_unique<DeviceBuffer>(bytes);
  if (b->ptr && bytes > 0) cudaMemcpy(b->ptr, host, bytes, cudaMemcpyHostToDevice);
  return b;
}
inline std::unique_ptr<DeviceBuffer> poisoned(int64_t n_floats) {
  const std::vector<float> nan(n_floats, kNaN);
  return to_device(nan.data(), n_floats * 4);
}
inline std::vector<float> to_host(const DeviceBuffer& b, int64_t n_floats) {
  std::vector<float> h(n_floats, kNaN);
  if (cudaDeviceSynchronize() == cudaSuccess)
    cudaMemcpy(h.data(), b.ptr, n_floats * 4, cudaMemcpyDeviceToHost);
  return h;
}

inline Matrix device_matrix(const HostWeight& w, const DeviceBuffer& data) {
  return Matrix{.dtype = w.view.dtype,
                .in = w.view.ne[0],
                .out = w.view.ne[1],
                .n_expert = w.view.ne[2],
                .row_bytes = w.row_bytes,
                .expert_bytes = w.row_bytes * w.view.ne[1],
                .data = data.ptr};
}

// A weight as the backend places it: Q8_0 rows of whole superblocks repacked on the device
// (repack_q8_0_superblocks), every other type as it is.
struct PlacedWeight {
  std::unique_ptr<DeviceBuffer> data;
  Matrix m;
};
inline PlacedWeight place_weight(const HostWeight& w, bool q8_superblocks) {
  PlacedWeight p;
  p.data = to_device(w.bytes.data(), int64_t(w.bytes.size()));
  p.m = device_matrix(w, *p.data);
  if (q8_superblocks) {
    auto packed = std::make_unique<DeviceBuffer>(int64_t(w.bytes.size()));
    repack_q8_0_superblocks(p.data->ptr, packed->ptr, int64_t(w.bytes.size()), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    p.data = std::move(packed);
    p.m.data = p.data->ptr;
    p.m.q8_superblocks = true;
  }
  return p;
}

// `in` per type: the block size times an odd number (F32 / F16 / BF16: any length).
inline std::vector<int64_t> ins_for(DType t) {
  const uint32_t bs = traits(t).block_elems;
  if (bs == 256) return {256 * 3, 256 * 1};
  if (t == DType::Q8_0) return {32 * 5, 32 * 9, 256 * 3};  // 768: placed as superblocks
  if (bs == 32) return {32 * 5, 32 * 9};
  return {5, 37, 64};
}

inline std::vector<float> silu_mul_ref(const std::vector<float>& g, const std::vector<float>& u) {
  std::vector<float> out(g.size());
  ref::silu_mul(g.data(), u.data(), out.data(), int64_t(g.size()));
  return out;
}

}  // namespace qwenrt::ops::cuda
