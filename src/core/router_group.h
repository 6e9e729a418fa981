// The arithmetic of group-limited sigmoid routing (RouterScoring::sigmoid_grouped) that the
// CPU's route_topk (experts/routing.cpp) and the CUDA router (backends/cuda/
// router_group_topk.cu) share: one sequence of IEEE single-precision operations, each rounded
// on its own (every product and sum goes through the helpers below, so no compiler contracts
// two of them into one), so that from the same logits both backends choose the same experts
// with the same weights, bit for bit. The exponential is computed here rather than by the
// platforms' expf, whose last bits differ between glibc and CUDA.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace sluice::router_group {

SLUICE_HOST_DEVICE inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SLUICE_HOST_DEVICE inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SLUICE_HOST_DEVICE inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
SLUICE_HOST_DEVICE inline float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// e^y for y in [-87, 87] (the caller clamps): y = k ln 2 + r with k the integer nearest to
// y log2(e) and |r| <= ln(2) / 2 (r by two fused multiply-adds, ln 2 split into a float and
// its remainder), e^r by its Taylor polynomial of degree 7 (the first term left out is below
// 2^-27 of the result), times 2^k (exact: the result is a normal float). Within 2 ulp of e^y.
SLUICE_HOST_DEVICE inline float exp_in_range(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693147182464599609375f;    // ln 2 rounded to float
  constexpr float kLn2Lo = -1.904654323148236e-09f;     // ln 2 - kLn2Hi
#if defined(__CUDA_ARCH__)
  const float k = rintf(mul(y, kLog2e));
#else
  const float k = std::nearbyint(mul(y, kLog2e));
#endif
  float r = fma(-k, kLn2Hi, y);
  r = fma(-k, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = fma(p, r, 1.0f / 720.0f);
  p = fma(p, r, 1.0f / 120.0f);
  p = fma(p, r, 1.0f / 24.0f);
  p = fma(p, r, 1.0f / 6.0f);
  p = fma(p, r, 0.5f);
  p = fma(p, r, 1.0f);
  p = fma(p, r, 1.0f);
#if defined(__CUDA_ARCH__)
  return ldexpf(p, static_cast<int>(k));
#else
  return std::ldexp(p, static_cast<int>(k));
#endif
}

// sigmoid(x) = 1 / (1 + e^-x), x clamped to [-87, 87] first (beyond it the result differs from
// the sigmoid's by less than 2^-125). NaN stays NaN.
SLUICE_HOST_DEVICE inline float sigmoid(float x) {
  if (x != x) return x;
  const float y = x > 87.0f ? -87.0f : x < -87.0f ? 87.0f : -x;
  return div(1.0f, add(1.0f, exp_in_range(y)));
}

// The choice's value of an expert: its score plus the layer's correction bias.
SLUICE_HOST_DEVICE inline float choice_value(float score, float bias) { return add(score, bias); }

// A group's value: the sum of its two best choice values (best + second, as torch sums a
// topk(2) pair).
SLUICE_HOST_DEVICE inline float group_value(float best, float second) { return add(best, second); }

// One chosen expert's weight from its score s: s / (sum + norm_eps) when norm (sum: the chosen
// scores added in rank order), then times routed_scaling_factor, each step rounded once.
SLUICE_HOST_DEVICE inline float weight(float s, float sum, bool norm, float norm_eps, float scale) {
  const float w = norm ? div(s, add(sum, norm_eps)) : s;
  return mul(w, scale);
}

}  // namespace sluice::router_group
