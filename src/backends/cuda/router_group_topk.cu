// Group-limited sigmoid routing on the device (router_group_topk.h): one warp a row. Lane l
// holds experts l, l + 32, ... (NV of them): score s = sigmoid(logit), choice value c = s +
// bias. With groups, the row's choice values go to shared memory, lane g scores groups g, g +
// 32, ... (the sum of each group's two best, scanned in expert order as the CPU scans), and
// topk_group rounds of a warp arg-max (equal values: the lower group) keep the best groups;
// then k rounds of a warp arg-max over the open experts (equal values: the lower id), each
// carrying the winner's score, which lane r keeps for rank r and every lane adds to the sum in
// rank order. core/router_group.h's helpers make every rounding the CPU's (route_topk).
#include "backends/cuda/router_group_topk.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "core/router_group.h"

namespace sluice::cuda {
namespace {

constexpr int kRowsABlock = 4;         // warps (rows) a block
constexpr int kMaxExperts = 512;
constexpr int kMaxGroups = 256;

// The warp's best (value, id) with its score, the lower id first among equal values, in every lane.
__device__ __forceinline__ void warp_best(float& v, int32_t& id, float& s) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    const float os = __shfl_xor_sync(0xffffffffu, s, o);
    if (ov > v || (ov == v && oi < id)) {
      v = ov;
      id = oi;
      s = os;
    }
  }
}

template <int NV>
__global__ void __launch_bounds__(kRowsABlock * 32)
    router_group_topk_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k, bool norm,
                             RouterGroupParams g, int32_t* __restrict__ ids, float* __restrict__ weights,
                             RoutingCopy copy) {
  namespace rg = router_group;
  chained_kernel_entry();
  __shared__ float choice[kRowsABlock][kMaxExperts];
  __shared__ bool kept[kRowsABlock][kMaxGroups];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsABlock + warp;
  if (row >= n) return;
  const float* l = logits + row * E;
  float s[NV], c[NV];
  uint32_t open = 0;  // bit i: expert lane + 32 i exists, is in a kept group and not yet taken
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t e = lane + 32 * i;
    s[i] = e < E ? rg::sigmoid(l[e]) : 0.0f;
    c[i] = e < E ? rg::choice_value(s[i], g.score_bias ? g.score_bias[e] : 0.0f) : 0.0f;
    open |= e < E ? 1u << i : 0u;
  }
  if (g.n_group > 1) {
    const int64_t G = g.n_group, per = E / G;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (lane + 32 * i < E) choice[warp][lane + 32 * i] = c[i];
    for (int64_t j = lane; j < G; j += 32) kept[warp][j] = false;
    __syncwarp();
    // Rounds of the warp's best remaining group; lane l scores groups l, l + 32, ...
    for (int64_t r = 0; r < g.topk_group; ++r) {
      float best = -INFINITY;
      int32_t best_id = INT32_MAX;
      float unused = 0.0f;
      for (int64_t j = lane; j < G; j += 32) {
        if (kept[warp][j]) continue;
        float b1 = -INFINITY, b2 = -INFINITY;  // the group's two best, in expert order as the CPU
        for (int64_t e = j * per; e < (j + 1) * per; ++e) {
          const float v = choice[warp][e];
          if (v > b1) {
            b2 = b1;
            b1 = v;
          } else if (v > b2) {
            b2 = v;
          }
        }
        const float gv = rg::group_value(b1, b2);
        if (best_id == INT32_MAX || gv > best) {  // ascending groups per lane: the first of equals
          best = gv;
          best_id = static_cast<int32_t>(j);
        }
      }
      warp_best(best, best_id, unused);
      if (lane == 0) kept[warp][best_id] = true;
      __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if ((open >> i & 1u) && !kept[warp][(lane + 32 * i) / per]) open &= ~(1u << i);
  }
  float sum = 0.0f, mine_s = 0.0f;
  int32_t mine_id = 0;
  for (int64_t r = 0; r < k; ++r) {
    float best = -INFINITY, best_s = 0.0f;
    int32_t best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if ((open >> i & 1u) && (best_id == INT32_MAX || c[i] > best)) {  // ascending ids per lane
        best = c[i];
        best_s = s[i];
        best_id = lane + 32 * i;
      }
    warp_best(best, best_id, best_s);
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (lane + 32 * i == best_id) open &= ~(1u << i);
    if (lane == r) {
      mine_id = best_id;
      mine_s = best_s;
    }
    sum = rg::add(sum, best_s);  // in rank order, as the CPU sums
  }
  if (lane < k) {
    const float w = rg::weight(mine_s, sum, norm, g.norm_eps, g.routed_scaling_factor);
    ids[row * k + lane] = mine_id;
    weights[row * k + lane] = w;
    if (copy.ids != nullptr) {
      copy.ids[row * k + lane] = mine_id;
      copy.weights[row * k + lane] = w;
      __threadfence_system();  // in host memory before whatever signals the host after this kernel
    }
  }
}

}  // namespace

bool router_group_topk_supported(int64_t n_expert, int64_t k, int64_t n_group) {
  return n_expert > 0 && n_expert <= kMaxExperts && k > 0 && k <= 32 && k <= n_expert && n_group >= 1 &&
         n_group <= kMaxGroups && n_expert % n_group == 0 && (n_group == 1 || n_expert / n_group >= 2);
}

void launch_router_group_topk(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool norm,
                              const RouterGroupParams& g, int32_t* ids, float* weights, Stream s, RoutingCopy copy) {
  SLUICE_CHECK(router_group_topk_supported(n_expert, k, g.n_group) && g.topk_group >= 1 && g.topk_group <= g.n_group,
               Status::unsupported, "cuda router_group_topk: ", n_expert, " experts in ", g.n_group, " groups (keep ",
               g.topk_group, "), top-", k, " (at most ", kMaxExperts, " experts, ", kMaxGroups,
               " groups of at least 2, top-32)");
  if (n == 0) return;
  const dim3 grid(blocks_for(n, kRowsABlock)), block(kRowsABlock * 32);
  const auto st = static_cast<cudaStream_t>(s);
  if (n_expert <= 64)
    launch_chained(router_group_topk_kernel<2>, grid, block, 0, st, logits, n, n_expert, k, norm, g, ids, weights, copy);
  else if (n_expert <= 128)
    launch_chained(router_group_topk_kernel<4>, grid, block, 0, st, logits, n, n_expert, k, norm, g, ids, weights, copy);
  else if (n_expert <= 256)
    launch_chained(router_group_topk_kernel<8>, grid, block, 0, st, logits, n, n_expert, k, norm, g, ids, weights, copy);
  else
    launch_chained(router_group_topk_kernel<16>, grid, block, 0, st, logits, n, n_expert, k, norm, g, ids, weights,
                   copy);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
