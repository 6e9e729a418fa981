// Causal grouped-query attention, decode and prefill in one launch: one block per (query row,
// head), f32 FMA (launch_attention_rows); launch_attention_at sends many query rows to the
// tensor-core kernel of attention_flash.cu instead. Head dims a multiple of 32 take
// attention_keys_kernel (a lane per key, below); others this one: its kWarps warps splitting
// the visible keys (warp w takes keys lo + w, lo + w + kWarps, ...), each with an online
// softmax; the warps' partial (max, denominator, output) are then merged in shared memory. A
// key's score is a warp-wide dot product; each lane owns the head dimensions lane, lane + 32,
// ... (head_dim <= 32 * kMaxDimsPerLane). One launch whatever the number of query rows. The
// caches are KV (f32, or bf16 read as its exact f32 value); all arithmetic is f32.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kMaxDimsPerLane = 16;  // head_dim up to 512
constexpr int kWarps = 8;            // key splits per (row, head)

// dynamic shared memory: kWarps * (d + 2) floats.
template <typename KV>
__global__ void attention_kernel(const float* __restrict__ q, const KV* __restrict__ k,
                                 const KV* __restrict__ v, float* __restrict__ out, int64_t n, int64_t hq,
                                 int64_t hkv, int64_t d, int64_t n_past_arg, const int32_t* __restrict__ n_past_dev,
                                 float scale_arg, const AttentionSpan span, const float* __restrict__ sinks) {
  extern __shared__ float smem[];
  const int64_t n_past = n_past_dev ? *n_past_dev : n_past_arg;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = blockIdx.x;  // (row i, head h)
  const int64_t i = task / hq, h = task % hq, kvh = h / (hq / hkv);
  const int64_t pos = n_past + i;
  const int64_t lo = attention_lo(pos, span);
  const float scale = attention_scale_at(scale_arg, pos, span);
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
    const KV* kr = k + (j * hkv + kvh) * d;
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) s = fmaf(qv[t], kv_at<false>(kr, c), s);
    }
    s = warp_sum(s) * scale;
    const float mx_new = fmaxf(mx, s);
    const float corr = expf(mx - mx_new), p = expf(s - mx_new);
    denom = denom * corr + p;
    const KV* vr = v + (j * hkv + kvh) * d;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) acc[t] = acc[t] * corr + p * kv_at<false>(vr, c);
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
    o[c] = softmax_finish(s, den, m_all, sinks, h);
  }
}

// head_dim a multiple of 32 (up to 32 * kMaxDimsPerLane): a lane per key. Warp w takes the
// chunks of 32 keys starting at lo + 32 (w + kWarps i); in a chunk, lane t scores key
// j0 + t against q (in shared memory) with independent 16-byte loads of its key row, the
// warp updates its online softmax once per chunk, and lane t accumulates the output dims
// [DPL t, DPL (t + 1)) over the chunk's 32 values rows. Merged across warps as above.
// dynamic shared memory: kWarps * (d + 2) + d floats.
template <int DPL, typename KV>
__global__ void attention_keys_kernel(const float* __restrict__ q, const KV* __restrict__ k,
                                      const KV* __restrict__ v, float* __restrict__ out, int64_t n, int64_t hq,
                                      int64_t hkv, int64_t n_past_arg, const int32_t* __restrict__ n_past_dev,
                                      float scale_arg, const AttentionSpan span, const float* __restrict__ sinks) {
  constexpr int64_t d = 32 * DPL;
  extern __shared__ float smem[];
  float* qs = smem + kWarps * (d + 2);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n_past = n_past_dev ? *n_past_dev : n_past_arg;
  const int64_t task = blockIdx.x;
  const int64_t i = task / hq, h = task % hq, kvh = h / (hq / hkv);
  const int64_t pos = n_past + i;
  const int64_t lo = attention_lo(pos, span);
  const float scale = attention_scale_at(scale_arg, pos, span);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[(i * hq + h) * d + c];
  __syncthreads();
  float acc[DPL];
#pragma unroll
  for (int t = 0; t < DPL; ++t) acc[t] = 0.0f;
  float mx = -INFINITY, denom = 0.0f;
  const int64_t stride = hkv * d;  // floats between consecutive positions
  for (int64_t j0 = lo + 32 * warp; j0 <= pos; j0 += 32 * kWarps) {
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    if (j <= pos) {
      const KV* kr = k + j * stride + kvh * d;
      const float4* q4 = reinterpret_cast<const float4*>(qs);
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int c = 0; c < d / 4; c += 2) {
        float x[4];
        kv_load<4, true>(kr + 4 * c, x);
        const float4 y = q4[c];
        a0 = fmaf(x[0], y.x, fmaf(x[1], y.y, fmaf(x[2], y.z, fmaf(x[3], y.w, a0))));
        if (c + 1 < d / 4) {
          float x1[4];
          kv_load<4, true>(kr + 4 * (c + 1), x1);
          const float4 y1 = q4[c + 1];
          a1 = fmaf(x1[0], y1.x, fmaf(x1[1], y1.y, fmaf(x1[2], y1.z, fmaf(x1[3], y1.w, a1))));
        }
      }
      s = (a0 + a1) * scale;
    }
    const float m_new = fmaxf(mx, warp_max(s));
    const float corr = expf(mx - m_new);  // 0 on the first chunk (mx = -inf)
    const float p = j <= pos ? expf(s - m_new) : 0.0f;
    denom = denom * corr + warp_sum(p);
#pragma unroll
    for (int t = 0; t < DPL; ++t) acc[t] *= corr;
    const int64_t n_keys = pos - j0 + 1 < 32 ? pos - j0 + 1 : 32;
    const KV* vr = v + j0 * stride + kvh * d + DPL * lane;
    if (n_keys == 32) {
      // A whole chunk: unrolled, so that the loads of several values rows are in flight.
#pragma unroll 8
      for (int t = 0; t < 32; ++t) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
        const KV* vt = vr + t * stride;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[e] = fmaf(pt, kv_at<true>(vt, e), acc[e]);
      }
    } else {
      for (int t = 0; t < n_keys; ++t) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
        const KV* vt = vr + t * stride;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[e] = fmaf(pt, kv_at<true>(vt, e), acc[e]);
      }
    }
    mx = m_new;
  }
  float* mine = smem + warp * (d + 2);
#pragma unroll
  for (int t = 0; t < DPL; ++t) mine[DPL * lane + t] = acc[t];
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
    f[w] = mw == -INFINITY ? 0.0f : expf(mw - m_all);
    den += smem[w * (d + 2) + d + 1] * f[w];
  }
  float* o = out + (i * hq + h) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += smem[w * (d + 2) + c] * f[w];
    o[c] = softmax_finish(sum, den, m_all, sinks, h);
  }
}

template <typename KV>
void launch_rows(const AttentionParams& p, cudaStream_t st) {
  const float* q = p.q;
  const KV *k = static_cast<const KV*>(p.k), *v = static_cast<const KV*>(p.v);
  float* out = p.out;
  const int64_t n = p.n, hq = p.hq, hkv = p.hkv, d = p.d, n_past = p.n_past;
  const AttentionSpan span = p.span();
  const int32_t* n_past_dev = p.n_past_dev;
  const float scale = p.scale;
  const unsigned blocks = static_cast<unsigned>(n * hq);
  const size_t smem_keys = (static_cast<size_t>(kWarps) * (d + 2) + d) * sizeof(float);
  // Lane per key: vector loads need d % 4 == 0 with 16-byte aligned q, k and v.
  const bool aligned = ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(v)) & 15) == 0;
  if (aligned && d % 32 == 0 && d <= 256) {
    switch (d / 32) {
#define SLUICE_ATT_CASE(DPL)                                                                                \
  case DPL:                                                                                              \
    attention_keys_kernel<DPL, KV><<<blocks, kWarps * 32, smem_keys, st>>>(q, k, v, out, n, hq, hkv, n_past, \
                                                                           n_past_dev, scale, span, p.sinks); \
    break;
      SLUICE_ATT_CASE(1)
      SLUICE_ATT_CASE(2)
      SLUICE_ATT_CASE(3)
      SLUICE_ATT_CASE(4)
      SLUICE_ATT_CASE(5)
      SLUICE_ATT_CASE(6)
      SLUICE_ATT_CASE(7)
      SLUICE_ATT_CASE(8)
#undef SLUICE_ATT_CASE
    }
    return;
  }
  const size_t smem = static_cast<size_t>(kWarps) * (d + 2) * sizeof(float);
  attention_kernel<KV><<<blocks, kWarps * 32, smem, st>>>(q, k, v, out, n, hq, hkv, d, n_past, n_past_dev, scale,
                                                          span, p.sinks);
}

}  // namespace

void launch_attention_rows(const AttentionParams& p, Stream s) {
  SLUICE_CHECK(p.d <= 32 * kMaxDimsPerLane, Status::unsupported, "cuda attention: head_dim ", p.d, " exceeds ",
               32 * kMaxDimsPerLane);
  if (p.n == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  if (p.kv_bf16) launch_rows<__nv_bfloat16>(p, st);
  else launch_rows<float>(p, st);
  CUDA_CHECK(cudaGetLastError());
}

void launch_attention_at(const AttentionParams& p, Stream s) {
  // The flash kernel scales every row of a Q tile alike: rows with temperatures of their own go
  // to the per-row kernels.
  if (p.n >= kAttentionFlashMinRows && attention_flash_supported(p) && p.temperature_floor_scale == 0)
    launch_attention_flash(p, s);
  else launch_attention_rows(p, s);
}

}  // namespace sluice::cuda
