// Device helpers of the sampling rule (core/sampling.h) shared by the one-block kernel
// (sample.cu) and the many-block kernels (sample_blocks.cu).
#pragma once

#include <cstdint>

#include "backends/cuda/sample.h"

namespace sluice::cuda {

// 2^40: probability 1 in fixed point, core/sampling.h's kSampleMassOne (that header needs
// C++20, .cu files compile as C++17; sampling_ops.cpp checks the two are equal).
constexpr double kMassOne = kSampleKernelMassOne;
// The many-block kernels: kSampleBlocks blocks a row of kSampleThreads threads.
constexpr int kSampleThreads = 256;

// A 32-bit key that orders as the float does (larger float, larger key; finite inputs).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// The float whose order_key is k.
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A probability in 2^-40 units, rounded to nearest even (core/sampling.h's sample_fixed_mass).
__device__ __forceinline__ unsigned long long fixed_mass(float p) {
  return static_cast<unsigned long long>(__double2ll_rn(static_cast<double>(p) * kMassOne));
}
// top_p in 2^-40 units, truncated, at least one unit (the most likely token is always kept).
__device__ __forceinline__ unsigned long long fixed_target(float top_p) {
  const auto t = static_cast<unsigned long long>(static_cast<double>(top_p) * kMassOne);
  return t == 0 ? 1 : t;
}

}  // namespace sluice::cuda
