// Backend::matmul_heads for a decode step's few rows (attention_latent.h): every head's product
// of its slice of x with its own rows of w, in one launch (multi-head latent attention's
// absorbed query and its value up-projection: 128 small products a layer otherwise).
//
//   grid (H, ceil(m / kWarps)), block kWarps warps; warp w computes output r = blockIdx.y kWarps
//   + w of head blockIdx.x for every row: lanes stride over k, then a warp sum.
#include "backends/cuda/attention_latent.h"

#include "backends/cuda/common.cuh"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 8;

template <WType WT>
__global__ void __launch_bounds__(kWarps * 32)
    matmul_heads_kernel(const float* __restrict__ x, const void* __restrict__ w, float* __restrict__ y, int64_t n,
                        int64_t H, int64_t m, int64_t k) {
  chained_kernel_entry();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.x, r = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  if (r >= m) return;
  const int64_t wrow = (h * m + r) * k;
  float acc[kMatmulHeadsMaxRows];
#pragma unroll
  for (int i = 0; i < kMatmulHeadsMaxRows; ++i) acc[i] = 0.0f;
  for (int64_t c = lane; c < k; c += 32) {
    const float wv = load_w<WT>(w, wrow + c);
#pragma unroll
    for (int i = 0; i < kMatmulHeadsMaxRows; ++i)
      if (i < n) acc[i] = fmaf(x[(i * H + h) * k + c], wv, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < kMatmulHeadsMaxRows; ++i) {
    if (i >= n) break;
    const float v = warp_sum(acc[i]);
    if (lane == 0) y[(i * H + h) * m + r] = v;
  }
}

}  // namespace

void launch_matmul_heads(const float* x, const void* w, WType wtype, float* y, int64_t n, int64_t H, int64_t m,
                         int64_t k, Stream s) {
  SLUICE_CHECK(n >= 0 && n <= kMatmulHeadsMaxRows, Status::internal, "cuda matmul_heads: ", n, " rows");
  if (n == 0 || H == 0 || m == 0) return;
  const dim3 grid(static_cast<unsigned>(H), blocks_for(m, kWarps)), block(kWarps * 32);
  const auto st = static_cast<cudaStream_t>(s);
  switch (wtype) {
    case WType::f32: launch_chained(matmul_heads_kernel<WType::f32>, grid, block, 0, st, x, w, y, n, H, m, k); break;
    case WType::f16: launch_chained(matmul_heads_kernel<WType::f16>, grid, block, 0, st, x, w, y, n, H, m, k); break;
    case WType::bf16: launch_chained(matmul_heads_kernel<WType::bf16>, grid, block, 0, st, x, w, y, n, H, m, k); break;
    default: fail(Status::internal, "cuda matmul_heads: weight type ", static_cast<int>(wtype));
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
