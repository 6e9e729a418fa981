// matmul: y[n, m] = x[n, k] . w[m, k]^T with f32 activations and f32/f16/bf16 weights, f32
// accumulation. One warp per weight row; each pass over the row serves up to kRows rows of x,
// so a weight row is read once per kRows activations (decode reads it exactly once).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;  // weight rows per block
constexpr int kRows = 8;   // x rows per pass

template <WType T>
__global__ void matmul_kernel(const float* __restrict__ x, const void* __restrict__ w, float* __restrict__ y,
                              int64_t n, int64_t m, int64_t k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (j >= m) return;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.y) * kRows; i0 < n; i0 += static_cast<int64_t>(gridDim.y) * kRows) {
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    const int rows = static_cast<int>(n - i0 < kRows ? n - i0 : kRows);
    for (int64_t c = lane; c < k; c += 32) {
      const float wv = load_w<T>(w, j * k + c);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < rows) acc[r] = fmaf(wv, x[(i0 + r) * k + c], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float s = warp_sum(acc[r]);
      if (lane == 0 && r < rows) y[(i0 + r) * m + j] = s;
    }
  }
}

}  // namespace

void launch_matmul(const float* x, const void* w, int wtype, float* y, int64_t n, int64_t m, int64_t k, Stream s) {
  if (n == 0 || m == 0) return;
  dim3 grid(blocks_for(m, kWarps), static_cast<unsigned>((n + kRows - 1) / kRows < 1024 ? (n + kRows - 1) / kRows : 1024));
  auto st = static_cast<cudaStream_t>(s);
  switch (static_cast<WType>(wtype)) {
    case WType::f32: matmul_kernel<WType::f32><<<grid, kWarps * 32, 0, st>>>(x, w, y, n, m, k); break;
    case WType::f16: matmul_kernel<WType::f16><<<grid, kWarps * 32, 0, st>>>(x, w, y, n, m, k); break;
    case WType::bf16: matmul_kernel<WType::bf16><<<grid, kWarps * 32, 0, st>>>(x, w, y, n, m, k); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
