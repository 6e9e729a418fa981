// A barrier across all blocks of one grid, for persistent kernels (moe_persistent.cu) whose
// blocks are all resident at once (a cooperative launch guarantees it, or refuses the launch).
// The pattern of cooperative_groups' grid sync (block barrier, one thread arrives with a
// device-scope fence, waits for the generation to move, fences again, block barrier), on a
// state the caller owns, so that no relocatable device code is needed and the state can live
// in the backend across graph replays. Device code only; included by .cu files.
#pragma once

#include <cstdint>

namespace sluice::cuda {

// Two u32 in device memory: [0] the blocks arrived at the current barrier, [1] its generation.
// Zero before the first use; every barrier leaves [0] at zero again, so one state serves any
// number of barriers and launches (one launch at a time: launches on one stream).
struct GridBarrierState {
  unsigned count;
  unsigned generation;
};

// A block that waits longer than this at a barrier traps (the launch fails with an error the
// host reports) instead of hanging the GPU: a block that never arrives (a grid larger than
// what is resident, a bug) must not turn into a hang. 10 s: a barrier's wait is microseconds.
constexpr uint64_t kGridBarrierTimeoutNs = 10'000'000'000ull;

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block of the grid calls it, all threads of each block; returns once all gridDim
// blocks arrived. Writes any thread made before it are visible to every thread after it.
__device__ __forceinline__ void grid_barrier(GridBarrierState* state) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned n_blocks = gridDim.x * gridDim.y * gridDim.z;
    volatile unsigned* generation = &state->generation;
    // Read before arriving: the generation cannot move until this block has arrived.
    const unsigned gen = *generation;
    __threadfence();  // this block's writes (ordered before by __syncthreads) before the arrival
    if (atomicAdd(&state->count, 1u) == n_blocks - 1) {
      atomicExch(&state->count, 0u);  // before the new generation: a block leaving this barrier may arrive at the next
      __threadfence();
      atomicAdd(&state->generation, 1u);
    } else {
      const uint64_t t0 = global_timer_ns();
      for (unsigned spin = 1; *generation == gen; ++spin) {
        __nanosleep(32);
        if (spin % 1024 == 0 && global_timer_ns() - t0 > kGridBarrierTimeoutNs) __trap();
      }
    }
    __threadfence();  // the other blocks' writes before this block's reads
  }
  __syncthreads();
}

}  // namespace sluice::cuda
