// The arithmetic every kernel that forms a decode row's RMSNorm shares (elementwise.cu's
// rmsnorm_regs_kernel, routing.cuh's add_norm_row, the GEMVs that form their input themselves:
// gemv_resident.cuh's norm_in_shared), so that their h agree bit for bit: a row of dim4 float4s
// summed as kNormRowThreads threads do it (thread t: the squares of float4s t, t + kNormRowThreads,
// ... in order, each float4's four squares as sum_sq4 chains them; then each warp's warp_sum, and
// the warps' sums added in warp order), inv = norm_row_inv(total, dim4, eps), h = v * inv * w.
#pragma once

#include <cstdint>

namespace qwenrt::ops::cuda {

inline constexpr int kNormRowThreads = 256;

// The squares of v's four floats, summed in one fixed order (explicit fused multiply-adds: no
// contraction choice left to the compiler).
__device__ __forceinline__ float sum_sq4(float4 v) {
  return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

__device__ __forceinline__ float norm_row_inv(float total, int64_t dim4, float eps) {
  return 1.0f / sqrtf(total / static_cast<float>(4 * dim4) + eps);
}

__device__ __forceinline__ float4 norm_row_scale(float4 v, float inv, float4 w) {
  return make_float4(__fmul_rn(__fmul_rn(v.x, inv), w.x), __fmul_rn(__fmul_rn(v.y, inv), w.y),
                     __fmul_rn(__fmul_rn(v.z, inv), w.z), __fmul_rn(__fmul_rn(v.w, inv), w.w));
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

}  // namespace qwenrt::ops::cuda
