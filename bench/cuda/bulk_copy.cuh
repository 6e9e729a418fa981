// Bulk copies of contiguous global bytes into shared memory on the TMA engine
// (cp.async.bulk, sm_90), completing on an mbarrier: one instruction for any multiple of 16
// bytes, holding no register and no L1 request for each 16 bytes in flight, as 16-byte loads
// and cp.async do. One thread sets the barrier up and issues the copies; every thread that
// reads the bytes waits on the barrier's phase. Device code only; included by .cu files.
#pragma once

#include <cstdint>

namespace sluice::cuda {

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The barrier for one arrival (the issuing thread's) and `bytes` of copies: init, made visible
// to the copy engine, then the arrival that expects the bytes. Before any copy on it; the
// threads that wait on it must see the init (a __syncthreads() or __syncwarp() after it).
__device__ __forceinline__ void bulk_barrier_arm(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// bytes (a multiple of 16) from src to dst (both 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// Until the barrier's phase `phase` (0 for a barrier armed once) has completed: every copy on
// it has landed and is visible to the waiting thread.
__device__ __forceinline__ void bulk_wait(uint64_t* bar, unsigned phase) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(phase)
        : "memory");
}

}  // namespace sluice::cuda
