// One row's rms_norm by one block of kNormThreads threads, as a device function: the body of
// norm.cu's vectorized kernel, and the epilogue of kernels whose last block norms the row
// they finished (matvec.cu: the output projection's residual add and the next layer's norm).
// Rows of up to kNormThreads * 4 * kNormMaxVec floats, 16-byte aligned with cols % 4 == 0
// (every model width): each thread loads its float4s of the row (and of add) before it uses
// any, so a row costs one memory round trip.
#pragma once

#include "backends/cuda/common.cuh"

namespace sluice::cuda {

constexpr int kNormThreads = 256;
constexpr int kNormMaxVec = 8;

__device__ __forceinline__ bool norm_row_vec_ok(int64_t cols) {
  return cols % 4 == 0 && cols <= int64_t{kNormThreads} * 4 * kNormMaxVec;
}

// add != null: x += add first (add_rms_norm). Then y = x * rsqrt(mean(x^2) + eps) * w (w may
// be null). kFromL2: x is read past the L1 (written by other blocks of this kernel).
// Called by all kNormThreads threads of the block.
template <WType T, bool kFromL2 = false>
__device__ __forceinline__ void rms_norm_row_vec(float* x, const float* __restrict__ add, const void* __restrict__ w,
                                                 float* y, int64_t cols, float eps) {
  __shared__ float partial[kNormThreads / 32];
  float4* xr = reinterpret_cast<float4*>(x);
  float4* yr = reinterpret_cast<float4*>(y);
  const int64_t n4 = cols / 4;
  float4 v[kNormMaxVec], a[kNormMaxVec];
#pragma unroll
  for (int i = 0; i < kNormMaxVec; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c < n4) {
      if constexpr (kFromL2) v[i] = __ldcg(xr + c);
      else v[i] = xr[c];
      if (add) a[i] = reinterpret_cast<const float4*>(add)[c];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormMaxVec; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c >= n4) continue;
    if (add) {
      v[i] = make_float4(v[i].x + a[i].x, v[i].y + a[i].y, v[i].z + a[i].z, v[i].w + a[i].w);
      xr[c] = v[i];
    }
    ss = fmaf(v[i].x, v[i].x, ss);
    ss = fmaf(v[i].y, v[i].y, ss);
    ss = fmaf(v[i].z, v[i].z, ss);
    ss = fmaf(v[i].w, v[i].w, ss);
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormThreads / 32; ++i) total += partial[i];
  const float inv = rsqrtf(total / static_cast<float>(cols) + eps);
#pragma unroll
  for (int i = 0; i < kNormMaxVec; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kNormThreads;
    if (c >= n4) continue;
    float4 o = make_float4(v[i].x * inv, v[i].y * inv, v[i].z * inv, v[i].w * inv);
    if (w) {
      o.x *= load_w<T>(w, 4 * c);
      o.y *= load_w<T>(w, 4 * c + 1);
      o.z *= load_w<T>(w, 4 * c + 2);
      o.w *= load_w<T>(w, 4 * c + 3);
    }
    yr[c] = o;
  }
}

}  // namespace sluice::cuda
