// The scalar activations the CUDA kernels share (elementwise.cu, activation.cu, the MoE expert
// kernels through moe_common.cuh), one home each, written as the CPU reference computes them
// (expf and tanhf differ from the CPU's by an ulp or two).
#pragma once

#include <cuda_runtime.h>

namespace sluice::cuda {

// silu(g) * u, as launch_swiglu.
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// gpt-oss's clamped SwiGLU, as the CPU's swiglu_clamped8: the clamps written so that a NaN
// passes through (fminf would turn it into the bound).
__device__ __forceinline__ float swiglu_clamped(float g, float u, float alpha, float limit) {
  g = g > limit ? limit : g;
  u = u > limit ? limit : u < -limit ? -limit : u;
  const float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
  return (u + 1.0f) * glu;
}

// PyTorch's gelu(approximate="tanh"), as the CPU's scalar code.
__device__ __forceinline__ float gelu_tanh(float v) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2 / pi)
  return 0.5f * v * (1.0f + tanhf(kBeta * (v + kKappa * v * v * v)));
}

}  // namespace sluice::cuda
