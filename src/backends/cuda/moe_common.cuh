// Device helpers shared by the MoE expert kernels (moe_kernels.cu: the generic per-pair and
// grouped kernels; moe_decode.cu: the decode kernels), so that every path tests a pair's
// activity and applies SwiGLU with the same expressions and agrees bit for bit.
#pragma once

#include "backends/cuda/activations.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

// Pair p still to compute in this phase: not done (done == null: no flags, the fully
// resident launch) and its expert available.
__device__ __forceinline__ bool pair_active(const int32_t* ids, const ExpertRef* table, const uint8_t* done,
                                            int64_t p) {
  return (done == nullptr || done[p] == 0) && table[ids[p]].wtype != WType::unavailable;
}

// An expert's activation of ff row j from its gate and up dots: the biases added first (as
// add_bias does after the generic products), then SwiGLU, the clamped variant or GeGLU (gelu
// then one rounded product, as the CPU's activate + mul). Every expert kernel writes act
// through this, so that they agree bit for bit.
__device__ __forceinline__ float expert_gate_up(const ExpertRef& ref, int64_t j, float g, float u) {
  if (ref.bias[0] != nullptr) g += ref.bias[0][j];
  if (ref.bias[1] != nullptr) u += ref.bias[1][j];
  switch (ref.act) {
    case ExpertAct::swiglu_clamped: return swiglu_clamped(g, u, ref.alpha, ref.limit);
    case ExpertAct::geglu_tanh: return __fmul_rn(gelu_tanh(g), u);
    default: return swiglu(g, u);
  }
}

// An expert's output row i from its down dot: the down bias added (before the routing weight).
__device__ __forceinline__ float expert_down(const ExpertRef& ref, int64_t i, float y) {
  return ref.bias[2] != nullptr ? y + ref.bias[2][i] : y;
}

// The combine of a down + combine block over the embd rows i0 .. i0 + rows - 1 of batch row
// `row`: out[row, i0 + t] = the rank sums ys[rank * rows + t] weighted and added in rank
// order with moe_combine_done_kernel's fmaf (weights null: 1). Threads t < rows of the block, after a barrier.
__device__ __forceinline__ void combine_ranks(const float* ys, int rows, const float* __restrict__ weights,
                                              int64_t row, int64_t k, int64_t i0, int64_t n_embd,
                                              float* __restrict__ out) {
  const int t = static_cast<int>(threadIdx.x);
  if (t >= rows || i0 + t >= n_embd) return;
  float acc = 0.0f;
  for (int64_t rank = 0; rank < k; ++rank)
    acc = fmaf(weights != nullptr ? weights[row * k + rank] : 1.0f, ys[rank * rows + t], acc);  // null: 1, as the other combines
  out[row * n_embd + i0 + t] = acc;
}

}  // namespace sluice::cuda
