// Prefill products of bf16 weights on cuBLAS (issue 14): y[n, m] = x[n, k] . w[m, k]^T on
// the tensor cores at the library's tile and pipeline quality, with the accuracy of
// mma_tile.cuh's tiles: x's f32 rows are split into three bf16 parts (hi + mid + lo, all 24
// bits; launch_split_bf16_parts), and y = hi . w^T, then y += mid . w^T, then y += lo . w^T
// (cuBLAS's beta = 1, f32 accumulation and output). Rows go in passes of at most
// rows_per_pass(k), so the parts' scratch stays under kPartsBytes.
//
// cuBLAS picks its kernel (and so its reduction order) by shape: a row's sums may differ in
// the last bits between products of different n, unlike the hand-written tiles, whose sums of
// a row do not depend on the other rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

namespace sluice::cuda {

class CublasGemm {
 public:
  // The handle works on `stream` (the backend's), with a workspace of its own, so that the
  // products can also be captured into a graph.
  CublasGemm(int device, cudaStream_t stream);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  static constexpr int64_t kPartsBytes = int64_t{96} << 20;
  // Rows a pass takes for k columns: the three bf16 parts of that many rows fit kPartsBytes.
  static int64_t rows_per_pass(int64_t k);
  // y [n, m] f32 = x [n, k] f32 . w [m, k] bf16 ^T; parts: scratch of 3 * min(n,
  // rows_per_pass(k)) * k bf16, 16-byte aligned.
  void bf16(const float* x, const void* w, float* y, int64_t n, int64_t m, int64_t k, void* parts);

 private:
  struct Handle;
  std::unique_ptr<Handle> h_;
  cudaStream_t stream_;
};

// Whether prefill products of bf16 weights take cuBLAS: not with SLUICE_CUDA_CUBLAS=0 (the
// hand-written tiles instead), nor when cuBLAS cannot be loaded (said once on stderr).
bool cublas_enabled();

}  // namespace sluice::cuda
