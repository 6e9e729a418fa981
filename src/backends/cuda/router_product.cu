// The router product of one decode row and its softmax top-k in one launch
// (launch_router_product_topk, moe_kernels.h): one cluster of kClusterBlocks blocks.
//
// The chained pair it replaces (launch_matvec's router product, then router_topk_regs_kernel)
// costs a launch boundary and a memory round trip for the logits, and loads the router's
// weights only after the kernel before it has finished. Here each block loads its rows'
// weight chunks before it waits for that kernel (the weights are fixed: no op of a step
// writes them), computes its rows' logits with launch_matvec's sums for these shapes (a row
// split over kGroupWarps warps, lane l of warp ks taking chunks l + 32 (ks + 8 i), the eight
// partials added in warp order: the same bits), and stores them into block 0's shared memory
// (distributed shared memory); after the cluster's barrier a warp of block 0 takes the top-k
// of the row from there (router_topk_warp: the top-k kernel's bits).
//
//   cluster (kClusterBlocks), block kBlockWarps warps = 2 groups of kGroupWarps; a pass of the
//   cluster covers kPassRows rows: group g of block b rows (b * 2 + g) * kGroupRows ..
#include <cooperative_groups.h>

#include <atomic>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/router_topk.cuh"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kClusterBlocks = 8;
constexpr int kGroupWarps = 8;  // a row's split over k: launch_matvec's for a row count below 1024
constexpr int kGroupRows = 8;   // rows a group holds at once
constexpr int kBlockWarps = 2 * kGroupWarps;
constexpr int64_t kPassRows = int64_t{kClusterBlocks} * 2 * kGroupRows;
constexpr int64_t kMaxExperts = 512;  // router_topk_warp's

// AHEAD: one pass (E <= kPassRows), its chunks loaded before the wait.
template <WType T, int NV, bool AHEAD>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kBlockWarps * 32)
    router_product_topk_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w,
                               const uint8_t* __restrict__ scales, int64_t E, int64_t kdim, int64_t rb, int64_t sb,
                               int64_t k, bool norm, const float* __restrict__ expert_scale, int32_t* __restrict__ ids,
                               float* __restrict__ weights) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float part[kBlockWarps][kGroupRows];
  __shared__ float logits[kMaxExperts];  // block 0's holds the row's
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / kGroupWarps, ks = warp % kGroupWarps;
  const int rank = static_cast<int>(cluster.block_rank());
  float* logits0 = cluster.map_shared_rank(logits, 0);
  auto rows_of = [&](int64_t base, const uint8_t* (&wr)[kGroupRows], const uint8_t* (&sr)[kGroupRows]) {
    const int64_t j0 = base + (static_cast<int64_t>(rank) * 2 + group) * kGroupRows;
#pragma unroll
    for (int r = 0; r < kGroupRows; ++r) {
      const int64_t j = j0 + r < E ? j0 + r : E - 1;
      wr[r] = w + j * rb;
      sr[r] = scales ? scales + j * sb : nullptr;
    }
    return j0;
  };
  // The row's partial sums into part, then the group's rows, added in warp order, into block 0.
  auto finish = [&](int64_t j0, float (&acc)[1][kGroupRows]) {
#pragma unroll
    for (int r = 0; r < kGroupRows; ++r) {
      const float s = warp_sum(acc[0][r]);
      if (lane == 0) part[warp][r] = s;
    }
    __syncthreads();
    if (ks == 0 && lane < kGroupRows && j0 + lane < E) {
      float s = 0.0f;
      for (int q = 0; q < kGroupWarps; ++q) s += part[warp + q][lane];
      logits0[j0 + lane] = s;
    }
    __syncthreads();  // part is rewritten by the next pass
  };
  if constexpr (AHEAD) {
    const uint8_t* wr[kGroupRows];
    const uint8_t* sr[kGroupRows];
    const int64_t j0 = rows_of(0, wr, sr);
    RowsAhead<T, kGroupRows> ahead;
    if (j0 < E) load_rows_ahead<T, kGroupRows>(ahead, wr, sr, kdim, lane, ks, kGroupWarps);
    chained_kernel_entry();  // x is the kernel before's
    float acc[1][kGroupRows] = {};
    if (j0 < E)
      rows_dot_partial<T, 1, kGroupRows, true>(wr, sr, x, kdim, kdim, true, lane, acc, ks, kGroupWarps, &ahead);
    finish(j0, acc);
  } else {
    chained_kernel_entry();
    for (int64_t base = 0; base < E; base += kPassRows) {
      const uint8_t* wr[kGroupRows];
      const uint8_t* sr[kGroupRows];
      const int64_t j0 = rows_of(base, wr, sr);
      float acc[1][kGroupRows] = {};
      if (j0 < E) rows_dot_partial<T, 1, kGroupRows>(wr, sr, x, kdim, kdim, true, lane, acc, ks, kGroupWarps);
      finish(j0, acc);
    }
  }
  cluster.sync();  // every block's logits are in block 0
  if (rank == 0 && warp == 0) router_topk_warp<NV>(logits, E, k, norm, ids, weights, expert_scale);
}

template <WType T>
void launch_t(const RouterProductParams& p, cudaStream_t st) {
  const int64_t rb = dot_row_bytes(T, p.kdim), sb = dot_scale_row_bytes(T, p.kdim);
  SLUICE_WITH_TOPK_NV(p.n_expert, {
    auto kernel = p.n_expert <= kPassRows ? router_product_topk_kernel<T, NV, true>
                                          : router_product_topk_kernel<T, NV, false>;
    launch_chained(kernel, dim3(kClusterBlocks), dim3(kBlockWarps * 32), 0, st, p.x,
                   static_cast<const uint8_t*>(p.w), static_cast<const uint8_t*>(p.scales), p.n_expert, p.kdim, rb,
                   sb, p.k, p.norm_topk, p.expert_scale, p.ids, p.weights);
  })
}

std::atomic<int64_t> g_launches{0};

}  // namespace

int64_t router_product_launches() { return g_launches.load(std::memory_order_relaxed); }

bool router_product_topk_supported(const RouterProductParams& p) {
  const char* e = std::getenv("SLUICE_CUDA_ROUTER_CLUSTER");
  if (e && std::strcmp(e, "0") == 0) return false;
  const WType t = p.wtype;
  return (t == WType::f32 || t == WType::f16 || t == WType::bf16 || t == WType::q8 || t == WType::q4) &&
         p.n_expert >= 1 && p.n_expert <= kMaxExperts && p.k >= 1 && p.k <= 32 && p.k <= p.n_expert &&
         row_dot_vec_ok(t, p.w, p.kdim, p.x, p.kdim);
}

void launch_router_product_topk(const RouterProductParams& p, Stream s) {
  SLUICE_CHECK(router_product_topk_supported(p), Status::internal, "cuda router product top-k: ", p.n_expert,
               " experts, k ", p.k, ", rows of ", p.kdim);
  const auto st = static_cast<cudaStream_t>(s);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  switch (p.wtype) {
    case WType::f32: launch_t<WType::f32>(p, st); break;
    case WType::f16: launch_t<WType::f16>(p, st); break;
    case WType::bf16: launch_t<WType::bf16>(p, st); break;
    case WType::q8: launch_t<WType::q8>(p, st); break;
    default: launch_t<WType::q4>(p, st); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
