// copy_cols: a column range of every row of one tensor into a column range of another
// (splitting fused projections, filling hyper-connection streams). One thread per element;
// plain copies, exact. CPU reference: cpu/columns.cpp.
#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice::cuda {
namespace {

__global__ void copy_cols_kernel(const float* __restrict__ src, int64_t src_stride, float* __restrict__ dst,
                                 int64_t dst_stride, int64_t rows, int64_t n_cols) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * n_cols) return;
  const int64_t r = t / n_cols, j = t % n_cols;
  dst[r * dst_stride + j] = src[r * src_stride + j];
}

}  // namespace

void launch_copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                      int64_t n_cols, Stream s) {
  const int64_t total = rows * n_cols;
  if (total == 0) return;
  copy_cols_kernel<<<blocks_for(total, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(src, src_stride, dst,
                                                                                      dst_stride, rows, n_cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
