// Hyper-connection and PLE ops on CUDA: hyper_mix (the input mixer of a gated residual),
// hyper_inject (a block's output added to every stream with its weight), ple_gate (PLE's
// per-stream gate on the n-gram value). As the CPU reference (cpu/hyper.cpp) and transformers'
// qwen4_exp evaluate them: products rounded on their own (__fmul_rn: never contracted into an
// fma), sums over streams in stream order, then the division. (The CPU build contracts some
// of those product-sums into fmas: GCC's C++ default is -ffp-contract=fast; the difference is
// the last bit, within the f32 tolerance of tests/gpu/cuda_hybrid_ops_test.cpp.)
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"

namespace sluice::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// One thread per output element (r, i).
__global__ void hyper_mix_kernel(const float* __restrict__ xn, const float* __restrict__ logits, float* out,
                                 int64_t n, int64_t n_stream, int64_t c) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * c) return;
  const int64_t r = t / c, i = t % c;
  const float* xr = xn + r * n_stream * c + i;
  const float* lr = logits + r * n_stream * c + i;
  float acc = __fmul_rn(sigmoid(lr[0]), xr[0]);
  for (int64_t s = 1; s < n_stream; ++s) acc = __fadd_rn(acc, __fmul_rn(sigmoid(lr[s * c]), xr[s * c]));
  out[t] = __fdiv_rn(acc, static_cast<float>(n_stream));
}

// One thread per element (r, s, i) of x.
__global__ void hyper_inject_kernel(float* x, const float* __restrict__ y, const float* __restrict__ w, int64_t n,
                                    int64_t n_stream, int64_t c) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * n_stream * c) return;
  const int64_t r = t / (n_stream * c), s = t / c % n_stream, i = t % c;
  x[t] = __fadd_rn(x[t], __fmul_rn(y[r * c + i], w[r * n_stream + s]));
}

// One warp per (row, stream): the score, then the gated value.
constexpr int kWarps = 4;
__global__ void ple_gate_kernel(const float* __restrict__ key, const float* __restrict__ query,
                                const float* __restrict__ value, float* out, int64_t n, int64_t n_stream, int64_t c,
                                float sqrt_c) {
  const int lane = threadIdx.x % 32;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;  // r * n_stream + s
  if (u >= n * n_stream) return;
  const int64_t r = u / n_stream;
  float a = 0.0f;
  for (int64_t i = lane; i < c; i += 32) a = fmaf(key[u * c + i], query[u * c + i], a);
  a = __fdiv_rn(warp_sum(a), sqrt_c);
  const float sign = a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f);
  a = __fmul_rn(__fsqrt_rn(fmaxf(fabsf(a), 1e-6f)), sign);
  const float gate = sigmoid(a);
  for (int64_t i = lane; i < c; i += 32) out[u * c + i] = __fmul_rn(gate, value[r * c + i]);
}

}  // namespace

void launch_hyper_mix(const float* xn, const float* logits, float* out, int64_t n, int64_t n_stream, int64_t c,
                      Stream s) {
  if (n * c == 0) return;
  hyper_mix_kernel<<<blocks_for(n * c, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(xn, logits, out, n, n_stream,
                                                                                      c);
  CUDA_CHECK(cudaGetLastError());
}

void launch_hyper_inject(float* x, const float* y, const float* w, int64_t n, int64_t n_stream, int64_t c, Stream s) {
  const int64_t total = n * n_stream * c;
  if (total == 0) return;
  hyper_inject_kernel<<<blocks_for(total, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(x, y, w, n, n_stream, c);
  CUDA_CHECK(cudaGetLastError());
}

void launch_ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
                     int64_t n_stream, int64_t c, Stream s) {
  const int64_t units = n * n_stream;
  if (units == 0 || c == 0) return;
  const float sqrt_c = static_cast<float>(std::sqrt(static_cast<double>(c)));  // as the CPU's
  ple_gate_kernel<<<blocks_for(units, kWarps), kWarps * 32, 0, static_cast<cudaStream_t>(s)>>>(
      key, query, value, out, n, n_stream, c, sqrt_c);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
