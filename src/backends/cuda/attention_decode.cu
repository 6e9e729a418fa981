// Decode attention (one query row) split over the context, flash-decoding style. The
// per-(row, head) blocks of attention.cu give a decode token only n_head blocks, each walking
// the whole context: 32 blocks on a GPU of 132 SMs, and 21 us a layer at 544 positions. Here:
//
//   grid (hkv, S): block (kv head, split s) serves the G = hq / hkv query heads that share the
//   kv head, so each key and value row is read once for all G of them; its kWarps warps take
//   chunks of 32 keys, chunk c to global warp c mod (S * kWarps). In a chunk lane t scores
//   key j0 + t against the G queries (in shared memory) with 16-byte loads of its key row;
//   each head's online softmax is updated once per chunk; then lane t accumulates the output
//   dims [DPL t, DPL (t + 1)) of all G heads over the chunk's values rows.
//
// The warps of a block merge in shared memory; the S blocks of a kv head write partial
// (max, denominator, output) rows, and the last of them to finish (a counter per kv head,
// reset by that block, so graph replays find it zero) merges the S partials into out. S is a
// function of the context capacity, not of the position, so a captured graph replays at any
// position with the same launch.
#include "backends/cuda/attention_decode.h"

#include "backends/cuda/common.cuh"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxSplits = 64;

// dynamic shared memory (floats): qs[G][d], ps[kWarps][G][32], then per warp (G (d + 2)):
// acc[G][d], max[G], denominator[G].
template <int DPL, int G>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                            float* __restrict__ out, float* __restrict__ part, int* __restrict__ counters,
                            int64_t hq, int64_t hkv, int64_t n_past_arg, const int32_t* __restrict__ n_past_dev,
                            float scale, int64_t window) {
  constexpr int d = 32 * DPL;
  extern __shared__ float smem[];
  float* qs = smem;
  float* ps = qs + G * d;
  float* merge = ps + kWarps * G * 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t kvh = blockIdx.x;
  const int S = gridDim.y, s = blockIdx.y;
  const int g_n = static_cast<int>(hq / hkv);  // query heads of this kv head (<= G)
  const int64_t pos = n_past_dev ? *n_past_dev : n_past_arg;
  const int64_t lo = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
    const int g = i / d;
    qs[i] = g < g_n ? q[(kvh * g_n + g) * d + i % d] : 0.0f;
  }
  __syncthreads();

  float acc[G][DPL], mx[G], den[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    mx[g] = -INFINITY;
    den[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[g][e] = 0.0f;
  }
  const int64_t stride = hkv * d;  // floats between consecutive positions
  const int64_t n_chunks = (pos - lo + 1 + 31) / 32;
  float* pw = ps + warp * G * 32;
  for (int64_t c = static_cast<int64_t>(s) * kWarps + warp; c < n_chunks; c += static_cast<int64_t>(S) * kWarps) {
    const int64_t j0 = lo + 32 * c, j = j0 + lane;
    float sc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) sc[g] = 0.0f;
    if (j <= pos) {
      const float4* kr = reinterpret_cast<const float4*>(k + j * stride + kvh * d);
      // The key row in batches of 8 float4 loads in flight.
      for (int b = 0; b < d / 4; b += 8) {
        float4 x[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) x[u] = __ldg(kr + b + u);
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float4 y = reinterpret_cast<const float4*>(qs + g * d)[b + u];
            sc[g] = fmaf(x[u].x, y.x, fmaf(x[u].y, y.y, fmaf(x[u].z, y.z, fmaf(x[u].w, y.w, sc[g]))));
          }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float sg = j <= pos ? sc[g] * scale : -INFINITY;
      const float m_new = fmaxf(mx[g], warp_max(sg));
      const float corr = expf(mx[g] - m_new);  // 0 on the first chunk (mx = -inf)
      const float p = j <= pos ? expf(sg - m_new) : 0.0f;
      den[g] = den[g] * corr + warp_sum(p);
#pragma unroll
      for (int e = 0; e < DPL; ++e) acc[g][e] *= corr;
      mx[g] = m_new;
      pw[g * 32 + lane] = p;
    }
    __syncwarp();
    const int64_t n_keys = pos - j0 + 1 < 32 ? pos - j0 + 1 : 32;
    const float* vr = v + j0 * stride + kvh * d + DPL * lane;
    // Values rows in batches of 8 loaded before any is used: a row's load costs a memory
    // round trip, and a warp has nothing else to do meanwhile (a few warps per SM).
    for (int t0 = 0; t0 < n_keys; t0 += 8) {
      float vv[8][DPL];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
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
      for (int u = 0; u < 8; ++u) {
        if (t0 + u >= n_keys) break;
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float pt = pw[g * 32 + t0 + u];
#pragma unroll
          for (int e = 0; e < DPL; ++e) acc[g][e] = fmaf(pt, vv[u][e], acc[g][e]);
        }
      }
    }
    __syncwarp();
  }

  // Merge the block's warps.
  float* mine = merge + warp * G * (d + 2);
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < DPL; ++e) mine[g * d + DPL * lane + e] = acc[g][e];
    if (lane == 0) {
      mine[G * d + g] = mx[g];
      mine[G * d + G + g] = den[g];
    }
  }
  __syncthreads();
  // Block result per (g, dim): m_b = max over warps, l_b = sum l_w e^(m_w - m_b),
  // o_b = sum o_w e^(m_w - m_b) (unnormalized). S = 1: out = o_b / l_b.
  float* pg = part + ((kvh * G) * S + s) * (d + 2);  // partial rows [hkv][G][S][d + 2]
  for (int i = threadIdx.x; i < g_n * d; i += blockDim.x) {
    const int g = i / d, c = i % d;
    float m_b = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_b = fmaxf(m_b, merge[w * G * (d + 2) + G * d + g]);
    float l_b = 0.0f, o_b = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float* mw = merge + w * G * (d + 2);
      const float f = mw[G * d + g] == -INFINITY ? 0.0f : expf(mw[G * d + g] - m_b);
      l_b += mw[G * d + G + g] * f;
      o_b += mw[g * d + c] * f;
    }
    if (S == 1) {
      out[(kvh * g_n + g) * d + c] = o_b / l_b;
    } else {
      float* row = pg + static_cast<int64_t>(g) * S * (d + 2);
      row[c] = o_b;
      if (c == 0) {
        row[d] = m_b;
        row[d + 1] = l_b;
      }
    }
  }
  if (S == 1) return;
  // The last block of this kv head merges the S partials.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counters + kvh, 1) == S - 1;
    if (last) counters[kvh] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < g_n * d; i += blockDim.x) {
    const int g = i / d, c = i % d;
    const volatile float* rows = part + (kvh * G + g) * S * (d + 2);
    float m_all = -INFINITY;
    for (int t = 0; t < S; ++t) m_all = fmaxf(m_all, rows[t * (d + 2) + d]);
    float l = 0.0f, o = 0.0f;
    for (int t = 0; t < S; ++t) {
      const float m_t = rows[t * (d + 2) + d];
      const float f = m_t == -INFINITY ? 0.0f : expf(m_t - m_all);  // a split that saw no key
      l += rows[t * (d + 2) + d + 1] * f;
      o += rows[t * (d + 2) + c] * f;
    }
    out[(kvh * g_n + g) * d + c] = o / l;
  }
}

int group_bound(int64_t g) { return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : g <= 8 ? 8 : 16; }

template <int DPL, int G>
void launch_dg(const AttentionDecodeArgs& a, int S, cudaStream_t st) {
  constexpr int d = 32 * DPL;
  const size_t smem = (static_cast<size_t>(G) * d + kWarps * G * 32 + kWarps * G * (d + 2)) * sizeof(float);
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(attention_decode_kernel<DPL, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
  attention_decode_kernel<DPL, G><<<dim3(static_cast<unsigned>(a.hkv), static_cast<unsigned>(S)), kWarps * 32, smem,
                                    st>>>(a.q, a.k, a.v, a.out, a.partials, a.counters, a.hq, a.hkv, a.n_past,
                                          a.n_past_dev, a.scale, a.window);
}

template <int DPL>
void launch_d(const AttentionDecodeArgs& a, int S, cudaStream_t st) {
  switch (group_bound(a.hq / a.hkv)) {
    case 1: launch_dg<DPL, 1>(a, S, st); break;
    case 2: launch_dg<DPL, 2>(a, S, st); break;
    case 4: launch_dg<DPL, 4>(a, S, st); break;
    case 8: launch_dg<DPL, 8>(a, S, st); break;
    default:
      if constexpr (DPL <= 4) launch_dg<DPL, 16>(a, S, st);
      break;
  }
}

}  // namespace

bool attention_decode_supported(int64_t hq, int64_t hkv, int64_t d, const void* q, const void* k, const void* v) {
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v)) & 15) == 0;
  if (!aligned || hkv <= 0 || hq % hkv != 0 || hkv > kAttentionDecodeMaxKvHeads) return false;
  const int64_t g = hq / hkv;
  if (g > 16) return false;
  if (d != 64 && d != 128 && d != 256) return false;
  return group_bound(g) * (d / 32) <= 64;
}

int attention_decode_splits(int64_t n_ctx) {
  const int64_t s = (n_ctx + 32 * kWarps - 1) / (32 * kWarps);
  return static_cast<int>(s < 1 ? 1 : s > kMaxSplits ? kMaxSplits : s);
}

int64_t attention_decode_partial_floats(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx) {
  return hkv * group_bound(hq / hkv) * attention_decode_splits(n_ctx) * (d + 2);
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
