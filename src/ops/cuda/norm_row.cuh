// The arithmetic every kernel that forms a decode row's RMSNorm shares (elementwise.cu's
// rmsnorm_regs_kernel, routing.cuh's add_norm_row, used by moe.cu's norm_route_kernel and
// moe_fused.cu), so that their h agree bit for bit: a row of dim4 float4s
// summed as kNormRowThreads threads do it (thread t: the squares of float4s t, t + kNormRowThreads,
// ... in order, add_sq4; then each warp's warp_sum, and the warps' sums added in warp order),
// inv = norm_row_inv(total, dim4, eps), h = v * inv * w.
#pragma once

#include <cstdint>

namespace qwenrt::ops::cuda {

inline constexpr int kNormRowThreads = 256;
inline constexpr int kNormRowMaxVec = 8;  // float4s a thread, at most

// The rows this layout takes: whole float4s for every thread, up to kNormRowMaxVec each (the model
// widths 2048..5120; 16-byte alignment is the caller's to check).
__host__ __device__ constexpr bool norm_row_fits(int64_t dim) {
  return dim % (4 * kNormRowThreads) == 0 && dim <= 4 * kNormRowThreads * kNormRowMaxVec;
}

// Every float operation below is spelled out (the _rn intrinsics, which the compiler neither
// contracts into fused multiply-adds nor reorders), so each kernel that inlines them computes the
// same floats. Written as plain expressions they did not: on the GPU the routing kernel's h once
// differed from rmsnorm_regs_kernel's (session 36's tests), the compiler's contraction choice
// differing per kernel; spelled out, they agree bit for bit.

// The squares of v's four floats summed: ((x * x + y * y) + z * z) + w * w, each add fused with
// the multiply beside it.
__device__ __forceinline__ float sum_sq4(float4 v) {
  return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

// A thread's running sum of squares with one more float4.
__device__ __forceinline__ float add_sq4(float ss, float4 v) {
  return __fadd_rn(ss, sum_sq4(v));
}

__device__ __forceinline__ float norm_row_inv(float total, int64_t dim4, float eps) {
  const float mean = __fdiv_rn(total, static_cast<float>(4 * dim4));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

__device__ __forceinline__ float norm_row_scale1(float v, float inv, float w) {
  return __fmul_rn(__fmul_rn(v, inv), w);
}

__device__ __forceinline__ float4 norm_row_scale(float4 v, float inv, float4 w) {
  return make_float4(norm_row_scale1(v.x, inv, w.x), norm_row_scale1(v.y, inv, w.y),
                     norm_row_scale1(v.z, inv, w.z), norm_row_scale1(v.w, inv, w.w));
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                     __fadd_rn(a.w, b.w));
}

}  // namespace qwenrt::ops::cuda
