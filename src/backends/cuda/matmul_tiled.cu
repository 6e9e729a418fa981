// Tiled matmul for prefill (more rows of x than the matvec passes take, kernels.h):
// y[n, m] = x[n, k] . w[m, k]^T.
// bf16, q8 and q4 weights with k a multiple of 32 and 16-byte aligned rows take the tensor
// cores (mma_tile.cuh: 64 x 64 tiles, split-bf16 activations, exact weights). The rest take
// the f32 FMA tiles: a block computes a 64 x 64 tile of y (256 threads, 4 x 4 outputs each)
// over k in steps of 32, the x tile and the dequantized w tile (row_dot.cuh's load_elem:
// exactly core/quant.cpp's values) in shared memory. Each weight element is read once per 64
// rows of x instead of once per row.
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_tile.cuh"
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

// grid (ceil(m / 64), ceil(n / 64)), 128 threads: one 64 x 64 tile of y on the tensor cores.
template <WType T>
__global__ void __launch_bounds__(mma::kThreads) matmul_mma_kernel(const float* __restrict__ x,
                                                                   const uint8_t* __restrict__ w,
                                                                   const uint8_t* __restrict__ scales,
                                                                   float* __restrict__ y, int64_t n, int64_t m,
                                                                   int64_t k, int64_t row_bytes,
                                                                   int64_t scale_row_bytes) {
  constexpr int kBM = 64;
  __shared__ mma::Smem<kBM, 1> s;
  __shared__ const float* xrow[kBM];
  __shared__ const uint8_t* wrow[mma::kBN];
  __shared__ const uint8_t* srow[mma::kBN];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBM, col0 = static_cast<int64_t>(blockIdx.x) * mma::kBN;
  const int tid = threadIdx.x;
  if (tid < kBM) xrow[tid] = row0 + tid < n ? x + (row0 + tid) * k : nullptr;
  if (tid < mma::kBN) {
    const bool in = col0 + tid < m;
    wrow[tid] = in ? w + (col0 + tid) * row_bytes : nullptr;
    srow[tid] = in && scales ? scales + (col0 + tid) * scale_row_bytes : nullptr;
  }
  __syncthreads();
  mma::Acc<kBM> acc[1];
  mma::block_product<T, kBM, 1>(s, xrow, wrow, srow, k, acc);
  mma::for_each_output<kBM, 1>(acc, [&](int r, int c, const float(&v)[1]) {
    if (row0 + r < n && col0 + c < m) y[(row0 + r) * m + col0 + c] = v[0];
  });
}

// parts[i][r][c] = part i of x[r][c] (mma_tile.cuh's split: hi, mid, lo), 4 elements a thread.
__global__ void split_bf16_parts_kernel(const float* __restrict__ x, int64_t count, __nv_bfloat16* __restrict__ parts) {
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i0 >= count) return;  // count is a multiple of 4 (the launcher checks)
  const float4 v = *reinterpret_cast<const float4*>(x + i0);
  uint32_t p01[mma::kParts], p23[mma::kParts];
  mma::split_pair(v.x, v.y, p01);
  mma::split_pair(v.z, v.w, p23);
#pragma unroll
  for (int i = 0; i < mma::kParts; ++i) *reinterpret_cast<uint2*>(parts + i * count + i0) = make_uint2(p01[i], p23[i]);
}

}  // namespace

void launch_split_bf16_parts(const float* x, int64_t rows, int64_t k, void* parts, Stream s) {
  const int64_t count = rows * k;
  if (count == 0) return;
  SLUICE_CHECK((reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(parts) & 15) == 0 &&
                   count % 4 == 0,
               Status::internal, "cuda split_bf16_parts: unaligned rows (", rows, " x ", k, ")");
  split_bf16_parts_kernel<<<blocks_for((count + 3) / 4, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(
      x, count, static_cast<__nv_bfloat16*>(parts));
  CUDA_CHECK(cudaGetLastError());
}

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
  if (mma::usable(t, k, x, k, w, rb) && mma::tensor_cores_enabled()) {
    const dim3 mgrid(blocks_for(m, mma::kBN), static_cast<unsigned>((n + 63) / 64));
    switch (t) {
      case WType::bf16: matmul_mma_kernel<WType::bf16><<<mgrid, mma::kThreads, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
      case WType::q8: matmul_mma_kernel<WType::q8><<<mgrid, mma::kThreads, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
      default: matmul_mma_kernel<WType::q4><<<mgrid, mma::kThreads, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    }
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  switch (t) {
    case WType::f32: matmul_tiled_kernel<WType::f32><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::f16: matmul_tiled_kernel<WType::f16><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::bf16: matmul_tiled_kernel<WType::bf16><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::q8: matmul_tiled_kernel<WType::q8><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::q4: matmul_tiled_kernel<WType::q4><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::q2: matmul_tiled_kernel<WType::q2><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    case WType::mxfp4: matmul_tiled_kernel<WType::mxfp4><<<grid, 256, 0, st>>>(x, wb, sc, y, n, m, k, rb, sb); break;
    default: fail(Status::internal, "cuda matmul: weight type ", static_cast<int>(t));
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
