// Weights fetched into L2 ahead of the kernel that reads them (Backend::prefetch_weights):
// one warp a block issues the prefetches of its share of the listed byte ranges and leaves;
// nothing waits for them (a prefetch has no completion), so the kernel is over in a few
// microseconds while the DRAM reads run on, beside whatever the main stream computes.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

#include <atomic>

namespace sluice::cuda {
namespace {

constexpr uint64_t kPrefetchChunk = 16384;  // bytes a bulk prefetch instruction covers

__global__ void __launch_bounds__(32) l2_prefetch_kernel(const PrefetchRanges r) {
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * 32 + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * 32;
  for (int i = 0; i < r.n; ++i) {
    const char* base = static_cast<const char*>(r.ptr[i]);
    const uint64_t bytes = r.bytes[i] / 16 * 16;  // the bulk prefetch takes multiples of 16
    const uint64_t chunks = (bytes + kPrefetchChunk - 1) / kPrefetchChunk;
    for (uint64_t c = tid; c < chunks; c += stride) {
      const uint64_t off = c * kPrefetchChunk;
      const uint32_t n = static_cast<uint32_t>(bytes - off < kPrefetchChunk ? bytes - off : kPrefetchChunk);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(n) : "memory");
#else
      for (uint32_t b = 0; b < n; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off + b));
#endif
    }
  }
}

std::atomic<int64_t> g_launches{0};

}  // namespace

int64_t l2_prefetch_launches() { return g_launches.load(); }

void launch_l2_prefetch(const PrefetchRanges& r, int blocks, Stream s) {
  if (r.n == 0) return;
  g_launches.fetch_add(1);
  l2_prefetch_kernel<<<blocks, 32, 0, static_cast<cudaStream_t>(s)>>>(r);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
