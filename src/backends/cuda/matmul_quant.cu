// matmul with quantized weights (q8, q4, q2; layouts in core/quant.h): y[n, m] = x[n, k] .
// dequantize(w)[m, k]^T. One warp per weight row, as the f32/bf16 kernel; each element is
// dequantized exactly as core/quant.cpp's dequantize_row does (q4: (q - 8) * d; q2:
// fma(q, scale, min); q8: q * scale), so only the summation order differs from the CPU.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 8;

enum class QType : int { q8 = 0, q4 = 1, q2 = 2 };

// Element c of a row: data and scales point at the row's packed values and scales.
template <QType Q>
__device__ __forceinline__ float load_q(const uint8_t* data, const uint8_t* scales, int64_t c) {
  if constexpr (Q == QType::q8) {
    return static_cast<float>(reinterpret_cast<const int8_t*>(data)[c]) * *reinterpret_cast<const float*>(scales);
  } else if constexpr (Q == QType::q4) {
    const float d = __half2float(reinterpret_cast<const __half*>(scales)[c / 32]);
    const int q = (data[c / 2] >> (4 * (c & 1))) & 15;
    return static_cast<float>(q - 8) * d;
  } else {
    const __half* s = reinterpret_cast<const __half*>(scales) + 2 * (c / 16);
    const int q = (data[c / 4] >> (2 * (c & 3))) & 3;
    return fmaf(static_cast<float>(q), __half2float(s[0]), __half2float(s[1]));
  }
}

template <QType Q>
__global__ void matmul_quant_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w,
                                    const uint8_t* __restrict__ scales, float* __restrict__ y, int64_t n, int64_t m,
                                    int64_t k, int64_t row_bytes, int64_t scale_row_bytes) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (j >= m) return;
  const uint8_t* wr = w + j * row_bytes;
  const uint8_t* sr = scales + j * scale_row_bytes;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.y) * kRows; i0 < n; i0 += static_cast<int64_t>(gridDim.y) * kRows) {
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    const int rows = static_cast<int>(n - i0 < kRows ? n - i0 : kRows);
    for (int64_t c = lane; c < k; c += 32) {
      const float wv = load_q<Q>(wr, sr, c);
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

void launch_matmul_quant(const float* x, const void* w, const void* scales, int qtype, float* y, int64_t n, int64_t m,
                         int64_t k, int64_t row_bytes, int64_t scale_row_bytes, Stream s) {
  if (n == 0 || m == 0) return;
  const int64_t ytiles = (n + kRows - 1) / kRows;
  dim3 grid(blocks_for(m, kWarps), static_cast<unsigned>(ytiles < 1024 ? ytiles : 1024));
  auto st = static_cast<cudaStream_t>(s);
  auto wb = static_cast<const uint8_t*>(w);
  auto sb = static_cast<const uint8_t*>(scales);
  switch (static_cast<QType>(qtype)) {
    case QType::q8:
      matmul_quant_kernel<QType::q8><<<grid, kWarps * 32, 0, st>>>(x, wb, sb, y, n, m, k, row_bytes, scale_row_bytes);
      break;
    case QType::q4:
      matmul_quant_kernel<QType::q4><<<grid, kWarps * 32, 0, st>>>(x, wb, sb, y, n, m, k, row_bytes, scale_row_bytes);
      break;
    case QType::q2:
      matmul_quant_kernel<QType::q2><<<grid, kWarps * 32, 0, st>>>(x, wb, sb, y, n, m, k, row_bytes, scale_row_bytes);
      break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
