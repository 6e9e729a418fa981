// Row movement: embedding lookup (float or quantized tables), gather and scatter of activation rows, and the MoE combine
// (a weighted sum over each token's routed rows in rank order).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

// out[i, c] = table[ids[i], c] as f32: rows of dot_row_bytes (and, quantized, scales of
// dot_scale_row_bytes), each element dequantized by load_elem as core/quant.cpp does.
template <WType T>
__global__ void get_rows_kernel(const uint8_t* table, const uint8_t* scales, const int32_t* ids, float* out, int64_t n,
                                int64_t cols, int64_t n_table) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * cols) return;
  const int64_t id = ids[t / cols];
  const int64_t r = id >= 0 && id < n_table ? id : 0;
  out[t] = load_elem<T>(table + r * dot_row_bytes(T, cols), scales ? scales + r * dot_scale_row_bytes(T, cols) : nullptr,
                        t % cols);
}
__global__ void gather_kernel(const float* src, const int32_t* idx, float* out, int64_t n, int64_t cols) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n * cols) out[t] = src[static_cast<int64_t>(idx[t / cols]) * cols + t % cols];
}
__global__ void scatter_kernel(const float* src, const int32_t* idx, float* dst, int64_t n, int64_t cols) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n * cols) dst[static_cast<int64_t>(idx[t / cols]) * cols + t % cols] = src[t];
}
__global__ void moe_combine_kernel(const float* e, const float* w, float* out, int64_t n, int64_t k, int64_t cols) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * cols) return;
  const int64_t row = t / cols, c = t % cols;
  float acc = 0.0f;
  for (int64_t r = 0; r < k; ++r) acc = fmaf(w ? w[row * k + r] : 1.0f, e[(row * k + r) * cols + c], acc);
  out[t] = acc;
}

}  // namespace

void launch_get_rows(const void* table, const void* scales, WType wtype, const int32_t* ids, float* out, int64_t n,
                     int64_t cols, int64_t n_table, Stream s) {
  const int64_t total = n * cols;
  if (total == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  const auto* tb = static_cast<const uint8_t*>(table);
  const auto* sc = static_cast<const uint8_t*>(scales);
  const unsigned blocks = blocks_for(total, 256);
  switch (wtype) {
    case WType::f32: get_rows_kernel<WType::f32><<<blocks, 256, 0, st>>>(tb, sc, ids, out, n, cols, n_table); break;
    case WType::f16: get_rows_kernel<WType::f16><<<blocks, 256, 0, st>>>(tb, sc, ids, out, n, cols, n_table); break;
    case WType::bf16: get_rows_kernel<WType::bf16><<<blocks, 256, 0, st>>>(tb, sc, ids, out, n, cols, n_table); break;
    case WType::q8: get_rows_kernel<WType::q8><<<blocks, 256, 0, st>>>(tb, sc, ids, out, n, cols, n_table); break;
    case WType::q4: get_rows_kernel<WType::q4><<<blocks, 256, 0, st>>>(tb, sc, ids, out, n, cols, n_table); break;
    case WType::q2: get_rows_kernel<WType::q2><<<blocks, 256, 0, st>>>(tb, sc, ids, out, n, cols, n_table); break;
    default: fail(Status::internal, "cuda get_rows: weight type ", static_cast<int>(wtype));
  }
  CUDA_CHECK(cudaGetLastError());
}

void launch_gather_rows(const float* src, const int32_t* idx, float* out, int64_t n, int64_t cols, Stream s) {
  if (n * cols == 0) return;
  gather_kernel<<<blocks_for(n * cols, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(src, idx, out, n, cols);
  CUDA_CHECK(cudaGetLastError());
}

void launch_scatter_rows(const float* src, const int32_t* idx, float* dst, int64_t n, int64_t cols, Stream s) {
  if (n * cols == 0) return;
  scatter_kernel<<<blocks_for(n * cols, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(src, idx, dst, n, cols);
  CUDA_CHECK(cudaGetLastError());
}

void launch_moe_combine(const float* e, const float* w, float* out, int64_t n, int64_t k, int64_t cols, Stream s) {
  if (n * cols == 0) return;
  moe_combine_kernel<<<blocks_for(n * cols, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(e, w, out, n, k, cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
