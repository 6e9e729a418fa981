// The arithmetic of the attention inputs (per-head RMSNorm, rotary), shared by
// attention_inputs_kernel (attention_inputs.cu) and the decode GQA kernel that takes the inputs
// itself (attention_decode.cu, GqaInputs), so that both give the same bits. Device code only;
// included by .cu files.
#pragma once

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace sluice::cuda {

// Element i of a norm's weights (f32, f16 or bf16).
__device__ __forceinline__ float norm_weight_at(const void* w, WType wtype, int64_t i) {
  switch (wtype) {
    case WType::f32: return load_w<WType::f32>(w, i);
    case WType::f16: return load_w<WType::f16>(w, i);
    default: return load_w<WType::bf16>(w, i);
  }
}

// Element c of a head after the rotary (launch_rope's pairs over the first rot dims; the rest
// unchanged): xs the head's d elements (normed), cs / sn the position's tables [rot / 2].
__device__ __forceinline__ float rope_at(const float* xs, int64_t c, const float* __restrict__ cs_row,
                                         const float* __restrict__ sn_row, int64_t rot, bool interleaved) {
  if (c >= rot) return xs[c];
  const int64_t half = rot / 2;
  const int64_t p = interleaved ? c / 2 : c % half;
  const bool first = interleaved ? c % 2 == 0 : c < half;
  const int64_t a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
  const float cs = cs_row[p], sn = sn_row[p];
  const float x1 = xs[a], x2 = xs[b];
  return first ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
}

}  // namespace sluice::cuda
