// CublasGemm (gemm_bf16.h): three cublasGemmEx calls a pass of rows, one per bf16 part of x.
//
// cuBLAS is opened with dlopen at the first product, not linked: mapping and relocating
// libcublas and libcublasLt (~700 MB of files) costs a process ~190 MB of resident memory at
// start, which every `sluice convert`, `synth` or CPU run of a CUDA build would pay (and which
// the memory bounds of their tests measure).
#include "backends/cuda/gemm_bf16.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "core/switches.h"

namespace sluice::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper

// The entry points CublasGemm calls, from the library dlopen found (null members: not found).
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // cublasGemmEx is overloaded in C++ (an inline form taking a cudaDataType compute type):
  // the C entry point's type, spelled out.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string error;  // why it could not be used ("" when it can)
};

// dlopen's search (LD_LIBRARY_PATH, the cache) first, then the toolkit this was built against.
const CublasApi& cublas_api() {
  static CublasApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublas.so." SLUICE_CUBLAS_MAJOR;
    void* lib = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = ::dlopen((std::string(SLUICE_CUBLAS_DIR "/") + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = ::dlerror();
      api.error = e ? e : soname + " not found";
      return;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(lib, name));
      if (!f && api.error.empty()) api.error = soname + " has no " + name;
    };
    sym(api.create, "cublasCreate_v2");
    sym(api.destroy, "cublasDestroy_v2");
    sym(api.set_stream, "cublasSetStream_v2");
    sym(api.set_workspace, "cublasSetWorkspace_v2");
    sym(api.set_math_mode, "cublasSetMathMode");
    sym(api.gemm_ex, "cublasGemmEx");
    sym(api.status_name, "cublasGetStatusName");
    sym(api.status_string, "cublasGetStatusString");
  });
  return api;
}

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    const CublasApi& a = cublas_api();
    fail(Status::internal, "cuBLAS error ", a.status_name(st), " (", a.status_string(st), ") in ", what);
  }
}

}  // namespace

struct CublasGemm::Handle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

bool cublas_enabled() {
  if (!switches::on(Switch::cuda_cublas)) return false;
  const CublasApi& api = cublas_api();
  if (!api.error.empty()) {
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr, "sluice: cuBLAS unavailable (%s): bf16 prefill products on the built-in tiles\n",
                   api.error.c_str());
    });
    return false;
  }
  return true;
}

CublasGemm::CublasGemm(int device, cudaStream_t stream) : h_(std::make_unique<Handle>()), stream_(stream) {
  const CublasApi& api = cublas_api();
  if (!api.error.empty()) fail(Status::internal, "cuBLAS unavailable: ", api.error);
  CUDA_CHECK(cudaSetDevice(device));
  check(api.create(&h_->handle), "cublasCreate");
  CUDA_CHECK(cudaMalloc(&h_->workspace, kWorkspaceBytes));
  check(api.set_stream(h_->handle, stream), "cublasSetStream");
  check(api.set_workspace(h_->handle, h_->workspace, kWorkspaceBytes), "cublasSetWorkspace");
  check(api.set_math_mode(h_->handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CublasGemm::~CublasGemm() {
  if (h_->handle) cublas_api().destroy(h_->handle);
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
      check(cublas_api().gemm_ex(h_->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(rows),
                                 static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), part + i * rows * k,
                                 CUDA_R_16BF, static_cast<int>(k), &beta, y + r0 * m, CUDA_R_32F, static_cast<int>(m),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx (bf16 prefill product)");
    }
  }
}

}  // namespace sluice::cuda
