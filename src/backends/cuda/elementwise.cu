// Elementwise ops (swiglu, swiglu_clamped, add, clamp, fill) and rope: one thread per element or pair.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/activations.cuh"

namespace sluice::cuda {
namespace {

__global__ void swiglu_kernel(const float* g, const float* u, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = swiglu(g[i], u[i]);
}
__global__ void swiglu_clamped_kernel(const float* g, const float* u, float* out, int64_t n, float alpha,
                                      float limit) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = swiglu_clamped(g[i], u[i], alpha, limit);
}
__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}
__global__ void clamp_kernel(float* x, float lo, float hi, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = fminf(fmaxf(x[i], lo), hi);
}
__global__ void fill_kernel(float* x, float v, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}
// One thread per (row, head, pair).
__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t n, int64_t heads, int64_t d,
                            int64_t rot, bool interleaved) {
  const int64_t half = rot / 2;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * heads * half) return;
  const int64_t p = t % half, row = t / half / heads, head = t / half % heads;
  float* xr = x + (row * heads + head) * d;
  const float c = cos[row * half + p], s = sin[row * half + p];
  const int64_t a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
  const float x1 = xr[a], x2 = xr[b];
  xr[a] = x1 * c - x2 * s;
  xr[b] = x2 * c + x1 * s;
}

}  // namespace

#define SLUICE_LAUNCH_1D(kernel, n, ...)                                                          \
  do {                                                                                            \
    if ((n) > 0) kernel<<<blocks_for((n), 256), 256, 0, static_cast<cudaStream_t>(s)>>>(__VA_ARGS__); \
    CUDA_CHECK(cudaGetLastError());                                                               \
  } while (0)

void launch_swiglu_clamped(const float* g, const float* u, float* out, int64_t n, float alpha, float limit, Stream s) {
  SLUICE_LAUNCH_1D(swiglu_clamped_kernel, n, g, u, out, n, alpha, limit);
}
void launch_swiglu(const float* g, const float* u, float* out, int64_t n, Stream s) { SLUICE_LAUNCH_1D(swiglu_kernel, n, g, u, out, n); }
void launch_add(float* x, const float* y, int64_t n, Stream s) { SLUICE_LAUNCH_1D(add_kernel, n, x, y, n); }
void launch_clamp(float* x, float lo, float hi, int64_t n, Stream s) { SLUICE_LAUNCH_1D(clamp_kernel, n, x, lo, hi, n); }
void launch_fill(float* x, float v, int64_t n, Stream s) { SLUICE_LAUNCH_1D(fill_kernel, n, x, v, n); }
void launch_rope(float* x, const float* cos, const float* sin, int64_t n, int64_t heads, int64_t d, int64_t rot,
                 bool interleaved, Stream s) {
  const int64_t total = n * heads * (rot / 2);
  SLUICE_LAUNCH_1D(rope_kernel, total, x, cos, sin, n, heads, d, rot, interleaved);
}

}  // namespace sluice::cuda
