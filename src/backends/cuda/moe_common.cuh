// Device helpers shared by the MoE expert kernels (moe_kernels.cu: the generic per-pair and
// grouped kernels; moe_decode.cu: the decode kernels), so that every path tests a pair's
// activity and applies SwiGLU with the same expressions and agrees bit for bit.
#pragma once

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

// Pair p still to compute in this phase: not done (done == null: no flags, the fully
// resident launch) and its expert available.
__device__ __forceinline__ bool pair_active(const int32_t* ids, const ExpertRef* table, const uint8_t* done,
                                            int64_t p) {
  return (done == nullptr || done[p] == 0) && table[ids[p]].wtype != WType::unavailable;
}

// silu(g) * u, as launch_swiglu.
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

}  // namespace sluice::cuda
