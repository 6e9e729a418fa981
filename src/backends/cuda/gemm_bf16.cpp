// CublasGemm (gemm_bf16.h): three cublasGemmEx calls a pass of rows, one per bf16 part of x.
#include "backends/cuda/gemm_bf16.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    fail(Status::internal, "cuBLAS error ", cublasGetStatusName(st), " (", cublasGetStatusString(st), ") in ", what);
}

}  // namespace

struct CublasGemm::Handle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

bool cublas_enabled() {
  const char* e = std::getenv("SLUICE_CUDA_CUBLAS");
  return !(e && std::strcmp(e, "0") == 0);
}

CublasGemm::CublasGemm(int device, cudaStream_t stream) : h_(std::make_unique<Handle>()), stream_(stream) {
  CUDA_CHECK(cudaSetDevice(device));
  check(cublasCreate(&h_->handle), "cublasCreate");
  CUDA_CHECK(cudaMalloc(&h_->workspace, kWorkspaceBytes));
  check(cublasSetStream(h_->handle, stream), "cublasSetStream");
  check(cublasSetWorkspace(h_->handle, h_->workspace, kWorkspaceBytes), "cublasSetWorkspace");
  check(cublasSetMathMode(h_->handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CublasGemm::~CublasGemm() {
  if (h_->handle) cublasDestroy(h_->handle);
  if (h_->workspace) cudaFree(h_->workspace);
}

int64_t CublasGemm::rows_per_pass(int64_t k) { return std::max<int64_t>(16, kPartsBytes / (3 * 2 * std::max<int64_t>(k, 1))); }

void CublasGemm::bf16(const float* x, const void* w, float* y, int64_t n, int64_t m, int64_t k, void* parts) {
  const int64_t pass = rows_per_pass(k);
  auto* part = static_cast<uint16_t*>(parts);
  for (int64_t r0 = 0; r0 < n; r0 += pass) {
    const int64_t rows = std::min(pass, n - r0);
    launch_split_bf16_parts(x + r0 * k, rows, k, part, stream_);
    // Column-major view: y^T [m, rows] (ld m) = w^T [m, k] (w row-major [m][k]: ld k, op T) .
    // part^T [k, rows] (ld k).
    for (int i = 0; i < 3; ++i) {
      const float alpha = 1.0f, beta = i == 0 ? 0.0f : 1.0f;
      check(cublasGemmEx(h_->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(rows),
                         static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), part + i * rows * k,
                         CUDA_R_16BF, static_cast<int>(k), &beta, y + r0 * m, CUDA_R_32F, static_cast<int>(m),
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx (bf16 prefill product)");
    }
  }
}

}  // namespace sluice::cuda
