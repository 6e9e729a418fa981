// Tiled matmul for prefill (n > kMatvecMaxRows rows of x), every weight type:
// y[n, m] = x[n, k] . w[m, k]^T. A block computes a 64 x 64 tile of y (256 threads, 4 x 4
// outputs each) over k in steps of 32: the x tile and the dequantized w tile (row_dot.cuh's
// load_elem: exactly core/quant.cpp's values) in shared memory, f32 FMA. Each weight element
// is read once per 64 rows of x instead of once per row.
#include "backends/cuda/kernels.h"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

constexpr int kTM = 64, kTN = 64, kTK = 32;

template <WType T>
__global__ void __launch_bounds__(256) matmul_tiled_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w,
                                                           const uint8_t* __restrict__ scales, float* __restrict__ y,
                                                           int64_t n, int64_t m, int64_t k, int64_t row_bytes,
                                                           int64_t scale_row_bytes) {
  __shared__ float xs[kTK][kTM + 1];  // [k][row], padded against bank conflicts
  __shared__ float ws[kTK][kTN + 1];  // [k][weight row]
  const int tid = threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTM, col0 = static_cast<int64_t>(blockIdx.x) * kTN;
  const int tr = tid / 16, tc = tid % 16;  // this thread: rows tr + 16 i, columns tc + 16 j
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kTK) {
    // 64 x 32 of each tile, 8 elements per thread; consecutive threads take consecutive k.
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int idx = tid + 256 * e, r = idx / kTK, c = idx % kTK;
      const int64_t kk = k0 + c;
      const int64_t xr = row0 + r, wr = col0 + r;
      xs[c][r] = (xr < n && kk < k) ? x[xr * k + kk] : 0.0f;
      ws[c][r] = (wr < m && kk < k) ? load_elem<T>(w + wr * row_bytes, scales ? scales + wr * scale_row_bytes : nullptr, kk)
                                    : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < kTK; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[c][tr + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[c][tc + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + tr + 16 * i;
    if (r >= n) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tc + 16 * j;
      if (c < m) y[r * m + c] = acc[i][j];
    }
  }
}

}  // namespace

void launch_matmul_tiled(const MatmulParams& p, Stream s) {
  const float* x = p.x;
  const void *w = p.w, *scales = p.scales;
  const WType dtype = p.wtype;
  float* y = p.y;
  const int64_t n = p.n, m = p.m, k = p.k;
  if (n == 0 || m == 0) return;
  const WType t = dtype;
  const int64_t rb = dot_row_bytes(t, k), sb = dot_scale_row_bytes(t, k);
  SLUICE_CHECK((n + kTM - 1) / kTM < 65536, Status::unsupported, "cuda matmul: ", n, " rows exceed one launch");
  const dim3 grid(blocks_for(m, kTN), static_cast<unsigned>((n + kTM - 1) / kTM));
  auto st = static_cast<cudaStream_t>(s);
  auto wb = static_cast<const uint8_t*>(w);
  auto sc = static_cast<const uint8_t*>(scales);
  switch (t) {
    case WType::f32: matmul_tiled_kernel<WType::f32><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::f16: matmul_tiled_kernel<WType::f16><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::bf16: matmul_tiled_kernel<WType::bf16><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::q8: matmul_tiled_kernel<WType::q8><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::q4: matmul_tiled_kernel<WType::q4><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::q2: matmul_tiled_kernel<WType::q2><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
