// Weights fetched into L2 ahead of the kernel that reads them (Backend::prefetch_weights):
// one thread a block issues the prefetches of its share of the listed byte ranges and leaves;
// nothing waits for them (a prefetch has no completion), so the kernel is over in a few
// microseconds while the DRAM reads run on, beside whatever the main stream computes.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

#include <atomic>

namespace sluice::cuda {
namespace {

// Block b of B prefetches share b of each range (the shares 16-byte aligned).
__global__ void __launch_bounds__(1) l2_prefetch_kernel(const PrefetchRanges r) {
  for (int i = 0; i < r.n; ++i) prefetch_l2_share(r.ptr[i], r.bytes[i], blockIdx.x, gridDim.x);
}

std::atomic<int64_t> g_launches{0};

}  // namespace

int64_t l2_prefetch_launches() { return g_launches.load(); }

void launch_l2_prefetch(const PrefetchRanges& r, int blocks, Stream s) {
  if (r.n == 0) return;
  g_launches.fetch_add(1);
  l2_prefetch_kernel<<<blocks, 1, 0, static_cast<cudaStream_t>(s)>>>(r);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
