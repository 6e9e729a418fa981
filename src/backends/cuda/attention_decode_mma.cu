// Decode attention of grouped query heads on tensor cores (a bf16 KV cache, 2 to 16 query
// heads a kv head, 64 or 128 dims; one sequence, or each row of a batch step with its own
// cache): the G query heads of a kv head are the 16 rows of an mma.sync m16n8k16 tile (rows
// past G zero), so one warp scores 16 keys for all of them with 4 D / 16 mma (two tiles of 8
// keys, Q in two parts) instead of the FMA kernel's per-head loops, and accumulates P V the
// same way.
//
// Why: attention_decode_gqa_kernel (attention_decode.cu) is bound by its warps' instruction
// chains, not by the cache's bytes. ncu on an H100 after 8192 positions (32 / 4 heads, 128
// dims; docs/history/results-log.md, the measurements before this kernel): 22% of DRAM
// bandwidth, 6.8 cycles a warp between issued instructions at 16 warps an SM, 16.9 us alone
// against the 5 us its 16.8 MB take at the copy bandwidth; the FMA kernel spends ~1000
// instructions a warp on each 32 keys of 2 heads.
//
//   grid (hkv, S), block kWarps warps. Stage i of block (kv head, s) is the kStageKeys keys
//   [lo + kStageKeys (i S + s), +kStageKeys): their K and V rows are copied (cp.async, 16-byte
//   pieces, keys past the query zero-filled) into one of NST padded shared buffers, NST - 1
//   stages ahead of the one being used. Warp w takes keys 16 w .. 16 w + 15 of every stage:
//   S = Q K^T [16 heads, 16 keys] (A = Q from shared memory, B = K rows by ldmatrix), masks
//   keys past the query, updates its heads' online softmax (base 2: scale log2(e) folded into
//   Q, as attention_flash.cu does) and accumulates O += P V [16, D] (A = P from S's registers,
//   B = V rows by ldmatrix .trans). The block then merges its warps' states in shared memory
//   and writes the kv head's G partial rows [hq][S][D + 4] (o, max in natural units,
//   denominator) for attention_decode_merge_kernel, or the output itself when S = 1.
//
// Accuracy as attention_flash.cu's: Q and P split hi + lo (bf16 each), K and V exact, two mma
// a product (al.bh + ah.bh): relative error ~2^-16 a product, random in sign.
#include "backends/cuda/attention_decode.h"

#include <algorithm>

#include "backends/cuda/attention_mma.cuh"
#include "backends/cuda/common.cuh"
#include "core/switches.h"

namespace sluice::cuda {
namespace {

using namespace attention_mma;

constexpr int kWarps = 4;                  // 16 keys each a stage
constexpr int kStageKeys = 16 * kWarps;    // keys a stage
constexpr int kTileHeads = 16;             // the mma's m: query heads of a kv head (G <= 16)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// A block's dynamic shared memory within 112 KiB, so that two fit an SM (as the FMA kernel's).
constexpr size_t kSmemBudget = 112 * 1024;

// Shared memory in 32-bit words: Q hi / lo [kTileHeads][P], then NST stages of K and V
// [kStageKeys][P] each (bf16 pairs, rows padded to P = D / 2 + 4 words: conflict-free ldmatrix).
template <int D> __host__ __device__ constexpr size_t fixed_words() { return 2ull * kTileHeads * row_words<D>(); }
template <int D> __host__ __device__ constexpr size_t stage_words() { return 2ull * kStageKeys * row_words<D>(); }

// A batch decode step (kPerRow): blockIdx.z is the batch row b, a sequence of its own with
// caches row_caches.k[b] / .v[b] at position n_past_dev[b]; q, out and the partials are row b's.
template <int D, bool kPerRow>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_mma_kernel(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                const __nv_bfloat16* __restrict__ v, float* __restrict__ out,
                                float* __restrict__ part, int hq, int hkv, int NST, int64_t n_past_arg,
                                const int32_t* __restrict__ n_past_dev, float scale_arg, const AttentionSpan span,
                                const RowCachePtrs row_caches, const float* __restrict__ sinks) {
  chained_kernel_entry();
  constexpr int P = row_words<D>();
  constexpr int DT = D / 8;  // O tiles of 8 dims a warp holds
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* q_hi = smem;                         // [kTileHeads][P]
  uint32_t* q_lo = q_hi + kTileHeads * P;        // [kTileHeads][P]
  uint32_t* stages = q_lo + kTileHeads * P;      // [NST][K, V][kStageKeys][P]
  const int G = hq / hkv, kvh = blockIdx.x, S = gridDim.y, s = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mi = lane / 8, mr = lane % 8;  // ldmatrix: the matrix and the row this lane addresses
  if constexpr (kPerRow) {
    const int b = blockIdx.z;
    k = static_cast<const __nv_bfloat16*>(row_caches.k[b]);
    v = static_cast<const __nv_bfloat16*>(row_caches.v[b]);
    q += static_cast<int64_t>(b) * hq * D;
    out += static_cast<int64_t>(b) * hq * D;
    part += static_cast<int64_t>(b) * hq * S * (D + 4);
    n_past_dev += b;
  }
  const int64_t pos = n_past_dev ? *n_past_dev : n_past_arg;
  const int64_t lo = attention_lo(pos, span);
  const float scale = attention_scale_at(scale_arg, pos, span);
  const int64_t n_stages = (pos - lo + 1 + kStageKeys - 1) / kStageKeys;  // over the keys [lo, pos]
  const int64_t mine = s < n_stages ? (n_stages - s + S - 1) / S : 0;     // stages s, s + S, ...
  const int64_t stride = static_cast<int64_t>(hkv) * D;  // elements between consecutive positions

  // Copies the K and V rows of this block's stage i (if any) into buffer i mod NST, and commits
  // a group either way, so that group i is always stage i.
  auto stage_load = [&](int64_t i) {
    if (i < mine) {
      uint32_t* ks = stages + (i % NST) * stage_words<D>();
      uint32_t* vs = ks + kStageKeys * P;
      const int64_t j_base = lo + kStageKeys * (i * S + s);
      constexpr int kPieces = D / 8;  // 16-byte pieces a row
      for (int idx = threadIdx.x; idx < kStageKeys * kPieces; idx += kWarps * 32) {
        const int row = idx / kPieces, c = idx % kPieces;
        const int64_t j = j_base + row;
        const bool valid = j <= pos;
        const int64_t off = (valid ? j * stride : 0) + static_cast<int64_t>(kvh) * D + 8 * c;
        cp_async16(ks + row * P + 4 * c, k + off, valid);
        cp_async16(vs + row * P + 4 * c, v + off, valid);
      }
    }
    cp_async_commit();
  };
  for (int i = 0; i < NST - 1; ++i) stage_load(i);

  // The kv head's G query rows times scale log2(e), split hi / lo, loaded while the first
  // stages are in flight; rows G..15 zero.
  {
    const float mul = scale * kLog2e;
    const float* qk = q + static_cast<int64_t>(kvh) * G * D;
    for (int e = threadIdx.x; e < kTileHeads * D / 4; e += kWarps * 32) {
      const int r = e / (D / 4), c4 = e % (D / 4);
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < G) x = __ldcg(reinterpret_cast<const float4*>(qk + r * D) + c4);
      uint2 h, l;
      split_bf16x2(x.x * mul, x.y * mul, h.x, l.x);
      split_bf16x2(x.z * mul, x.w * mul, h.y, l.y);
      *reinterpret_cast<uint2*>(q_hi + r * P + 2 * c4) = h;
      *reinterpret_cast<uint2*>(q_lo + r * P + 2 * c4) = l;
    }
  }

  float o[DT][4];  // O [16 heads, D] unnormalized: tile dt's c0..c3
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (base-2 scores) of heads g, g + 8
  float l0 = 0.0f, l1 = 0.0f;            // running denominators, this lane's keys only

  for (int64_t i = 0; i < mine; ++i) {
    // Stage i (group i) has landed for this thread (at most NST - 2 later groups in flight) ...
    if (NST >= 4) cp_async_wait<2>();
    else if (NST == 3) cp_async_wait<1>();
    else cp_async_wait<0>();
    __syncthreads();  // ... and for every thread (and Q is staged); buffer (i - 1) mod NST is free
    stage_load(i + NST - 1);
    const uint32_t* ks = stages + (i % NST) * stage_words<D>();
    const uint32_t* vs = ks + kStageKeys * P;
    const int64_t kw = lo + kStageKeys * (i * S + s) + 16 * warp;  // this warp's first key
    if (kw > pos) continue;  // every key of the warp past the query (warp-uniform)

    // S = Q K^T [16, 16]: A = Q rows 0..15, dims 16 ks..: matrices (rows +0..7, dims +0..7),
    // (+8..15, +0..7), (+0..7, +8..15), (+8..15, +8..15) = a0..a3. B = K^T (k = dim, n = key)
    // is K row-major: x4 over the warp's keys: (keys +0..7, dims +0..7), (+0..7, +8..15),
    // (+8..15, +0..7), (+8..15, +8..15) = b0, b1 of S tile 0 (keys 0..7), b0, b1 of tile 1.
    float sc[2][4] = {};
#pragma unroll
    for (int ks16 = 0; ks16 < D / 16; ++ks16) {
      uint32_t ah[4], al[4], bh[4];
      const int qa = ((mi & 1) * 8 + mr) * P + 8 * ks16 + (mi >> 1) * 4;
      ldsm_x4<false>(ah, q_hi + qa);
      ldsm_x4<false>(al, q_lo + qa);
      ldsm_x4<false>(bh, ks + (16 * warp + (mi >> 1) * 8 + mr) * P + 8 * ks16 + (mi & 1) * 4);
      mma_split<true>(sc[0], ah, al, bh[0], bh[1], 0u, 0u);
      mma_split<true>(sc[1], ah, al, bh[2], bh[3], 0u, 0u);
    }
    // Keys past the query: -inf (they were zero-filled).
    if (kw + 15 > pos) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kw + 8 * nt + 2 * t + (e & 1) > pos) sc[nt][e] = -INFINITY;
    }
    // Online softmax of heads g (c0, c1) and g + 8 (c2, c3); a head's 16 keys are spread over
    // the 4 lanes of a quad (t), so the max and sums reduce over lanes xor 1, 2.
    float mx0 = fmaxf(m0, fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])));
    float mx1 = fmaxf(m1, fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3])));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);  // 0 while m was -inf
    m0 = mx0;
    m1 = mx1;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sc[nt][0] = exp2f(sc[nt][0] - b0);
      sc[nt][1] = exp2f(sc[nt][1] - b0);
      sc[nt][2] = exp2f(sc[nt][2] - b1);
      sc[nt][3] = exp2f(sc[nt][3] - b1);
    }
    l0 = l0 * c0 + (sc[0][0] + sc[0][1] + sc[1][0] + sc[1][1]);
    l1 = l1 * c1 + (sc[0][2] + sc[0][3] + sc[1][2] + sc[1][3]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= c0;
      o[dt][1] *= c0;
      o[dt][2] *= c1;
      o[dt][3] *= c1;
    }
    // O += P V: A = P (16 heads x the warp's 16 keys) from S tiles 0 (a0: head g, a1: head
    // g + 8) and 1 (a2, a3), split; B = V (k = key, n = dim) from row-major V with .trans: x4
    // over dims 16 dd..: (keys +0..7, dims +0..7), (+8..15, +0..7), (+0..7, +8..15), (+8..15,
    // +8..15) = b0, b1 of O tile 2 dd, b0, b1 of tile 2 dd + 1.
    uint32_t ph[4], pl[4];
    split_bf16x2(sc[0][0], sc[0][1], ph[0], pl[0]);
    split_bf16x2(sc[0][2], sc[0][3], ph[1], pl[1]);
    split_bf16x2(sc[1][0], sc[1][1], ph[2], pl[2]);
    split_bf16x2(sc[1][2], sc[1][3], ph[3], pl[3]);
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t vh[4];
      ldsm_x4<true>(vh, vs + (16 * warp + (mi & 1) * 8 + mr) * P + 8 * dd + (mi >> 1) * 4);
      mma_split<true>(o[2 * dd], ph, pl, vh[0], vh[1], 0u, 0u);
      mma_split<true>(o[2 * dd + 1], ph, pl, vh[2], vh[3], 0u, 0u);
    }
  }
  cp_async_wait<0>();  // the trailing empty groups
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  __syncthreads();  // every warp is done with the stage buffers: they hold the warps' states now

  // The warps' states [kWarps][16 heads][D + 2] floats (o, max, denominator), merged per head:
  // m_b = max, l_b = sum l 2^(m - m_b), o_b = sum o 2^(m - m_b).
  float* state = reinterpret_cast<float*>(stages);
  {
    float* r0 = state + (warp * kTileHeads + g) * (D + 2);
    float* r1 = r0 + 8 * (D + 2);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      r0[8 * dt + 2 * t] = o[dt][0];
      r0[8 * dt + 2 * t + 1] = o[dt][1];
      r1[8 * dt + 2 * t] = o[dt][2];
      r1[8 * dt + 2 * t + 1] = o[dt][3];
    }
    if (t == 0) {
      r0[D] = m0;
      r0[D + 1] = l0;
      r1[D] = m1;
      r1[D + 1] = l1;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * D; e += kWarps * 32) {
    const int r = e / D, c = e % D;
    float m_b = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_b = fmaxf(m_b, state[(w * kTileHeads + r) * (D + 2) + D]);
    float l_b = 0.0f, o_b = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* st = state + (w * kTileHeads + r) * (D + 2);
      const float f = st[D] == -INFINITY ? 0.0f : exp2f(st[D] - m_b);  // a warp that saw no key
      l_b += st[D + 1] * f;
      o_b += st[c] * f;
    }
    const float m_nat = m_b * kLn2;  // o_b, l_b are relative to 2^m_b = e^(m_b ln 2)
    const int64_t h = static_cast<int64_t>(kvh) * G + r;
    if (S == 1) {
      out[h * D + c] = softmax_finish(o_b, l_b, m_nat, sinks, h);
    } else {
      float* row = part + (h * S + s) * (D + 4);  // partial rows [hq][S][D + 4]: o, max, denominator
      row[c] = o_b;
      if (c == 0) {
        row[D] = m_nat;
        row[D + 1] = l_b;
      }
    }
  }
}

// Stage buffers: as many as fit the budget beside Q, 2 to 4.
template <int D> int stage_buffers() {
  const size_t fit = (kSmemBudget / 4 - fixed_words<D>()) / stage_words<D>();
  return static_cast<int>(std::clamp<size_t>(fit, 2, 4));
}

template <int D, bool kPerRow>
void launch_d(const AttentionDecodeParams& a, int S, cudaStream_t st) {
  const int NST = stage_buffers<D>();
  const size_t smem = 4 * (fixed_words<D>() + static_cast<size_t>(NST) * stage_words<D>());
  static const bool smem_set = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_decode_mma_kernel<D, kPerRow>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBudget)));
    return true;
  }();
  (void)smem_set;
  const RowCachePtrs none{};
  launch_chained(attention_decode_mma_kernel<D, kPerRow>,
                 dim3(static_cast<unsigned>(a.hkv), static_cast<unsigned>(S), static_cast<unsigned>(a.n_rows)),
                 dim3(kWarps * 32), smem, st, a.q, static_cast<const __nv_bfloat16*>(a.k),
                 static_cast<const __nv_bfloat16*>(a.v), a.out, a.partials, static_cast<int>(a.hq),
                 static_cast<int>(a.hkv), NST, a.n_past, a.n_past_dev, a.scale, a.span(), kPerRow ? *a.rows : none,
                 a.sinks);
}

}  // namespace

bool attention_decode_mma_applies(int64_t hq, int64_t hkv, int64_t d, bool kv_bf16) {
  if (!switches::on(Switch::cuda_attention_mma)) return false;
  return kv_bf16 && hkv > 0 && hq % hkv == 0 && hq / hkv >= 2 && hq / hkv <= kTileHeads && (d == 64 || d == 128);
}

// Caches of at most this many stages take one split (no merge launch): the kernel's blocks
// walk every stage themselves. On an H100 the merge launch costs ~5.7 us a layer and one
// block walks a stage in ~1.2 us, so one split gains at 3 stages (1.03x decode after one
// token) and loses at 10 (the attention 6.6 + 5.8 -> 18.3 us; docs/history/removed-switches.md).
constexpr int64_t kOneSplitStages = 4;

int attention_decode_mma_splits(int64_t hkv, int64_t n_ctx, int max_splits) {
  // About two blocks an SM at full capacity (as the FMA kernel's), each at least one stage.
  const int64_t stages = (n_ctx + kStageKeys - 1) / kStageKeys;
  if (stages <= kOneSplitStages) return 1;
  const int64_t s_max = std::min<int64_t>(max_splits, std::max<int64_t>(8, (2 * device_sm_count() + hkv - 1) / hkv));
  return static_cast<int>(std::max<int64_t>(1, std::min(stages, s_max)));
}

void launch_attention_decode_mma(const AttentionDecodeParams& a, int S, cudaStream_t st) {
  if (a.rows) {
    if (a.d == 64) launch_d<64, true>(a, S, st);
    else launch_d<128, true>(a, S, st);
  } else {
    if (a.d == 64) launch_d<64, false>(a, S, st);
    else launch_d<128, false>(a, S, st);
  }
}

}  // namespace sluice::cuda
