// The persistent decode MoE step (moe_persistent.cu; docs/persistent-decode.md, stage 1): a
// decode batch's router top-k, every pair's gate/up and the down + combine in ONE launch of
// blocks that stay resident (a cooperative launch) and cross one grid barrier between the
// gate/up and the down products, instead of three chained launches (top-k, gate/up,
// down + combine). Each block computes the top-k itself, then walks the gate/up blocks and
// the down + combine tiles of the decode kernels (moe_decode_rows.cuh) as virtual blocks, and
// asks L2 for its first tile's down weights before it waits at the barrier. The sums are
// those of launch_router_topk + launch_moe_experts_combine, bit for bit.
//
// On only with SLUICE_CUDA_PERSISTENT=1: its GPU tests pass (bit for bit the chain), but on an
// H100 it is slower than the three chained launches (bench/RESULTS.md, docs/persistent-decode.md).
// Plain C++ for the host; pointers are device memory.
#pragma once

#include <cstdint>

#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

struct GridBarrierState;  // grid_barrier.cuh: two u32, zero before the first launch
constexpr size_t kGridBarrierStateBytes = 8;

// SLUICE_CUDA_PERSISTENT=1 asks for the persistent step (read at every call);
// SLUICE_CUDA_PERSISTENT_BLOCKS=2 takes its variant compiled for 2 blocks an SM (255
// registers, no spills) instead of 3 (168, as the gate/up kernel; q4 spills), to compare.
bool moe_persistent_requested();

// Learns, once a device and outside any stream capture, what the device's cooperative
// launches take: after a chained kernel, chained themselves, into a graph (CudaBackend's
// constructor calls it when SLUICE_CUDA_PERSISTENT=1; otherwise the first step does).
void persistent_step_probe();

struct PersistentMoeArgs {
  const float* logits = nullptr;        // [n_rows, n_expert] f32 router logits
  const float* h = nullptr;             // [n_rows, n_embd] f32, 16-byte aligned: the experts' input
  // [n_expert], every entry available, of type shape.wtype, its matrices 16-byte aligned (a
  // misaligned row's scalar path would read act through the read-only cache, which a kernel
  // that writes act itself must not)
  const ExpertRef* table = nullptr;
  const float* expert_scale = nullptr;  // [n_expert] f32 multiplying the chosen weights, or null
  bool norm_topk = false;               // renormalize the top-k probabilities to sum 1
  int32_t* ids = nullptr;               // [n_rows * k] out: the routing (launch_router_topk's)
  float* weights = nullptr;             // [n_rows * k] out
  float* act = nullptr;                 // scratch [n_rows * k, n_ff] f32, 16-byte aligned
  float* out = nullptr;                 // [n_rows, n_embd] f32
  GridBarrierState* barrier = nullptr;  // kGridBarrierStateBytes, zero before the first launch
  MoeShape shape;                       // n_expert <= 512, k <= 32
};

// Enqueues the step and returns true, or returns false enqueuing nothing when the shape is
// not one it takes (more than 8 rows, weight type other than the decode kernels' bf16 / q8 /
// q4 / mxfp4, sizes they refuse, more than 512 experts or 32 a token, more than 48 KiB of
// shared memory, a device whose cooperative launches fail: persistent_step_probe); the
// caller then launches the three kernels.
bool launch_moe_decode_persistent(const PersistentMoeArgs& a, Stream s);

// The persistent steps enqueued (or captured into a graph) by this process so far: the tests
// ask whether a run took the path.
int64_t moe_persistent_launches();

// n grid barriers in one cooperative launch of blocks_per_sm blocks an SM of the step's
// shape, nothing else (bench_cuda --moe: the barrier's round trip).
void launch_grid_barriers(GridBarrierState* state, int n, int blocks_per_sm, Stream s);

}  // namespace sluice::cuda
