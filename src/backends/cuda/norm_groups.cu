// rms_norm_groups: RMSNorm over groups of a row (hyper-connection streams, PLE keys and
// queries), then one weight over the whole row. One block per (row, group); the sum of
// squares is reduced over the block, then, as the CPU reference (cpu/norm_groups.cpp):
// r = 1 / sqrt(mean + eps), y = (x r) w. y may alias x: every thread reads its elements for
// the sum before any element is written.
#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_groups_kernel(const float* x, const float* __restrict__ w, float* y, int64_t n_group,
                                       int64_t group, float eps) {
  __shared__ float partial[kThreads / 32];
  const int64_t u = blockIdx.x, col0 = (u % n_group) * group;
  const float* xr = x + u * group;
  float* yr = y + u * group;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < group; i += kThreads) ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(group)), eps)));
  for (int64_t i = threadIdx.x; i < group; i += kThreads) {
    const float v = __fmul_rn(xr[i], r);
    yr[i] = w ? __fmul_rn(v, w[col0 + i]) : v;
  }
}

}  // namespace

void launch_rms_norm_groups(const float* x, const float* w, float* y, int64_t rows, int64_t cols, int64_t group,
                            float eps, Stream s) {
  const int64_t n_group = cols / group, units = rows * n_group;
  if (units == 0) return;
  rms_norm_groups_kernel<<<static_cast<unsigned>(units), kThreads, 0, static_cast<cudaStream_t>(s)>>>(
      x, w, y, n_group, group, eps);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
