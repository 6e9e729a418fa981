// Decode attention (one query row) split over the context, flash-decoding style. The
// per-(row, head) blocks of attention.cu give a decode token only n_head blocks, each walking
// the whole context (32 blocks on a GPU of 132 SMs: 21 us a layer at 544 positions). Here:
//
//   grid (hq, S): block (head, split s); its kWarps warps take chunks of 32 keys, chunk c to
//   warp c mod (S * kWarps) of the head. In a chunk lane t scores key j0 + t (its key row in
//   16-byte loads, kBatch in flight), the warp's online softmax is updated once, and lane t
//   accumulates the output dims [DPL t, DPL (t + 1)) over the chunk's values rows (kBatch
//   rows loaded before any is used). A decode token is latency-bound: what counts is memory
//   round trips per warp and warps in flight, not bytes (a query head re-reads its kv head's
//   rows from L2; a variant serving the G heads of a kv head per block, with G-fold unrolled
//   code, measured slower: 27 us).
//
// The warps of a block merge in shared memory; the S blocks of a head write partial
// (max, denominator, output) rows, and the last of them to finish (a counter per head, reset
// by that block, so graph replays find it zero) merges the S partials into out. S is a
// function of the context capacity, not of the position, so a captured graph replays at any
// position with the same launch.
#include "backends/cuda/attention_decode.h"

#include "backends/cuda/common.cuh"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxSplits = 64;
constexpr int kBatch = 16;  // key or value rows (16-byte loads) a lane has in flight at once

// dynamic shared memory (floats): qs[d], ps[kWarps][32], then per warp (d + 2): acc[d], max,
// denominator.
template <int DPL>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                            float* __restrict__ out, float* __restrict__ part, int* __restrict__ counters,
                            int64_t hq, int64_t hkv, int64_t n_past_arg, const int32_t* __restrict__ n_past_dev,
                            float scale, int64_t window) {
  chained_kernel_entry();
  constexpr int d = 32 * DPL;
  extern __shared__ float smem[];
  float* qs = smem;
  float* ps = qs + d;
  float* merge = ps + kWarps * 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.x, kvh = h / (hq / hkv);
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t pos = n_past_dev ? *n_past_dev : n_past_arg;
  const int64_t lo = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = q[h * d + i];
  __syncthreads();

  float acc[DPL];
#pragma unroll
  for (int e = 0; e < DPL; ++e) acc[e] = 0.0f;
  float mx = -INFINITY, den = 0.0f;
  const int64_t stride = hkv * d;  // floats between consecutive positions
  const int64_t n_chunks = (pos - lo + 1 + 31) / 32;
  float* pw = ps + warp * 32;
  for (int64_t c = static_cast<int64_t>(s) * kWarps + warp; c < n_chunks; c += static_cast<int64_t>(S) * kWarps) {
    const int64_t j0 = lo + 32 * c, j = j0 + lane;
    float sc = 0.0f;
    if (j <= pos) {
      const float4* kr = reinterpret_cast<const float4*>(k + j * stride + kvh * d);
      const float4* q4 = reinterpret_cast<const float4*>(qs);
#pragma unroll
      for (int b = 0; b < d / 4; b += kBatch) {
        float4 x[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) x[u] = __ldg(kr + b + u);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float4 y = q4[b + u];
          sc = fmaf(x[u].x, y.x, fmaf(x[u].y, y.y, fmaf(x[u].z, y.z, fmaf(x[u].w, y.w, sc))));
        }
      }
    }
    const float sg = j <= pos ? sc * scale : -INFINITY;
    const float m_new = fmaxf(mx, warp_max(sg));
    const float corr = expf(mx - m_new);  // 0 on the first chunk (mx = -inf)
    const float p = j <= pos ? expf(sg - m_new) : 0.0f;
    den = den * corr + warp_sum(p);
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[e] *= corr;
    mx = m_new;
    pw[lane] = p;
    __syncwarp();
    const int n_keys = static_cast<int>(pos - j0 + 1 < 32 ? pos - j0 + 1 : 32);
    const float* vr = v + j0 * stride + kvh * d + DPL * lane;
    // Values rows kBatch at a time, loaded before any is used.
    for (int t0 = 0; t0 < n_keys; t0 += kBatch) {
      float vv[kBatch][DPL];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int t = t0 + u < n_keys ? t0 + u : n_keys - 1;  // past the end: a row loaded, unused
        const float* row = vr + t * stride;
        if constexpr (DPL % 4 == 0) {
#pragma unroll
          for (int e = 0; e < DPL; e += 4) {
            const float4 x = __ldg(reinterpret_cast<const float4*>(row + e));
            vv[u][e] = x.x;
            vv[u][e + 1] = x.y;
            vv[u][e + 2] = x.z;
            vv[u][e + 3] = x.w;
          }
        } else {
          const float2 x = __ldg(reinterpret_cast<const float2*>(row));  // DPL = 2
          vv[u][0] = x.x;
          vv[u][1] = x.y;
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float pt = t0 + u < n_keys ? pw[t0 + u] : 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[e] = fmaf(pt, vv[u][e], acc[e]);
      }
    }
    __syncwarp();
  }

  // Merge the block's warps: m_b = max over warps, l_b = sum l_w e^(m_w - m_b),
  // o_b = sum o_w e^(m_w - m_b) (unnormalized). S = 1: out = o_b / l_b.
  float* mine = merge + warp * (d + 2);
#pragma unroll
  for (int e = 0; e < DPL; ++e) mine[DPL * lane + e] = acc[e];
  if (lane == 0) {
    mine[d] = mx;
    mine[d + 1] = den;
  }
  __syncthreads();
  float* row = part + (h * S + s) * (d + 2);  // partial rows [hq][S][d + 2]
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float m_b = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_b = fmaxf(m_b, merge[w * (d + 2) + d]);
    float l_b = 0.0f, o_b = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float* mw = merge + w * (d + 2);
      const float f = mw[d] == -INFINITY ? 0.0f : expf(mw[d] - m_b);  // a warp that saw no key
      l_b += mw[d + 1] * f;
      o_b += mw[c] * f;
    }
    if (S == 1) {
      out[h * d + c] = o_b / l_b;
    } else {
      row[c] = o_b;
      if (c == 0) {
        row[d] = m_b;
        row[d + 1] = l_b;
      }
    }
  }
  if (S == 1) return;
  // The last block of this head merges the S partials.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counters + h, 1) == S - 1;
    if (last) counters[h] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const volatile float* rows = part + h * S * (d + 2);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float m_all = -INFINITY;
    for (int t = 0; t < S; ++t) m_all = fmaxf(m_all, rows[t * (d + 2) + d]);
    float l = 0.0f, o = 0.0f;
    for (int t = 0; t < S; ++t) {
      const float m_t = rows[t * (d + 2) + d];
      const float f = m_t == -INFINITY ? 0.0f : expf(m_t - m_all);  // a split that saw no key
      l += rows[t * (d + 2) + d + 1] * f;
      o += rows[t * (d + 2) + c] * f;
    }
    out[h * d + c] = o / l;
  }
}

template <int DPL>
void launch_d(const AttentionDecodeArgs& a, int S, cudaStream_t st) {
  constexpr int d = 32 * DPL;
  const size_t smem = (static_cast<size_t>(d) + kWarps * 32 + kWarps * (d + 2)) * sizeof(float);
  launch_chained(attention_decode_kernel<DPL>, dim3(static_cast<unsigned>(a.hq), static_cast<unsigned>(S)),
                 dim3(kWarps * 32), smem, st, a.q, a.k, a.v, a.out, a.partials, a.counters, a.hq, a.hkv, a.n_past,
                 a.n_past_dev, a.scale, a.window);
}

}  // namespace

bool attention_decode_supported(int64_t hq, int64_t hkv, int64_t d, const void* q, const void* k, const void* v) {
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v)) & 15) == 0;
  return aligned && hkv > 0 && hq % hkv == 0 && hq <= kAttentionDecodeMaxHeads && (d == 64 || d == 128 || d == 256);
}

int attention_decode_splits(int64_t n_ctx) {
  const int64_t s = (n_ctx + 32 * kWarps - 1) / (32 * kWarps);
  return static_cast<int>(s < 1 ? 1 : s > kMaxSplits ? kMaxSplits : s);
}

int64_t attention_decode_partial_floats(int64_t hq, int64_t d, int64_t n_ctx) {
  return hq * attention_decode_splits(n_ctx) * (d + 2);
}

void launch_attention_decode(const AttentionDecodeArgs& a, Stream s) {
  SLUICE_CHECK(attention_decode_supported(a.hq, a.hkv, a.d, a.q, a.k, a.v), Status::internal,
               "cuda attention_decode: unsupported shape (hq ", a.hq, ", hkv ", a.hkv, ", d ", a.d, ")");
  const int S = attention_decode_splits(a.n_ctx);
  auto st = static_cast<cudaStream_t>(s);
  switch (a.d) {
    case 64: launch_d<2>(a, S, st); break;
    case 128: launch_d<4>(a, S, st); break;
    default: launch_d<8>(a, S, st); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
