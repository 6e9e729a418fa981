// The router's softmax top-k of one row in one warp's registers: the body of the decode
// top-k kernel (router_kernels.cu), bit for bit the shared-memory kernel's. Device code only;
// included by .cu files.
#pragma once

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace sluice::cuda {

// The warp's largest (value, id), the lower id first among equal values, in every lane.
__device__ __forceinline__ void warp_argmax(float& best, int32_t& best_id) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (ob > best || (ob == best && oi < best_id)) {
      best = ob;
      best_id = oi;
    }
  }
}

// route_topk's softmax routing of one row, E <= 32 NV experts, k <= 32, all 32 lanes of a warp:
// ids[r], weights[r] for the ranks r < k (ids and weights point at the row's k entries, global
// or shared memory). Lane l holds experts l, l + 32, ...; the warp's arg-max leaves each round's
// winner in every lane, lane r keeps round r's, and the k results go out in one store, so a
// round costs only its shuffles. f32 softmax over all experts, the k largest probabilities
// (equal values: the lower id first), renormalized to sum 1 when norm, then (expert_scale not
// null) times the expert's scale, one rounding: the values and order of router_topk_kernel,
// the same bits.
template <int NV>
__device__ __forceinline__ void router_topk_warp(const float* __restrict__ l, int64_t E, int64_t k, bool norm,
                                                 int32_t* ids, float* weights, const float* __restrict__ expert_scale) {
  const int lane = threadIdx.x % 32;
  float p[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) p[i] = lane + 32 * i < E ? l[lane + 32 * i] : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < NV; ++i)
    if (lane + 32 * i < E) mx = fmaxf(mx, p[i]);
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < NV; ++i)
    if (lane + 32 * i < E) {
      p[i] = expf(p[i] - mx);
      sum += p[i];
    }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < NV; ++i) p[i] = lane + 32 * i < E ? p[i] / sum : -3.0f;  // past E: never taken
  float top_sum = 0.0f, mine = 0.0f;
  int32_t mine_id = 0;
  for (int64_t r = 0; r < k; ++r) {
    float best = -1.0f;
    int32_t best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (p[i] > best) {  // ascending expert per lane: the first of equal values is the lowest id
        best = p[i];
        best_id = lane + 32 * i;
      }
    warp_argmax(best, best_id);
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (lane + 32 * i == best_id) p[i] = -2.0f;  // taken; probabilities are >= 0
    if (lane == r) {
      mine = best;
      mine_id = best_id;
    }
    top_sum += best;  // in rank order, as the CPU sums
  }
  if (lane < k) {
    ids[lane] = mine_id;
    const float w = norm ? mine / top_sum : mine;
    weights[lane] = expert_scale != nullptr ? __fmul_rn(w, expert_scale[mine_id]) : w;
  }
}

// The NV of router_topk_warp for E experts (E <= 512), as the decode top-k launcher picks it.
#define SLUICE_WITH_TOPK_NV(E, ...)                                    \
  if ((E) <= 64) { constexpr int NV = 2; __VA_ARGS__; }               \
  else if ((E) <= 128) { constexpr int NV = 4; __VA_ARGS__; }         \
  else if ((E) <= 256) { constexpr int NV = 8; __VA_ARGS__; }         \
  else { constexpr int NV = 16; __VA_ARGS__; }

}  // namespace sluice::cuda
