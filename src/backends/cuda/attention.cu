// Causal grouped-query attention: one warp per (query row, head) with an online softmax
// over the visible keys. A key's score is a warp-wide dot product; each lane owns the
// head dimensions lane, lane + 32, ... of the output (head_dim <= 32 * kMaxDimsPerLane).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kMaxDimsPerLane = 16;  // head_dim up to 512
constexpr int kWarps = 4;

__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                 const float* __restrict__ v, float* __restrict__ out, int64_t n, int64_t hq,
                                 int64_t hkv, int64_t d, int64_t n_past, float scale, int64_t window) {
  const int lane = threadIdx.x % 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (task >= n * hq) return;
  const int64_t i = task / hq, h = task % hq, kvh = h / (hq / hkv);
  const int64_t pos = n_past + i;
  const int64_t lo = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
  const float* qr = q + (i * hq + h) * d;
  float qv[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    qv[t] = c < d ? qr[c] : 0.0f;
    acc[t] = 0.0f;
  }
  float mx = -INFINITY, denom = 0.0f;
  for (int64_t j = lo; j <= pos; ++j) {
    const float* kr = k + (j * hkv + kvh) * d;
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) s = fmaf(qv[t], kr[c], s);
    }
    s = warp_sum(s) * scale;
    const float mx_new = fmaxf(mx, s);
    const float corr = expf(mx - mx_new), p = expf(s - mx_new);
    denom = denom * corr + p;
    const float* vr = v + (j * hkv + kvh) * d;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) acc[t] = acc[t] * corr + p * vr[c];
    }
    mx = mx_new;
  }
  float* o = out + (i * hq + h) * d;
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < d) o[c] = acc[t] / denom;
  }
}

}  // namespace

void launch_attention(const float* q, const float* k, const float* v, float* out, int64_t n, int64_t hq, int64_t hkv,
                      int64_t d, int64_t n_past, float scale, int64_t window, Stream s) {
  SLUICE_CHECK(d <= 32 * kMaxDimsPerLane, Status::unsupported, "cuda attention: head_dim ", d, " exceeds ",
               32 * kMaxDimsPerLane);
  if (n == 0) return;
  attention_kernel<<<blocks_for(n * hq, kWarps), kWarps * 32, 0, static_cast<cudaStream_t>(s)>>>(
      q, k, v, out, n, hq, hkv, d, n_past, scale, window);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
