// bench_cuda --read-wave: the floor of a one-wave decode MoE kernel. The q4 gate/up product
// of a qwen3-30b-a3b layer (moe_decode_gate_up_kernel: 384 blocks of 4 warps, 3 an SM, one
// wave on 132 SMs) reads ~14 MB that no earlier kernel could have put in L2, all requested at
// its start, and runs at ~39% of the copy bandwidth (bench/RESULTS.md, "The step's kernels
// against their bytes"). This probe reads the same bytes in the same grid with nothing else
// to do, three ways, so that what is left is the cost of getting them on chip:
//   loads     each lane's 18 16-byte chunks as plain loads into registers, all in flight
//             before the first is used (the decode kernels' way);
//   cp.async  the same chunks as 16-byte cp.async into shared memory (no registers held);
//   bulk      one cp.async.bulk a warp (the TMA engine: no register and no L1 request a 16
//             bytes), completing on an mbarrier.
// Each warp reads 9216 contiguous bytes (8 weight rows of 1024 bytes plus their scales: 8 x
// 1152), 1536 warps 14.16 MB; L2 is flushed (a 256 MB memset) before each launch; each launch
// timed by events on both sides, with an empty kernel of the same grid beside for the launch's
// own floor. Results are folded into one word a warp so that no load is dead.
#include "read_wave.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bulk_copy.cuh"
#include "backends/cuda/cuda_check.h"

namespace sluice::bench {
namespace {

constexpr int kBlocks = 384, kWarps = 4;          // moe_decode_gate_up_kernel's grid for a top-8 token
constexpr int kWarpBytes = 9216;                  // 8 q4 rows of 2048: 1024 weight and 128 scale bytes each
constexpr int kChunks = kWarpBytes / 16 / 32;     // 16-byte chunks a lane: 18
constexpr int kBlockBytes = kWarps * kWarpBytes;  // 36 KB of shared memory a block (cp.async, bulk)

__device__ __forceinline__ uint32_t fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

__global__ void __launch_bounds__(kWarps * 32, 3) empty_kernel(uint32_t* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0xFFFFFFFFu) out[0] = 0;  // never: the launch alone
}

__global__ void __launch_bounds__(kWarps * 32, 3) loads_kernel(const uint4* __restrict__ src, uint32_t* out) {
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint4* w = src + static_cast<size_t>(warp) * (kWarpBytes / 16);
  uint4 v[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) v[i] = __ldg(w + i * 32 + lane);
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) acc ^= fold(v[i]);
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[warp] = acc;
}

__global__ void __launch_bounds__(kWarps * 32, 3) cp_async_kernel(const uint4* __restrict__ src, uint32_t* out) {
  extern __shared__ uint4 stage[];
  const int wib = threadIdx.x / 32, warp = blockIdx.x * kWarps + wib, lane = threadIdx.x % 32;
  const uint4* w = src + static_cast<size_t>(warp) * (kWarpBytes / 16);
  uint4* s = stage + wib * (kWarpBytes / 16);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(s + i * 32 + lane));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(w + i * 32 + lane) : "memory");
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) acc ^= fold(s[i * 32 + lane]);
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[warp] = acc;
}

__global__ void __launch_bounds__(kWarps * 32, 3) bulk_kernel(const uint4* __restrict__ src, uint32_t* out) {
  extern __shared__ uint4 stage[];
  __shared__ alignas(8) uint64_t bar[kWarps];
  const int wib = threadIdx.x / 32, warp = blockIdx.x * kWarps + wib, lane = threadIdx.x % 32;
  const uint4* w = src + static_cast<size_t>(warp) * (kWarpBytes / 16);
  uint4* s = stage + wib * (kWarpBytes / 16);
  if (lane == 0) {
    cuda::bulk_barrier_arm(&bar[wib], kWarpBytes);
    cuda::bulk_copy(s, w, kWarpBytes, &bar[wib]);
  }
  __syncwarp();
  cuda::bulk_wait(&bar[wib], 0);
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) acc ^= fold(s[i * 32 + lane]);
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[warp] = acc;
}

}  // namespace

int run_read_wave(double copy_bw) {
  const size_t bytes = static_cast<size_t>(kBlocks) * kBlockBytes, flush_bytes = size_t{256} << 20;
  uint4* src = nullptr;
  uint32_t* out = nullptr;
  void* flush = nullptr;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&out, kBlocks * kWarps * sizeof(uint32_t)));
  CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  CUDA_CHECK(cudaMemset(src, 0x5a, bytes));
  CUDA_CHECK(cudaFuncSetAttribute(cp_async_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBlockBytes));
  CUDA_CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBlockBytes));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::printf("one wave reading %.2f MB cold in L2 (%d blocks of %d warps, %d bytes a warp); copy bandwidth %.0f GB/s\n\n",
              bytes / 1e6, kBlocks, kWarps, kWarpBytes, copy_bw / 1e9);
  std::printf("| way | us (median of 21) | min us | GB/s | of copy bandwidth |\n|---|---|---|---|---|\n");
  struct Way {
    const char* name;
    void (*kernel)(const uint4*, uint32_t*);
    size_t smem;
  };
  const Way ways[] = {{"empty kernel (the launch)", nullptr, 0},
                      {"16-byte loads into registers", loads_kernel, 0},
                      {"16-byte cp.async into shared memory", cp_async_kernel, kBlockBytes},
                      {"cp.async.bulk, one a warp", bulk_kernel, kBlockBytes}};
  for (const Way& w : ways) {
    std::vector<float> us;
    for (int rep = 0; rep < 22; ++rep) {
      CUDA_CHECK(cudaMemsetAsync(flush, rep, flush_bytes));  // evicts src from L2
      CUDA_CHECK(cudaEventRecord(e0));
      if (w.kernel) w.kernel<<<kBlocks, kWarps * 32, w.smem>>>(src, out);
      else empty_kernel<<<kBlocks, kWarps * 32>>>(out);
      CUDA_CHECK(cudaEventRecord(e1));
      CUDA_CHECK(cudaEventSynchronize(e1));
      CUDA_CHECK(cudaGetLastError());
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0) us.push_back(ms * 1e3f);  // the first: warm-up
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    if (!w.kernel) {
      std::printf("| %s | %.2f | %.2f | - | - |\n", w.name, med, us.front());
      continue;
    }
    const double gbs = bytes / (med * 1e-6) / 1e9;
    std::printf("| %s | %.2f | %.2f | %.0f | %.0f%% |\n", w.name, med, us.front(), gbs, 100.0 * gbs * 1e9 / copy_bw);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(out));
  CUDA_CHECK(cudaFree(flush));
  return 0;
}

}  // namespace sluice::bench
