// The decode MoE expert kernels (moe_decode.cu): the per-pair gate/up, the per-pair down and
// the fused down + combine of moe_kernels.h for bf16, int8, q4 and mxfp4 experts (with the
// table entries' biases and activation, moe_common.cuh), built to stream the
// experts' weights at the memory bandwidth when a batch has few rows. Each computes exactly the
// sums of the generic kernels of moe_kernels.cu (the same chunks per lane, the same order), so
// the two agree bit for bit and launch_moe_experts* may take either, kernel by kernel.
// Plain C++ for moe_kernels.cu's launchers; pointers are device memory.
#pragma once

#include <cstdint>

#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

// Whether the decode kernels are on (SLUICE_CUDA_MOE_DECODE=0 turns them off, to compare with
// the generic kernels; captured graphs take it at capture).
bool moe_decode_enabled();

// Each returns false, enqueuing nothing, when its kernel does not take the shape: weight type
// (shape.wtype) other than bf16, q8, q4 or mxfp4, a width that is not a whole number of 16-byte
// chunks, activations not 16-byte aligned, or more than 48 KiB of staged activations.
// act[p, j] = act(gate_j . h[p / k] + gate_bias_j, up_j . h[p / k] + up_bias_j) for the active
// pairs, act SwiGLU or the clamped variant as the table entry says (expert_gate_up; done as
// launch_moe_experts' first step).
// With copies (CopyList, descs not null) a few blocks more copy them beside the product.
bool launch_moe_decode_gate_up(const float* h, const int32_t* ids, const ExpertRef* table, const uint8_t* done,
                               float* act, const MoeShape& shape, Stream s, const CopyList& copies = {});
// pair_out[p, i] = down_i . act[p] + down_bias_i for the active pairs.
bool launch_moe_decode_down(const int32_t* ids, const ExpertRef* table, const uint8_t* done, const float* act,
                            float* pair_out, const MoeShape& shape, Stream s);
// out[row, i] = sum over ranks r in order of weights[p] * (down_i . act[p] + down_bias_i), p = row * k + r;
// a pair whose expert's entry is unavailable (a cut miss) counts as zero. early: the blocks
// read ids, table and weights before waiting for the kernel before them, which must write
// nothing of those (the gate/up product without copies: launch_moe_experts_combine's, which
// always passes it; the CUDA streamer's phases do not).
bool launch_moe_decode_down_combine(const int32_t* ids, const float* weights, const ExpertRef* table,
                                    const float* act, float* out, const MoeShape& shape, Stream s,
                                    bool early = false);

}  // namespace sluice::cuda
