// The arithmetic every kernel that forms a decode row's RMSNorm shares (elementwise.cu's
// rmsnorm_regs_kernel, routing.cuh's add_norm_row, the GEMVs that form their input themselves:
// gemv_resident.cuh's norm_in_shared), so that their h agree bit for bit: a row of dim4 float4s
// summed as kNormRowThreads threads do it (thread t: the squares of float4s t, t + kNormRowThreads,
// ... in order, each float4's four squares as sum_sq4 adds them; then each warp's warp_sum, and
// the warps' sums added in warp order), inv = norm_row_inv(total, dim4, eps), h = v * inv * w.
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

// The squares of v's four floats summed, in the expression rmsnorm_regs_kernel always had, so its
// floats stay what they were. Whether the compiler contracts it into the same fused multiply-adds
// in every kernel that inlines it is what the GPU tests check (they hold those kernels' h equal
// bit for bit).
__device__ __forceinline__ float sum_sq4(float4 v) {
  return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

__device__ __forceinline__ float norm_row_inv(float total, int64_t dim4, float eps) {
  return 1.0f / sqrtf(total / (4 * dim4) + eps);
}

__device__ __forceinline__ float4 norm_row_scale(float4 v, float inv, float4 w) {
  return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

}  // namespace qwenrt::ops::cuda
