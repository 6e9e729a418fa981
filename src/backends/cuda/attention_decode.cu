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
//
// Grouped-query heads (G = hq / hkv >= 2) take attention_decode_gqa_kernel instead: there the
// kernel above re-reads each kv head's rows G times (from L2), which at long context is what
// bounds it (8192 positions, G = 8: 268 MB of L2 reads a layer, 61.6 us on the H200, 0.54 TB/s
// of the cache's own bytes). The GQA kernel reads each row once:
//
//   grid (hkv, S), block W warps; round t of block (kv head, s) stages chunks
//   [(t S + s) R, +R) of 32 keys (K and V rows, cp.async into padded shared rows while the
//   round before is scored, positions past the query zero-filled) and every query head of the kv head scores them: a warp per
//   (head, staged chunk) for G < 8 (R = 8 / G chunks a round, as shared memory allows), a
//   warp per HPW heads for G >= 8. Lane t scores key t of the chunk, the warp's online
//   softmax is updated once, and lane t accumulates dims [DPL t, DPL (t + 1)) of the output.
//   The block's warps then merge per head in shared memory, and the last block of the kv
//   head to finish merges the S partial rows of its G heads, as above.
#include "backends/cuda/attention_decode.h"

#include <algorithm>

#include "backends/cuda/common.cuh"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxSplits = 64;
constexpr int kBatch = 16;  // key or value rows (16-byte loads) a lane has in flight at once
constexpr int64_t kMaxGqaSplits = 64;

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

// dynamic shared memory (floats): qs[G][d]; two buffers of staged rows, each ks[32 R][d + 4]
// then vs[32 R][d + 4] (rows padded by 16 bytes: lane t reads row t, so unpadded rows would
// put every lane in one bank; round t + 1 is copied in while round t is scored); the warp
// states [R][G][d + 2]: acc[d], max, denominator.
//
// A batch decode step (kPerRow): blockIdx.z is the batch row b, a sequence of its own with
// caches row_caches.k[b] / .v[b] at position n_past_dev[b]; q, out, the partials and the
// counters are row b's.
template <int DPL, int HPW, bool kPerRow>
__global__ void __launch_bounds__(256)
    attention_decode_gqa_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                float* __restrict__ out, float* __restrict__ part, int* __restrict__ counters,
                                int hq, int hkv, int R, int64_t n_past_arg, const int32_t* __restrict__ n_past_dev,
                                float scale, int64_t window, const RowCachePtrs row_caches) {
  chained_kernel_entry();
  constexpr int d = 32 * DPL, ds = d + 4;
  extern __shared__ float smem[];
  const int G = hq / hkv, rows = 32 * R;
  float* qs = smem;
  float* stage = qs + G * d;  // [2][2][rows][ds]: buffer, K or V
  float* merge = stage + 4 * rows * ds;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = blockDim.x / 32;
  const int kvh = blockIdx.x, S = gridDim.y, s = blockIdx.y;
  if constexpr (kPerRow) {
    const int b = blockIdx.z;
    k = row_caches.k[b];
    v = row_caches.v[b];
    q += static_cast<int64_t>(b) * hq * d;
    out += static_cast<int64_t>(b) * hq * d;
    part += static_cast<int64_t>(b) * hq * S * ds;
    counters += b * hkv;
    n_past_dev += b;
  }
  const int64_t pos = n_past_dev ? *n_past_dev : n_past_arg;
  const int64_t lo = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
  const int64_t n_chunks = (pos - lo + 1 + 31) / 32;
  const int64_t stride = static_cast<int64_t>(hkv) * d;  // floats between consecutive positions
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) qs[i] = q[static_cast<int64_t>(kvh) * G * d + i];

  // Copies the K and V rows of the round starting at chunk c0 into buffer buf (one group).
  auto stage_round = [&](int buf, int64_t c0) {
    float* ks = stage + buf * 2 * rows * ds;
    float* vs = ks + rows * ds;
    const int64_t j_base = lo + 32 * c0;
    for (int idx = threadIdx.x; idx < rows * (d / 4); idx += blockDim.x) {
      const int i = idx / (d / 4), col = 4 * (idx % (d / 4));
      const int64_t j = j_base + i;
      const bool valid = j <= pos;
      const int64_t off = (valid ? j * stride : 0) + static_cast<int64_t>(kvh) * d + col;
      cp_async16(ks + i * ds + col, k + off, valid);
      cp_async16(vs + i * ds + col, v + off, valid);
    }
    cp_async_commit();
  };

  // This warp's work: chunk r of each round, heads g[hh] (g >= G: none).
  const int r = R > 1 ? warp / G : 0;
  int g[HPW];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) g[hh] = R > 1 ? (r < R ? warp % G : G) : warp + W * hh;
  float acc[HPW][DPL], mx[HPW], den[HPW];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    mx[hh] = -INFINITY;
    den[hh] = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[hh][e] = 0.0f;
  }

  const int64_t step = static_cast<int64_t>(S) * R;
  if (static_cast<int64_t>(s) * R < n_chunks) stage_round(0, static_cast<int64_t>(s) * R);
  int buf = 0;
  for (int64_t c0 = static_cast<int64_t>(s) * R; c0 < n_chunks; c0 += step, buf ^= 1) {
    if (c0 + step < n_chunks) {
      stage_round(buf ^ 1, c0 + step);  // that buffer's last readers passed the barrier below
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* ks = stage + buf * 2 * rows * ds;
    const float* vs = ks + rows * ds;
    const int64_t j = lo + 32 * (c0 + r) + lane;  // this lane's key
    const float* krow = ks + (32 * r + lane) * ds;
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      if (g[hh] >= G) continue;  // warp-uniform
      const float4* q4 = reinterpret_cast<const float4*>(qs + g[hh] * d);
      const float4* k4 = reinterpret_cast<const float4*>(krow);
      float sc = 0.0f;
#pragma unroll
      for (int b = 0; b < d / 4; ++b) {
        const float4 x = k4[b], y = q4[b];
        sc = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, sc))));
      }
      const float sg = j <= pos ? sc * scale : -INFINITY;
      const float m_new = fmaxf(mx[hh], warp_max(sg));
      if (m_new == -INFINITY) continue;  // a staged chunk wholly past the query, before any key
      const float corr = expf(mx[hh] - m_new);  // 0 on the first chunk (mx = -inf)
      const float p = j <= pos ? expf(sg - m_new) : 0.0f;
      den[hh] = den[hh] * corr + warp_sum(p);
      mx[hh] = m_new;
#pragma unroll
      for (int e = 0; e < DPL; ++e) acc[hh][e] *= corr;
      const float* vcol = vs + 32 * r * ds + DPL * lane;
#pragma unroll 8
      for (int t = 0; t < 32; ++t) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
        const float* vr = vcol + t * ds;
        if constexpr (DPL % 4 == 0) {
#pragma unroll
          for (int e = 0; e < DPL; e += 4) {
            const float4 x = *reinterpret_cast<const float4*>(vr + e);
            acc[hh][e] = fmaf(pt, x.x, acc[hh][e]);
            acc[hh][e + 1] = fmaf(pt, x.y, acc[hh][e + 1]);
            acc[hh][e + 2] = fmaf(pt, x.z, acc[hh][e + 2]);
            acc[hh][e + 3] = fmaf(pt, x.w, acc[hh][e + 3]);
          }
        } else {
          const float2 x = *reinterpret_cast<const float2*>(vr);  // DPL = 2
          acc[hh][0] = fmaf(pt, x.x, acc[hh][0]);
          acc[hh][1] = fmaf(pt, x.y, acc[hh][1]);
        }
      }
    }
    __syncthreads();  // this buffer is read: the next round may copy into it
  }

  // The block's states per (r, g), merged over r: m_b = max, l_b = sum l e^(m - m_b),
  // o_b = sum o e^(m - m_b) (unnormalized). S = 1: out = o_b / l_b.
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    if (g[hh] >= G) continue;
    float* mine = merge + (r * G + g[hh]) * (d + 2);
#pragma unroll
    for (int e = 0; e < DPL; ++e) mine[DPL * lane + e] = acc[hh][e];
    if (lane == 0) {
      mine[d] = mx[hh];
      mine[d + 1] = den[hh];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
    const int gi = i / d, c = i % d;
    float m_b = -INFINITY;
    for (int rr = 0; rr < R; ++rr) m_b = fmaxf(m_b, merge[(rr * G + gi) * (d + 2) + d]);
    float l_b = 0.0f, o_b = 0.0f;
    for (int rr = 0; rr < R; ++rr) {
      const float* st = merge + (rr * G + gi) * (d + 2);
      const float f = st[d] == -INFINITY ? 0.0f : expf(st[d] - m_b);  // a state that saw no key
      l_b += st[d + 1] * f;
      o_b += st[c] * f;
    }
    const int64_t h = static_cast<int64_t>(kvh) * G + gi;
    if (S == 1) {
      out[h * d + c] = o_b / l_b;
    } else {
      float* row = part + (h * S + s) * ds;  // partial rows [hq][S][d + 4]: o, max, denominator
      row[c] = o_b;
      if (c == 0) {
        row[d] = m_b;
        row[d + 1] = l_b;
      }
    }
  }
  if (S == 1) return;
  // The last block of this kv head merges the S partials of its G heads: a warp per head
  // finds the largest max, each split's factor e^(m_t - m) and the denominator (into shared
  // memory), then every thread sums its outputs' column over the splits, one load a split
  // (the block's loads are then coalesced rows, all in flight together).
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
  float* fs = stage;         // [G][S] factors (the staging rows are no longer read)
  float* ls = fs + G * S;    // [G] denominators
  const float* heads = part + static_cast<int64_t>(kvh) * G * S * ds;
  for (int gi = warp; gi < G; gi += W) {
    const float* hr = heads + static_cast<int64_t>(gi) * S * ds;
    float m = -INFINITY;
    for (int t = lane; t < S; t += 32) m = fmaxf(m, __ldcg(hr + t * ds + d));
    m = warp_max(m);
    float l = 0.0f;
    for (int t = lane; t < S; t += 32) {
      const float m_t = __ldcg(hr + t * ds + d);
      const float f = m_t == -INFINITY ? 0.0f : expf(m_t - m);  // a split that saw no key
      fs[gi * S + t] = f;
      l += __ldcg(hr + t * ds + d + 1) * f;
    }
    l = warp_sum(l);
    if (lane == 0) ls[gi] = l;
  }
  __syncthreads();
  // An output a thread, a load a split (a 16-byte load of four outputs measured slower on the
  // H200: 38.4 against 33.5 us a layer at 8192 positions).
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
    const int gi = i / d, c = i % d;
    const float* hr = heads + static_cast<int64_t>(gi) * S * ds + c;
    const float* f = fs + gi * S;
    float o = 0.0f;
#pragma unroll 16
    for (int t = 0; t < S; ++t) o = fmaf(__ldcg(hr + t * ds), f[t], o);
    out[(static_cast<int64_t>(kvh) * G + gi) * d + c] = o / ls[gi];
  }
}

// The GQA kernel's launch shape for (hq, hkv, d, n_ctx): chunks a round R, warps W, heads a
// warp HPW, splits S, dynamic shared bytes.
struct GqaShape {
  int R = 1, W = 8, HPW = 1, S = 1;
  size_t smem = 0;
};

constexpr size_t kGqaMaxSmem = 160 * 1024;  // the dynamic shared memory launch_gqa opts in to

GqaShape gqa_shape(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx) {
  GqaShape g;
  const int64_t G = hq / hkv, ds = d + 4;
  if (G < 8) {
    // As many chunks a round as fill 8 warps, while the two buffers of staged rows stay
    // within 96 KiB.
    const int64_t r_fit = (96 * 1024) / (2 * 32 * ds * 2 * static_cast<int64_t>(sizeof(float)));
    g.R = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(8 / G, r_fit)));
    g.W = static_cast<int>(G) * g.R;
  } else {
    // A head a warp up to 8 (two heads a warp in 4 warps measured slower on the H200: 40.9
    // against 33.5 us at 8192 positions, fewer warps hiding the copies' latency).
    g.HPW = G <= 8 ? 1 : G <= 16 ? 2 : 4;
  }
  // Splits: about two blocks an SM of a 132-SM GPU at full capacity (more make the last
  // block's merge longer than they save), each at least one round of chunks.
  const int64_t rounds = (n_ctx + 32 * g.R - 1) / (32 * g.R);
  const int64_t s_max = std::min<int64_t>(kMaxGqaSplits, std::max<int64_t>(8, 264 / hkv));
  g.S = static_cast<int>(std::max<int64_t>(1, std::min(rounds, s_max)));
  g.smem = static_cast<size_t>(G * d + 4 * 32 * g.R * ds + g.R * G * (d + 2)) * sizeof(float);
  return g;
}

template <int DPL, int HPW, bool kPerRow>
void launch_gqa_rows(const AttentionDecodeArgs& a, const GqaShape& g, cudaStream_t st) {
  static const bool smem_set = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_decode_gqa_kernel<DPL, HPW, kPerRow>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kGqaMaxSmem));
    return true;
  }();
  (void)smem_set;
  const RowCachePtrs none{};
  launch_chained(attention_decode_gqa_kernel<DPL, HPW, kPerRow>,
                 dim3(static_cast<unsigned>(a.hkv), static_cast<unsigned>(g.S), static_cast<unsigned>(a.n_rows)),
                 dim3(32 * g.W), g.smem, st, a.q, a.k, a.v, a.out, a.partials, a.counters, static_cast<int>(a.hq),
                 static_cast<int>(a.hkv), g.R, a.n_past, a.n_past_dev, a.scale, a.window,
                 kPerRow ? *a.rows : none);
}

template <int DPL, int HPW>
void launch_gqa(const AttentionDecodeArgs& a, const GqaShape& g, cudaStream_t st) {
  if (a.rows) launch_gqa_rows<DPL, HPW, true>(a, g, st);
  else launch_gqa_rows<DPL, HPW, false>(a, g, st);
}

template <int DPL>
void launch_gqa_d(const AttentionDecodeArgs& a, const GqaShape& g, cudaStream_t st) {
  switch (g.HPW) {
    case 1: launch_gqa<DPL, 1>(a, g, st); break;
    case 2: launch_gqa<DPL, 2>(a, g, st); break;
    default: launch_gqa<DPL, 4>(a, g, st); break;
  }
}

// Whether the GQA kernel serves these heads (SLUICE_CUDA_GQA_DECODE=0: never, to compare):
// 2 to 32 query heads a kv head whose staging fits kGqaMaxSmem (16 heads of 256 do not).
bool gqa_applies(int64_t hq, int64_t hkv, int64_t d) {
  static const bool off = [] {
    const char* e = std::getenv("SLUICE_CUDA_GQA_DECODE");
    return e && std::strcmp(e, "0") == 0;
  }();
  return !off && hkv > 0 && hq / hkv >= 2 && hq / hkv <= 32 && gqa_shape(hq, hkv, d, 1).smem <= kGqaMaxSmem;
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

int attention_decode_splits(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx) {
  if (gqa_applies(hq, hkv, d)) return gqa_shape(hq, hkv, d, n_ctx).S;
  const int64_t s = (n_ctx + 32 * kWarps - 1) / (32 * kWarps);
  return static_cast<int>(s < 1 ? 1 : s > kMaxSplits ? kMaxSplits : s);
}

int64_t attention_decode_partial_floats(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx) {
  return hq * attention_decode_splits(hq, hkv, d, n_ctx) * (d + 4);  // rows of d + 2 or (GQA) d + 4
}

bool attention_decode_rows_supported(int64_t hq, int64_t hkv, int64_t d, int64_t n_rows) {
  return gqa_applies(hq, hkv, d) && hq % hkv == 0 && n_rows >= 1 && n_rows <= kMaxCacheRows &&
         n_rows * hkv <= kAttentionDecodeMaxHeads && (d == 64 || d == 128 || d == 256);
}

void launch_attention_decode(const AttentionDecodeArgs& a, Stream s) {
  SLUICE_CHECK(a.rows ? attention_decode_rows_supported(a.hq, a.hkv, a.d, a.n_rows) && a.n_past_dev
                      : a.n_rows == 1 && attention_decode_supported(a.hq, a.hkv, a.d, a.q, a.k, a.v),
               Status::internal, "cuda attention_decode: unsupported shape (hq ", a.hq, ", hkv ", a.hkv, ", d ", a.d,
               ", rows ", a.n_rows, ")");
  auto st = static_cast<cudaStream_t>(s);
  if (a.rows || gqa_applies(a.hq, a.hkv, a.d)) {
    const GqaShape g = gqa_shape(a.hq, a.hkv, a.d, a.n_ctx);
    switch (a.d) {
      case 64: launch_gqa_d<2>(a, g, st); break;
      case 128: launch_gqa_d<4>(a, g, st); break;
      default: launch_gqa_d<8>(a, g, st); break;
    }
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int S = attention_decode_splits(a.hq, a.hkv, a.d, a.n_ctx);
  switch (a.d) {
    case 64: launch_d<2>(a, S, st); break;
    case 128: launch_d<4>(a, S, st); break;
    default: launch_d<8>(a, S, st); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
