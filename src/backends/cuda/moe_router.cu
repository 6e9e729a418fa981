// The router's top-k on the device (moe_kernels.h): softmax top-k (a warp a row, the row's
// probabilities in shared memory or, up to 512 experts and top-32, in registers:
// router_topk.cuh) and sigmoid top-k (Llama 4), each row's ids and weights also copied to the
// CUDA streamer's host-mapped memory when asked; and the experts' inputs scaled by the
// routing weights (Llama 4).
#include "backends/cuda/moe_kernels.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/router_topk.cuh"

namespace sluice::cuda {
namespace {

constexpr int kRouterWarps = 4;  // rows per router block

// The row's k ids and weights, once the warp wrote them, copied to `copy` (the streamer's
// host-mapped handshake memory: the host reads the routing there without a device-to-host
// copy on the stream); nothing when copy.ids is null. The whole warp calls it.
__device__ __forceinline__ void copy_routing_row(const int32_t* ids, const float* weights, RoutingCopy copy,
                                                 int64_t row, int64_t k) {
  if (copy.ids == nullptr) return;
  __syncwarp();  // the lanes' (or lane 0's) stores of the row are visible to the warp
  for (int64_t r = threadIdx.x % 32; r < k; r += 32) {
    copy.ids[row * k + r] = ids[row * k + r];
    copy.weights[row * k + r] = weights[row * k + r];
  }
  __threadfence_system();  // in host memory before whatever signals the host after this kernel
}

// One warp per row: softmax over n_expert logits (kept in shared memory), then k rounds of a
// warp arg-max (equal probabilities: the lower expert id), as route_topk does.
__global__ void router_topk_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k, bool norm,
                                   int32_t* __restrict__ ids, float* __restrict__ weights,
                                   const float* __restrict__ expert_scale, RoutingCopy copy) {
  chained_kernel_entry();
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= n) return;
  float* p = smem + static_cast<int64_t>(warp) * E;
  const float* l = logits + row * E;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) {
    const float v = expf(l[e] - mx);
    p[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  for (int64_t e = lane; e < E; e += 32) p[e] = p[e] / sum;
  __syncwarp();
  float top_sum = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    float best = -1.0f;
    int32_t best_id = INT32_MAX;
    for (int64_t e = lane; e < E; e += 32) {
      const float v = p[e];
      if (v > best) {  // ascending e per lane: the first of equal values is the lowest id
        best = v;
        best_id = static_cast<int32_t>(e);
      }
    }
    warp_argmax(best, best_id);
    if (lane == 0) {
      ids[row * k + r] = best_id;
      weights[row * k + r] = best;
      p[best_id] = -2.0f;  // taken; probabilities are >= 0
    }
    top_sum += best;  // in rank order, as the CPU sums
    __syncwarp();
  }
  if (lane == 0)
    for (int64_t r = 0; r < k; ++r) {
      float w = norm ? weights[row * k + r] / top_sum : weights[row * k + r];
      if (expert_scale != nullptr) w = __fmul_rn(w, expert_scale[ids[row * k + r]]);
      weights[row * k + r] = w;
    }
  copy_routing_row(ids, weights, copy, row, k);
}

// router_topk_kernel with the row's probabilities in registers (router_topk.cuh): one warp a
// row, E <= 32 NV, k <= 32; the same bits.
template <int NV>
__global__ void router_topk_regs_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k, bool norm,
                                        int32_t* __restrict__ ids, float* __restrict__ weights,
                                        const float* __restrict__ expert_scale, RoutingCopy copy) {
  chained_kernel_entry();
  const int warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= n) return;
  router_topk_warp<NV>(logits + row * E, E, k, norm, ids + row * k, weights + row * k, expert_scale);
  copy_routing_row(ids, weights, copy, row, k);
}

// One warp per row, E <= 32 NV: route_topk's sigmoid scoring. Lane l holds the logits of
// experts l, l + 32, ...; k rounds of a warp arg-max over the ones not yet taken (a mask, not
// a sentinel value: any logit may be chosen), the lower expert id first among equal logits.
template <int NV>
__global__ void router_topk_sigmoid_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k,
                                           int32_t* __restrict__ ids, float* __restrict__ weights, RoutingCopy copy) {
  chained_kernel_entry();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= n) return;
  const float* l = logits + row * E;
  float v[NV];
  uint32_t open = 0;  // bit i: expert lane + 32 i exists and is not taken
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool exists = lane + 32 * i < E;
    v[i] = exists ? l[lane + 32 * i] : 0.0f;
    open |= exists ? 1u << i : 0u;
  }
  float mine = 0.0f;
  int32_t mine_id = 0;
  for (int64_t r = 0; r < k; ++r) {
    float best = -INFINITY;
    int32_t best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if ((open >> i & 1u) && (best_id == INT32_MAX || v[i] > best)) {  // ascending id per lane: the first of equals
        best = v[i];
        best_id = lane + 32 * i;
      }
    warp_argmax(best, best_id);
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (lane + 32 * i == best_id) open &= ~(1u << i);
    if (lane == r) {
      mine = best;
      mine_id = best_id;
    }
  }
  if (lane < k) {
    ids[row * k + lane] = mine_id;
    weights[row * k + lane] = 1.0f / (1.0f + expf(-mine));
  }
  copy_routing_row(ids, weights, copy, row, k);
}

__global__ void scale_pair_inputs_kernel(const float* __restrict__ h, const float* __restrict__ w,
                                         float* __restrict__ x, int64_t pairs, int64_t k, int64_t n_embd) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= pairs * n_embd) return;
  const int64_t p = t / n_embd, c = t % n_embd;
  x[t] = __fmul_rn(h[(p / k) * n_embd + c], w[p]);
}

}  // namespace

void launch_router_topk_sigmoid(const float* logits, int64_t n, int64_t n_expert, int64_t k, int32_t* ids,
                                float* weights, Stream s, RoutingCopy copy) {
  SLUICE_CHECK(k > 0 && k <= n_expert && k <= 32, Status::internal, "cuda router_topk_sigmoid: k ", k, " of ", n_expert,
               " experts");
  SLUICE_CHECK(n_expert <= 512, Status::unsupported, "cuda router_topk_sigmoid: ", n_expert,
               " experts (at most 512 on the device)");
  if (n == 0) return;
  const dim3 grid(blocks_for(n, kRouterWarps)), block(kRouterWarps * 32);
  const auto st = static_cast<cudaStream_t>(s);
  if (n_expert <= 64)
    launch_chained(router_topk_sigmoid_kernel<2>, grid, block, 0, st, logits, n, n_expert, k, ids, weights, copy);
  else if (n_expert <= 128)
    launch_chained(router_topk_sigmoid_kernel<4>, grid, block, 0, st, logits, n, n_expert, k, ids, weights, copy);
  else
    launch_chained(router_topk_sigmoid_kernel<16>, grid, block, 0, st, logits, n, n_expert, k, ids, weights, copy);
  CUDA_CHECK(cudaGetLastError());
}

void launch_scale_pair_inputs(const float* h, const float* weights, float* x, int64_t n_rows, int64_t k,
                              int64_t n_embd, Stream s) {
  const int64_t total = n_rows * k * n_embd;
  if (total == 0) return;
  scale_pair_inputs_kernel<<<blocks_for(total, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(h, weights, x, n_rows * k,
                                                                                            k, n_embd);
  CUDA_CHECK(cudaGetLastError());
}

void launch_router_topk(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool norm_topk, int32_t* ids,
                        float* weights, Stream s, const float* expert_scale, RoutingCopy copy) {
  SLUICE_CHECK(k > 0 && k <= n_expert, Status::internal, "cuda router_topk: k ", k, " of ", n_expert, " experts");
  const size_t smem = static_cast<size_t>(kRouterWarps) * n_expert * sizeof(float);
  SLUICE_CHECK(smem <= 48 * 1024, Status::unsupported, "cuda router_topk: ", n_expert,
               " experts exceed the shared-memory softmax (at most ", 48 * 1024 / (4 * kRouterWarps), ")");
  if (n == 0) return;
  const dim3 grid(blocks_for(n, kRouterWarps)), block(kRouterWarps * 32);
  const auto st = static_cast<cudaStream_t>(s);
  if (k > 32 || n_expert > 512)
    launch_chained(router_topk_kernel, grid, block, smem, st, logits, n, n_expert, k, norm_topk, ids, weights, expert_scale,
                   copy);
  else
    SLUICE_WITH_TOPK_NV(n_expert, launch_chained(router_topk_regs_kernel<NV>, grid, block, 0, st, logits, n, n_expert,
                                                 k, norm_topk, ids, weights, expert_scale, copy))
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
