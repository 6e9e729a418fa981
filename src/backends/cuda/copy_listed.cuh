// The copy of a list of landed expert records from pinned host memory into device slots, shared
// by the copy kernel (expert_copy.cu) and the copy blocks riding in the decode gate/up launch
// (moe_decode.cu).
#pragma once

#include <cstdint>

#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

constexpr int kCopyLoads = 8;  // 16-byte loads from host memory a thread keeps in flight

// Block `b` of `blocks` copies its share of copies.descs[0 .. *copies.count): 16-byte chunks
// b * blockDim.x + threadIdx.x, then a grid-stride of blocks * blockDim.x, kCopyLoads of them
// loaded before any is stored, read with cache-volatile loads (the host refills the same
// pinned buffers between launches).
__device__ __forceinline__ void copy_listed(const CopyList& copies, int32_t b, int32_t blocks) {
  const uint32_t n = *copies.count;
  const uint64_t tid = static_cast<uint64_t>(b) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(blocks) * blockDim.x;
  for (uint32_t i = 0; i < n; ++i) {
    const CopyDesc d = copies.descs[i];
    const auto* src = static_cast<const uint4*>(d.src);
    auto* dst = static_cast<uint4*>(d.dst);
    const uint64_t chunks = d.bytes / 16;
    for (uint64_t c = tid; c < chunks; c += kCopyLoads * stride) {
      uint4 v[kCopyLoads];
#pragma unroll
      for (int u = 0; u < kCopyLoads; ++u)
        if (c + u * stride < chunks) v[u] = __ldcv(src + c + u * stride);
#pragma unroll
      for (int u = 0; u < kCopyLoads; ++u)
        if (c + u * stride < chunks) dst[c + u * stride] = v[u];
    }
  }
}

}  // namespace sluice::cuda
