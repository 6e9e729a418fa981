// Causal grouped-query attention, decode and prefill in one kernel: one block per (query row,
// head), its kWarps warps splitting the visible keys (warp w takes keys lo + w, lo + w +
// kWarps, ...), each with an online softmax; the warps' partial (max, denominator, output)
// are then merged in shared memory. A key's score is a warp-wide dot product; each lane owns
// the head dimensions lane, lane + 32, ... (head_dim <= 32 * kMaxDimsPerLane). One launch
// whatever the number of query rows.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kMaxDimsPerLane = 16;  // head_dim up to 512
constexpr int kWarps = 8;            // key splits per (row, head)

// dynamic shared memory: kWarps * (d + 2) floats.
__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                 const float* __restrict__ v, float* __restrict__ out, int64_t n, int64_t hq,
                                 int64_t hkv, int64_t d, int64_t n_past, float scale, int64_t window) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = blockIdx.x;  // (row i, head h)
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
  for (int64_t j = lo + warp; j <= pos; j += kWarps) {
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
  // Merge the warps: warp w's state at smem[w * (d + 2)]: acc[d], max, denominator.
  float* mine = smem + warp * (d + 2);
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < d) mine[c] = acc[t];
  }
  if (lane == 0) {
    mine[d] = mx;
    mine[d + 1] = denom;
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, smem[w * (d + 2) + d]);
  float den = 0.0f;
  float f[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mw = smem[w * (d + 2) + d];
    f[w] = mw == -INFINITY ? 0.0f : expf(mw - m_all);  // a warp that saw no key contributes nothing
    den += smem[w * (d + 2) + d + 1] * f[w];
  }
  float* o = out + (i * hq + h) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += smem[w * (d + 2) + c] * f[w];
    o[c] = s / den;
  }
}

}  // namespace

void launch_attention(const float* q, const float* k, const float* v, float* out, int64_t n, int64_t hq, int64_t hkv,
                      int64_t d, int64_t n_past, float scale, int64_t window, Stream s) {
  SLUICE_CHECK(d <= 32 * kMaxDimsPerLane, Status::unsupported, "cuda attention: head_dim ", d, " exceeds ",
               32 * kMaxDimsPerLane);
  if (n == 0) return;
  const size_t smem = static_cast<size_t>(kWarps) * (d + 2) * sizeof(float);
  attention_kernel<<<static_cast<unsigned>(n * hq), kWarps * 32, smem, static_cast<cudaStream_t>(s)>>>(
      q, k, v, out, n, hq, hkv, d, n_past, scale, window);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
