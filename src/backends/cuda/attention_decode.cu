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
// (output, max, denominator) rows, and attention_decode_merge_kernel, launched after (chained),
// merges the S partials into out. S is a function of the context capacity, not of the
// position, so a captured graph replays at any position with the same launches.
//
// Both kernels read caches of KV elements: f32, or bf16 (Backend::kv_dtype) converted to f32
// as they are read (half the bytes and, in the GQA kernel, half the shared memory a stage);
// all arithmetic is f32, in the same order for either.
//
// Grouped-query heads (G = hq / hkv >= 2) take attention_decode_gqa_kernel instead: there the
// kernel above re-reads each kv head's rows G times (from L2), which at long context is what
// bounds it (8192 positions, G = 8: 268 MB of L2 reads a layer, 61.6 us on the H200, 0.54 TB/s
// of the cache's own bytes). The GQA kernel reads each row once from memory:
//
//   grid (hkv, S), block W warps; stage i of block (kv head, s) is C chunks of 32 keys,
//   chunks [(i S + s) C, +C): their K and V rows are copied (cp.async) into one of NST
//   padded shared buffers, NST - 1 stages ahead of the one being scored (positions past the
//   query zero-filled), so that a block keeps NST - 1 stages of loads in flight. Warp w
//   scores chunk w mod C of every stage for HPW query heads of the kv head: lane t scores
//   key t, reading each 16 bytes of its key row once for all HPW heads; the warp's online
//   softmax is updated once a head, and lane t accumulates dims [DPL t, DPL (t + 1)) of each
//   head's output, each values row read once for the HPW heads. The block's warps then merge
//   per head in shared memory and write the partial rows of the kv head's G heads, merged as
//   above. (The kernel before this one staged one round ahead in two buffers with a warp a
//   head: 34.1 us a layer at 8192 positions, G = 8, 0.98 TB/s; its shared-memory reads, each
//   key row once a head, and one stage in flight bounded it.)
#include "backends/cuda/attention_decode.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/common.cuh"
#include "core/switches.h"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxSplits = 64;  // of either kernel: the merge kernel holds a head's S loads in registers
constexpr int kBatch = 16;  // key or value rows (16-byte loads) a lane has in flight at once

// dynamic shared memory (floats): qs[d], ps[kWarps][32], then per warp (d + 2): acc[d], max,
// denominator.
template <int DPL, typename KV>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                            float* __restrict__ out, float* __restrict__ part, int64_t hq, int64_t hkv,
                            int64_t n_past_arg, const int32_t* __restrict__ n_past_dev, float scale_arg,
                            const AttentionSpan span, const float* __restrict__ sinks) {
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
  const int64_t lo = attention_lo(pos, span);
  const float scale = attention_scale_at(scale_arg, pos, span);
  for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = q[h * d + i];
  __syncthreads();

  float acc[DPL];
#pragma unroll
  for (int e = 0; e < DPL; ++e) acc[e] = 0.0f;
  float mx = -INFINITY, den = 0.0f;
  const int64_t stride = hkv * d;  // elements between consecutive positions
  const int64_t n_chunks = (pos - lo + 1 + 31) / 32;
  float* pw = ps + warp * 32;
  for (int64_t c = static_cast<int64_t>(s) * kWarps + warp; c < n_chunks; c += static_cast<int64_t>(S) * kWarps) {
    const int64_t j0 = lo + 32 * c, j = j0 + lane;
    float sc = 0.0f;
    if (j <= pos) {
      const KV* kr = k + j * stride + kvh * d;
      const float4* q4 = reinterpret_cast<const float4*>(qs);
#pragma unroll
      for (int b = 0; b < d / 4; b += kBatch) {
        float x[kBatch][4];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) kv_load<4, true>(kr + 4 * (b + u), x[u]);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float4 y = q4[b + u];
          sc = fmaf(x[u][0], y.x, fmaf(x[u][1], y.y, fmaf(x[u][2], y.z, fmaf(x[u][3], y.w, sc))));
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
    const KV* vr = v + j0 * stride + kvh * d + DPL * lane;
    // Values rows kBatch at a time, loaded before any is used.
    for (int t0 = 0; t0 < n_keys; t0 += kBatch) {
      float vv[kBatch][DPL];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int t = t0 + u < n_keys ? t0 + u : n_keys - 1;  // past the end: a row loaded, unused
        kv_load<DPL, true>(vr + t * stride, vv[u]);
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
  float* row = part + (h * S + s) * (d + 4);  // partial rows [hq][S][d + 4]: o, max, denominator
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
      out[h * d + c] = softmax_finish(o_b, l_b, m_b, sinks, h);
    } else {
      row[c] = o_b;
      if (c == 0) {
        row[d] = m_b;
        row[d + 1] = l_b;
      }
    }
  }
}

// Waits until at most n (0..3) of this thread's committed cp.async groups are in flight.
__device__ __forceinline__ void cp_async_wait_at_most(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// dynamic shared memory: qs[G][d] and ps[W][HPW][32] floats (each warp's probabilities of
// its chunk's keys); then NST stage buffers of KV elements (the cache's: f32 or bf16), each
// ks[32 C][ds] then vs[32 C][ds], ds = d + 16 / sizeof(KV) (rows padded by 16 bytes: lane t
// reads row t in 16-byte loads, so unpadded rows would put every lane in one bank). After the
// loop the stage buffers hold the warp states [C][G][d + 2] floats (acc[d], max, denominator).
//
// A batch decode step (kPerRow): blockIdx.z is the batch row b, a sequence of its own with
// caches row_caches.k[b] / .v[b] at position n_past_dev[b]; q, out and the partials are
// row b's.
template <int DPL, int HPW, bool kPerRow, typename KV>
__global__ void __launch_bounds__(256)
    attention_decode_gqa_kernel(const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                                float* __restrict__ out, float* __restrict__ part, int hq, int hkv, int C, int NST, int64_t n_past_arg,
                                const int32_t* __restrict__ n_past_dev, float scale_arg, const AttentionSpan span,
                                const RowCachePtrs row_caches, const float* __restrict__ sinks) {
  chained_kernel_entry();
  constexpr int d = 32 * DPL;
  constexpr int EPC = 16 / sizeof(KV);  // elements a 16-byte copy
  constexpr int ds = d + EPC;           // a staged row's elements
  constexpr int dp = d + 4;             // a partial row's floats
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int G = hq / hkv, rows = 32 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = blockDim.x / 32;
  float* qs = smem;
  float* ps = qs + G * d;                                     // [W][HPW][32]
  KV* stage = reinterpret_cast<KV*>(ps + W * HPW * 32);       // [NST][2][rows][ds]: buffer, K or V
  const int kvh = blockIdx.x, S = gridDim.y, s = blockIdx.y;
  if constexpr (kPerRow) {
    const int b = blockIdx.z;
    k = static_cast<const KV*>(row_caches.k[b]);
    v = static_cast<const KV*>(row_caches.v[b]);
    q += static_cast<int64_t>(b) * hq * d;
    out += static_cast<int64_t>(b) * hq * d;
    part += static_cast<int64_t>(b) * hq * S * dp;
    n_past_dev += b;
  }
  const int64_t pos = n_past_dev ? *n_past_dev : n_past_arg;
  const int64_t lo = attention_lo(pos, span);
  const float scale = attention_scale_at(scale_arg, pos, span);
  const int64_t n_chunks = (pos - lo + 1 + 31) / 32;
  const int64_t n_stages = (n_chunks + C - 1) / C;  // stages of C chunks over the context
  // This block's stages: s, s + S, s + 2 S, ...
  const int64_t mine = s < n_stages ? (n_stages - s + S - 1) / S : 0;
  const int64_t stride = static_cast<int64_t>(hkv) * d;  // elements between consecutive positions
  // The kv head's G query rows, copied with stage 0 (group 0), so that no load of this block
  // waits for another before the first stages are in flight.
  for (int i = threadIdx.x; i < G * d / 4; i += blockDim.x)
    cp_async16(qs + 4 * i, q + static_cast<int64_t>(kvh) * G * d + 4 * i, true);

  // Copies the K and V rows of this block's stage i (if any) into buffer i mod NST, and
  // commits a group either way, so that group i is always stage i.
  auto stage_load = [&](int64_t i) {
    if (i < mine) {
      KV* ks = stage + (i % NST) * 2 * rows * ds;
      KV* vs = ks + rows * ds;
      const int64_t j_base = lo + 32 * C * (i * S + s);
      for (int idx = threadIdx.x; idx < rows * (d / EPC); idx += blockDim.x) {
        const int row = idx / (d / EPC), col = EPC * (idx % (d / EPC));
        const int64_t j = j_base + row;
        const bool valid = j <= pos;
        const int64_t off = (valid ? j * stride : 0) + static_cast<int64_t>(kvh) * d + col;
        cp_async16(ks + row * ds + col, k + off, valid);
        cp_async16(vs + row * ds + col, v + off, valid);
      }
    }
    cp_async_commit();
  };
  // The first NST - 1 stages in flight.
  int issued = 0;
  for (; issued < NST - 1; ++issued) stage_load(issued);

  // This warp's work: chunk r of each stage, heads g0 .. g0 + HPW - 1 (those < G).
  const int r = warp % C, g0 = (warp / C) * HPW;
  float acc[HPW][DPL], mx[HPW], den[HPW];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    mx[hh] = -INFINITY;
    den[hh] = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[hh][e] = 0.0f;
  }
  float* pw = ps + warp * HPW * 32;

  for (int64_t i = 0; i < mine; ++i) {
    cp_async_wait_at_most(NST - 2);  // stage i (group i) has landed for this thread
    __syncthreads();                 // ... and for every thread; buffer (i - 1) mod NST is read
    stage_load(i + NST - 1);         // into that buffer
    const KV* ks = stage + (i % NST) * 2 * rows * ds;
    const KV* vs = ks + rows * ds;
    const int64_t j = lo + 32 * ((i * S + s) * C + r) + lane;  // this lane's key
    // Scores of key j for the warp's heads: each 8 elements of the key row read once (one or
    // two 16-byte loads), for all of them; four products summed apart from the running sum
    // (independent chains).
    const KV* kr = ks + (32 * r + lane) * ds;
    float sc[HPW];
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) sc[hh] = 0.0f;
#pragma unroll 4
    for (int b = 0; b < d / 8; ++b) {
      float x[8];
      kv_load<8, false>(kr + 8 * b, x);
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) {
        const int g = g0 + hh < G ? g0 + hh : G - 1;  // past G: a head computed, unused
        const float4 y0 = reinterpret_cast<const float4*>(qs + g * d)[2 * b];
        const float4 y1 = reinterpret_cast<const float4*>(qs + g * d)[2 * b + 1];
        sc[hh] += fmaf(x[0], y0.x, fmaf(x[1], y0.y, fmaf(x[2], y0.z, x[3] * y0.w)));
        sc[hh] += fmaf(x[4], y1.x, fmaf(x[5], y1.y, fmaf(x[6], y1.z, x[7] * y1.w)));
      }
    }
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      float p = 0.0f;
      if (g0 + hh < G) {  // warp-uniform
        const float sg = j <= pos ? sc[hh] * scale : -INFINITY;
        const float m_new = fmaxf(mx[hh], warp_max(sg));
        if (m_new != -INFINITY) {  // else a chunk wholly past the query, before any key
          const float corr = expf(mx[hh] - m_new);  // 0 on the first chunk (mx = -inf)
          p = j <= pos ? expf(sg - m_new) : 0.0f;
          den[hh] = den[hh] * corr + warp_sum(p);
          mx[hh] = m_new;
#pragma unroll
          for (int e = 0; e < DPL; ++e) acc[hh][e] *= corr;
        }
      }
      pw[hh * 32 + lane] = p;
    }
    __syncwarp();
    // Values: lane t accumulates dims [DPL t, DPL (t + 1)) of each head; each values row read
    // once for all the heads, the probabilities four keys at a time (broadcast reads).
    const KV* vcol = vs + 32 * r * ds + DPL * lane;
#pragma unroll 2
    for (int t0 = 0; t0 < 32; t0 += 4) {
      float4 p4[HPW];
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) p4[hh] = *reinterpret_cast<const float4*>(pw + hh * 32 + t0);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float x[DPL];
        kv_load<DPL, false>(vcol + (t0 + u) * ds, x);
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) {
          const float pt = u == 0 ? p4[hh].x : u == 1 ? p4[hh].y : u == 2 ? p4[hh].z : p4[hh].w;
#pragma unroll
          for (int e = 0; e < DPL; ++e) acc[hh][e] = fmaf(pt, x[e], acc[hh][e]);
        }
      }
    }
    __syncwarp();  // pw is rewritten by the next stage
  }
  cp_async_wait<0>();  // the trailing empty groups
  __syncthreads();     // every warp is done with the stage buffers: they hold the states now

  // The block's states per (r, g), merged over r: m_b = max, l_b = sum l e^(m - m_b),
  // o_b = sum o e^(m - m_b) (unnormalized). S = 1: out = o_b / l_b.
  float* merge = reinterpret_cast<float*>(stage);
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    if (g0 + hh >= G) continue;
    float* st = merge + (r * G + g0 + hh) * (d + 2);
#pragma unroll
    for (int e = 0; e < DPL; ++e) st[DPL * lane + e] = acc[hh][e];
    if (lane == 0) {
      st[d] = mx[hh];
      st[d + 1] = den[hh];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
    const int gi = i / d, c = i % d;
    float m_b = -INFINITY;
    for (int rr = 0; rr < C; ++rr) m_b = fmaxf(m_b, merge[(rr * G + gi) * (d + 2) + d]);
    float l_b = 0.0f, o_b = 0.0f;
    for (int rr = 0; rr < C; ++rr) {
      const float* st = merge + (rr * G + gi) * (d + 2);
      const float f = st[d] == -INFINITY ? 0.0f : expf(st[d] - m_b);  // a state that saw no key
      l_b += st[d + 1] * f;
      o_b += st[c] * f;
    }
    const int64_t h = static_cast<int64_t>(kvh) * G + gi;
    if (S == 1) {
      out[h * d + c] = softmax_finish(o_b, l_b, m_b, sinks, h);
    } else {
      float* row = part + (h * S + s) * dp;  // partial rows [hq][S][d + 4]: o, max, denominator
      row[c] = o_b;
      if (c == 0) {
        row[d] = m_b;
        row[d + 1] = l_b;
      }
    }
  }
}

// The merge of a launch's S > 1 partial rows a head, a kernel of its own: the S partials of the
// G heads of a kv head are G S (d + 4) floats (256 KB at S = 64, G = 8), which the last block
// of the kv head to finish, the merge before this one, read at one block's memory
// parallelism: 18-20 us of a 36 us launch at 8192 positions. Here a block per (head, row),
// thread c sums output column c over the splits with all S loads in flight at once (one L2
// round trip), while warp 0 finds the largest max, each split's factor e^(m_t - m) and the
// denominator.
//
// grid (hq, rows), block d threads; part [rows][hq][S][d + 4] (o, max, denominator), out
// [rows][hq][d].
template <int D>
__global__ void __launch_bounds__(256)
    attention_decode_merge_kernel(const float* __restrict__ part, float* __restrict__ out, int hq, int S,
                                  const float* __restrict__ sinks) {
  chained_kernel_entry();
  constexpr int ds = D + 4;
  __shared__ float fs[kMaxSplits];  // factors e^(m_t - m)
  __shared__ float den, mref;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * hq + blockIdx.x;
  const float* hr = part + h * S * ds;
  const int c = threadIdx.x;
  float o_t[kMaxSplits];  // column c of every split, loaded before any is used
#pragma unroll
  for (int t = 0; t < kMaxSplits; ++t) o_t[t] = t < S ? __ldcg(hr + t * ds + c) : 0.0f;
  if (c < 32) {
    float m_t[kMaxSplits / 32], l_t[kMaxSplits / 32];
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) {
      const int t = c + 32 * u;
      m_t[u] = t < S ? __ldcg(hr + t * ds + D) : -INFINITY;
      l_t[u] = t < S ? __ldcg(hr + t * ds + D + 1) : 0.0f;
    }
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) m = fmaxf(m, m_t[u]);
    m = warp_max(m);
    float l = 0.0f;
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) {
      const float f = m_t[u] == -INFINITY ? 0.0f : expf(m_t[u] - m);  // a split that saw no key
      if (c + 32 * u < S) fs[c + 32 * u] = f;
      l += l_t[u] * f;
    }
    l = warp_sum(l);
    if (c == 0) {
      den = l;
      mref = m;
    }
  }
  __syncthreads();
  float o = 0.0f;
#pragma unroll
  for (int t = 0; t < kMaxSplits; ++t)
    if (t < S) o = fmaf(o_t[t], fs[t], o);
  out[h * D + c] = softmax_finish(o, den, mref, sinks, blockIdx.x);
}

// The merge of S > 1 partial rows a head, after either kernel.
template <int D>
void launch_merge(const AttentionDecodeParams& a, int S, cudaStream_t st) {
  launch_chained(attention_decode_merge_kernel<D>, dim3(static_cast<unsigned>(a.hq), static_cast<unsigned>(a.n_rows)),
                 dim3(D), 0, st, static_cast<const float*>(a.partials), a.out, static_cast<int>(a.hq), S, a.sinks);
}

// The GQA kernel's launch shape for (hq, hkv, d, n_ctx): heads a warp HPW, chunks a stage C,
// warps W = C x (head groups), stage buffers NST, splits S, dynamic shared bytes.
struct GqaShape {
  int HPW = 1, C = 1, W = 4, NST = 2, S = 1;
  size_t smem = 0;
};

// Each block within 112 KiB of shared memory, so that two fit an SM of the H200 (228 KiB):
// two blocks of 4 warps, each with NST - 1 stages of loads in flight while one is scored.
constexpr size_t kGqaSmemBudget = 112 * 1024;
constexpr size_t kGqaMaxSmem = 200 * 1024;  // the dynamic shared memory launch_gqa opts in to

// SLUICE_CUDA_GQA_SHAPE=HPW,C,NST,S overrides the shape (0: the default), for benchmarks.
std::array<int, 4> gqa_shape_override() {
  const std::vector<int64_t>& v = switches::integers(Switch::cuda_gqa_shape);
  return {static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3])};
}

// kv_bytes: a cache element's (4: f32, 2: bf16); the stage buffers hold such elements, rows of
// d + 16 / kv_bytes.
GqaShape gqa_shape(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx, int64_t kv_bytes) {
  GqaShape g;
  const auto o = gqa_shape_override();
  const int64_t G = hq / hkv, ds = d + 16 / kv_bytes;
  // Heads a warp: each key and values row read from shared memory once for them (fewer
  // shared-memory reads a key), as many warps as hide the copies.
  g.HPW = o[0] == 1 || o[0] == 2 || o[0] == 4 ? o[0] : G >= 16 ? 4 : G >= 8 ? 2 : 1;
  const int64_t groups = (G + g.HPW - 1) / g.HPW;
  g.C = o[1] > 0 ? o[1] : static_cast<int>(std::max<int64_t>(1, 4 / groups));
  // bf16 rows: stages of twice the chunks in the shared bytes of an f32 stage, so twice the
  // warps score them (up to 8). Measured on the H200 (bench_cuda --attention-decode), 128
  // dims at 8192 positions: 32 / 4 heads 20.3 -> 17.5 us, 64 / 4 31.3 -> 25.5, 32 / 8 26.0 ->
  // 20.0; with f32 rows the larger stage costs a block an SM (22.8 -> 25.5 us).
  if (o[1] <= 0 && kv_bytes == 2 && 2 * g.C * groups <= 8) g.C *= 2;
  g.W = static_cast<int>(g.C * groups);
  const int64_t fixed = (G * d + static_cast<int64_t>(g.W) * g.HPW * 32) * 4;  // bytes: qs, ps
  const int64_t stage = 2 * 32 * g.C * ds * kv_bytes;                          // bytes: K and V
  const int64_t fit = (static_cast<int64_t>(kGqaSmemBudget) - fixed) / stage;
  g.NST = o[2] >= 2 && o[2] <= 5 ? o[2] : static_cast<int>(std::clamp<int64_t>(fit, 2, 4));
  // Splits: about two blocks an SM at full capacity (more make the merge's partial rows
  // longer than they save), each at least one stage.
  const int64_t stages = (n_ctx + 32 * g.C - 1) / (32 * g.C);
  const int64_t s_max = std::min<int64_t>(kMaxSplits, o[3] > 0 ? o[3] : std::max<int64_t>(8, (2 * device_sm_count() + hkv - 1) / hkv));
  g.S = static_cast<int>(std::max<int64_t>(1, std::min(stages, s_max)));
  // The states [C][G][d + 2] floats reuse the stage buffers.
  const int64_t stages_bytes = std::max<int64_t>(g.NST * stage, g.C * G * (d + 2) * 4);
  g.smem = static_cast<size_t>(fixed + stages_bytes);
  return g;
}

template <int DPL, int HPW, bool kPerRow, typename KV>
void launch_gqa_rows(const AttentionDecodeParams& a, const GqaShape& g, cudaStream_t st) {
  static const bool smem_set = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_decode_gqa_kernel<DPL, HPW, kPerRow, KV>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kGqaMaxSmem));
    return true;
  }();
  (void)smem_set;
  const RowCachePtrs none{};
  launch_chained(attention_decode_gqa_kernel<DPL, HPW, kPerRow, KV>,
                 dim3(static_cast<unsigned>(a.hkv), static_cast<unsigned>(g.S), static_cast<unsigned>(a.n_rows)),
                 dim3(32 * g.W), g.smem, st, a.q, static_cast<const KV*>(a.k), static_cast<const KV*>(a.v), a.out,
                 a.partials, static_cast<int>(a.hq), static_cast<int>(a.hkv), g.C, g.NST, a.n_past, a.n_past_dev,
                 a.scale, a.span(), kPerRow ? *a.rows : none, a.sinks);
}

template <int DPL, int HPW, typename KV>
void launch_gqa(const AttentionDecodeParams& a, const GqaShape& g, cudaStream_t st) {
  if (a.rows) launch_gqa_rows<DPL, HPW, true, KV>(a, g, st);
  else launch_gqa_rows<DPL, HPW, false, KV>(a, g, st);
  if (g.S > 1) launch_merge<32 * DPL>(a, g.S, st);
}

template <int DPL, typename KV>
void launch_gqa_d(const AttentionDecodeParams& a, const GqaShape& g, cudaStream_t st) {
  switch (g.HPW) {
    case 1: launch_gqa<DPL, 1, KV>(a, g, st); break;
    case 2: launch_gqa<DPL, 2, KV>(a, g, st); break;
    default: launch_gqa<DPL, 4, KV>(a, g, st); break;
  }
}

// Whether the GQA kernel serves these heads: 2 to 32 query heads a kv head in at most 8 warps,
// whose buffers fit kGqaMaxSmem (with f32 caches, so that the choice, and the splits, do not
// depend on the cache's dtype).
bool gqa_applies(int64_t hq, int64_t hkv, int64_t d) {
  if (hkv <= 0 || hq / hkv < 2 || hq / hkv > 32) return false;
  const GqaShape g = gqa_shape(hq, hkv, d, 1 << 20, sizeof(float));
  return g.W <= 8 && g.smem <= kGqaMaxSmem;
}

template <int DPL, typename KV>
void launch_d(const AttentionDecodeParams& a, int S, cudaStream_t st) {
  constexpr int d = 32 * DPL;
  const size_t smem = (static_cast<size_t>(d) + kWarps * 32 + kWarps * (d + 2)) * sizeof(float);
  launch_chained(attention_decode_kernel<DPL, KV>, dim3(static_cast<unsigned>(a.hq), static_cast<unsigned>(S)),
                 dim3(kWarps * 32), smem, st, a.q, static_cast<const KV*>(a.k), static_cast<const KV*>(a.v), a.out,
                 a.partials, a.hq, a.hkv, a.n_past, a.n_past_dev, a.scale, a.span(), a.sinks);
  if (S > 1) launch_merge<d>(a, S, st);
}

// Whether the launch takes the tensor-core kernel.
bool takes_mma(const AttentionDecodeParams& a) {
  return gqa_applies(a.hq, a.hkv, a.d) && attention_decode_mma_applies(a.hq, a.hkv, a.d, a.kv_bf16);
}

// Either kernel for the cache's element type.
template <typename KV>
void launch_kv(const AttentionDecodeParams& a, cudaStream_t st) {
  if (takes_mma(a)) {
    const int S = attention_decode_mma_splits(a.hkv, a.n_ctx, kMaxSplits);
    SLUICE_CHECK(S <= attention_decode_splits(a.hq, a.hkv, a.d, a.n_ctx), Status::internal,
                 "cuda attention_decode: ", S, " tensor-core splits past the scratch's");
    launch_attention_decode_mma(a, S, st);
    if (S > 1) {
      if (a.d == 64) launch_merge<64>(a, S, st);
      else launch_merge<128>(a, S, st);
    }
    return;
  }
  if (a.rows || gqa_applies(a.hq, a.hkv, a.d)) {
    const GqaShape g = gqa_shape(a.hq, a.hkv, a.d, a.n_ctx, sizeof(KV));
    SLUICE_CHECK(g.W <= 8 && g.smem <= kGqaMaxSmem &&
                     g.S <= attention_decode_splits(a.hq, a.hkv, a.d, a.n_ctx),
                 Status::internal, "cuda attention_decode: GQA shape of ", g.W, " warps, ", g.smem, " bytes, ", g.S,
                 " splits");
    switch (a.d) {
      case 64: launch_gqa_d<2, KV>(a, g, st); break;
      case 128: launch_gqa_d<4, KV>(a, g, st); break;
      default: launch_gqa_d<8, KV>(a, g, st); break;
    }
    return;
  }
  const int S = attention_decode_splits(a.hq, a.hkv, a.d, a.n_ctx);
  switch (a.d) {
    case 64: launch_d<2, KV>(a, S, st); break;
    case 128: launch_d<4, KV>(a, S, st); break;
    default: launch_d<8, KV>(a, S, st); break;
  }
}

}  // namespace

bool attention_decode_supported(int64_t hq, int64_t hkv, int64_t d, const void* q, const void* k, const void* v) {
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v)) & 15) == 0;
  return aligned && hkv > 0 && hq % hkv == 0 && hq <= kAttentionDecodeMaxHeads && (d == 64 || d == 128 || d == 256);
}

int attention_decode_splits(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx) {
  // f32's: a bf16 launch's splits are as many or fewer (its stages hold more chunks), so the
  // partial rows sized by this hold either's.
  if (gqa_applies(hq, hkv, d)) return gqa_shape(hq, hkv, d, n_ctx, sizeof(float)).S;
  const int64_t s = (n_ctx + 32 * kWarps - 1) / (32 * kWarps);
  return static_cast<int>(s < 1 ? 1 : s > kMaxSplits ? kMaxSplits : s);
}

int attention_decode_launch_splits(const AttentionDecodeParams& a) {
  if (takes_mma(a)) return attention_decode_mma_splits(a.hkv, a.n_ctx, kMaxSplits);
  if (a.rows || gqa_applies(a.hq, a.hkv, a.d))
    return gqa_shape(a.hq, a.hkv, a.d, a.n_ctx, a.kv_bf16 ? sizeof(__nv_bfloat16) : sizeof(float)).S;
  return attention_decode_splits(a.hq, a.hkv, a.d, a.n_ctx);
}

int64_t attention_decode_partial_floats(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx) {
  return hq * attention_decode_splits(hq, hkv, d, n_ctx) * (d + 4);  // rows [hq][S][d + 4] of either kernel
}

bool attention_decode_rows_supported(int64_t hq, int64_t hkv, int64_t d, int64_t n_rows) {
  return gqa_applies(hq, hkv, d) && hq % hkv == 0 && n_rows >= 1 && n_rows <= kMaxCacheRows &&
         n_rows * hkv <= kAttentionDecodeMaxHeads && (d == 64 || d == 128 || d == 256);
}

void launch_attention_decode(const AttentionDecodeParams& a, Stream s) {
  SLUICE_CHECK(a.rows ? attention_decode_rows_supported(a.hq, a.hkv, a.d, a.n_rows) && a.n_past_dev
                      : a.n_rows == 1 && attention_decode_supported(a.hq, a.hkv, a.d, a.q, a.k, a.v),
               Status::internal, "cuda attention_decode: unsupported shape (hq ", a.hq, ", hkv ", a.hkv, ", d ", a.d,
               ", rows ", a.n_rows, ")");
  auto st = static_cast<cudaStream_t>(s);
  if (a.kv_bf16) launch_kv<__nv_bfloat16>(a, st);
  else launch_kv<float>(a, st);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
