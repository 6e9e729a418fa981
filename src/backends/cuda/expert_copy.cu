// launch_expert_copies: a grid-stride copy of each listed record, 16 bytes per load, read from
// host memory over PCIe with cache-volatile loads (the same pinned buffers are refilled with
// other records between launches). The list itself is in device memory: every thread reads
// the count and the descriptors, and thousands of warps reading one host-mapped word each
// cost milliseconds per launch over PCIe.
#include "backends/cuda/common.cuh"
#include "backends/cuda/expert_copy.h"

namespace sluice::cuda {
namespace {

__global__ void expert_copies_kernel(const CopyDesc* descs, const uint32_t* count, uint8_t* clear, uint32_t clear_bytes) {
  const uint32_t n = *count;
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t c = tid; c < clear_bytes; c += stride) clear[c] = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const CopyDesc* d = descs + i;
    const uint4* src = static_cast<const uint4*>(d->src);
    uint4* dst = static_cast<uint4*>(d->dst);
    const uint64_t chunks = d->bytes / 16;
    for (uint64_t c = tid; c < chunks; c += stride) dst[c] = __ldcv(src + c);
  }
}

__global__ void stream_delay_kernel(uint32_t us) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < uint64_t{us} * 1000);
}

}  // namespace

void launch_stream_delay(uint32_t us, Stream s) {
  stream_delay_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(us);
  CUDA_CHECK(cudaGetLastError());
}

void launch_expert_copies(const CopyDesc* descs, const uint32_t* count, Stream s, uint8_t* clear, uint32_t clear_bytes) {
  // Enough blocks to keep many PCIe reads in flight (a few per SM); most launches copy little.
  expert_copies_kernel<<<528, 256, 0, static_cast<cudaStream_t>(s)>>>(descs, count, clear, clear_bytes);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
