// activate and mul: the gates of the hybrid families (attention output gate, gated RMSNorm,
// shared-expert gate, hyper-connection weights) and Gemma 4's gelu_tanh gates and tanh logit
// softcap. One thread per element, evaluated as the CPU reference (cpu/activation.cpp) does:
// x / div only when div != 1, den = 1 + e^-x, sigmoid = 1 / den, silu = x / den (gelu_tanh
// and tanh through tanhf, as the CPU's std::tanh), times mul only when mul != 1. expf and
// tanhf differ from the CPU's by an ulp or two; mul is one rounding per element and exact.
#include "backends/cuda/activations.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice::cuda {
namespace {

// act: kActSigmoid, kActSilu, kActGeluTanh, kActTanh (hybrid_kernels.h).
__global__ void activate_kernel(float* x, int64_t n, int act, float in_div, float out_mul) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  if (in_div != 1.0f) v = __fdiv_rn(v, in_div);
  float y;
  if (act == kActTanh) {
    y = tanhf(v);
  } else if (act == kActGeluTanh) {
    y = gelu_tanh(v);
  } else {
    const float den = __fadd_rn(1.0f, expf(-v));
    y = act == kActSigmoid ? __fdiv_rn(1.0f, den) : __fdiv_rn(v, den);
  }
  if (out_mul != 1.0f) y = __fmul_rn(y, out_mul);
  x[i] = y;
}

__global__ void mul_kernel(float* x, const float* y, int64_t n, int64_t per_row_cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  x[i] = __fmul_rn(x[i], per_row_cols ? y[i / per_row_cols] : y[i]);
}

}  // namespace

void launch_activate(float* x, int64_t n, int act, float in_div, float out_mul, Stream s) {
  if (n == 0) return;
  activate_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(x, n, act, in_div, out_mul);
  CUDA_CHECK(cudaGetLastError());
}

void launch_mul(float* x, const float* y, int64_t n, int64_t per_row_cols, Stream s) {
  if (n == 0) return;
  mul_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(x, y, n, per_row_cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
