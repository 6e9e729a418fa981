// rms_norm (with an optional residual add first) and add_bias: one block per row, the sum of
// squares reduced over the block.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_row.cuh"

namespace sluice::cuda {
namespace {

constexpr int kThreads = 256;

// add != null: x += add first (add_rms_norm); each thread norms the elements it summed, so
// the result is that of launch_add then launch_rms_norm, bit for bit.
template <WType T>
__global__ void rms_norm_kernel(float* x, const float* __restrict__ add, const void* __restrict__ w, float* y,
                                int64_t cols, float eps) {
  chained_kernel_entry();
  __shared__ float partial[kThreads / 32];
  float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  float ss = 0.0f;
  if (add) {
    const float* ar = add + blockIdx.x * cols;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float v = xr[c] + ar[c];
      xr[c] = v;
      ss = fmaf(v, v, ss);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) ss = fmaf(xr[c], xr[c], ss);
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  const float inv = rsqrtf(total / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float v = xr[c] * inv;
    yr[c] = w ? v * load_w<T>(w, c) : v;
  }
}

// Rows that norm_row_vec_ok: one memory round trip a row (norm_row.cuh; a decode token runs
// two of these a layer: about a tenth of its kernels' time before).
template <WType T>
__global__ void __launch_bounds__(kNormThreads) rms_norm_vec_kernel(float* x, const float* __restrict__ add,
                                                                    const void* __restrict__ w, float* y, int64_t cols,
                                                                    float eps) {
  chained_kernel_entry();
  rms_norm_row_vec<T>(x + blockIdx.x * cols, add ? add + blockIdx.x * cols : nullptr, w, y + blockIdx.x * cols, cols,
                      eps);
}

template <WType T>
__global__ void add_bias_kernel(float* y, const void* __restrict__ b, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] += load_w<T>(b, i % cols);
}

template <WType T>
void launch_norm_t(float* x, const float* add, const void* w, float* y, int64_t rows, int64_t cols, float eps,
                   cudaStream_t st) {
  static_assert(kThreads == kNormThreads);
  const bool vec = cols % 4 == 0 && cols <= int64_t{kNormThreads} * 4 * kNormMaxVec &&
                   ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(add) |
                     reinterpret_cast<uintptr_t>(y)) & 15) == 0;
  launch_chained(vec ? rms_norm_vec_kernel<T> : rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
                 0, st, x, add, w, y, cols, eps);
}

}  // namespace

void launch_add_rms_norm(float* x, const float* add, const void* w, WType wtype, float* y, int64_t rows, int64_t cols,
                         float eps, Stream s) {
  if (rows == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  switch (wtype) {
    case WType::f32: launch_norm_t<WType::f32>(x, add, w, y, rows, cols, eps, st); break;
    case WType::f16: launch_norm_t<WType::f16>(x, add, w, y, rows, cols, eps, st); break;
    case WType::bf16: launch_norm_t<WType::bf16>(x, add, w, y, rows, cols, eps, st); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

void launch_rms_norm(const float* x, const void* w, WType wtype, float* y, int64_t rows, int64_t cols, float eps,
                     Stream s) {
  // Without `add` the kernel only reads x.
  launch_add_rms_norm(const_cast<float*>(x), nullptr, w, wtype, y, rows, cols, eps, s);
}

void launch_add_bias(float* y, const void* b, WType wtype, int64_t rows, int64_t cols, Stream s) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  switch (wtype) {
    case WType::f32: add_bias_kernel<WType::f32><<<blocks_for(n, 256), 256, 0, st>>>(y, b, rows, cols); break;
    case WType::f16: add_bias_kernel<WType::f16><<<blocks_for(n, 256), 256, 0, st>>>(y, b, rows, cols); break;
    case WType::bf16: add_bias_kernel<WType::bf16><<<blocks_for(n, 256), 256, 0, st>>>(y, b, rows, cols); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
