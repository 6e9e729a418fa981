// The device top-k of group-limited sigmoid routing (RouterScoring::sigmoid_grouped:
// DeepSeek-V3, Kimi K2, GLM-4.5, MiniMax-M2), router_group_topk.cu. Plain C++ declarations like
// kernels.h: pointers are device memory, sizes in elements, everything enqueued on `s`.
#pragma once

#include <cstdint>

#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

// The group routing's parameters (core/router_scoring.h's GroupedRouting, which the .cu files
// cannot include) and one layer's correction bias.
struct RouterGroupParams {
  int64_t n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  float norm_eps = 0.0f;
  const float* score_bias = nullptr;  // [n_expert] f32, or null: no bias
};

// Experts, top-k and groups the kernel serves: n_expert <= 512 in n_group groups of at least
// 2 (n_group <= 256), k <= 32.
bool router_group_topk_supported(int64_t n_expert, int64_t k, int64_t n_group);

// ids[n, k] (i32) and weights[n, k] (f32) = route_topk's sigmoid_grouped routing of
// logits[n, n_expert] (experts/routing.cpp), the same ids and weights bit for bit: one warp a
// row, core/router_group.h's arithmetic in the CPU's order. norm: renormalize (norm_topk_prob).
// copy: as launch_router_topk's.
void launch_router_group_topk(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool norm,
                              const RouterGroupParams& g, int32_t* ids, float* weights, Stream s,
                              RoutingCopy copy = {});

}  // namespace sluice::cuda
