// Common header of the CUDA backend's kernels: the CUDA runtime, the error check, dtype
// loads to f32, and warp reductions. Kernels include only this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

#include "backends/cuda/cuda_check.h"

namespace sluice::cuda {

// Weight element types a kernel can read (template parameter of the weight loaders).
enum class WType : int { f32 = 0, f16 = 1, bf16 = 2 };

template <WType T> __device__ __forceinline__ float load_w(const void* p, int64_t i);
template <> __device__ __forceinline__ float load_w<WType::f32>(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
template <> __device__ __forceinline__ float load_w<WType::f16>(const void* p, int64_t i) {
  return __half2float(static_cast<const __half*>(p)[i]);
}
template <> __device__ __forceinline__ float load_w<WType::bf16>(const void* p, int64_t i) {
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace sluice::cuda
