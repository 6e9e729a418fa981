// Prefill attention on tensor cores, flash-attention 2 style: causal, grouped-query, sliding
// window, for many query rows (launch_attention_at picks it from kAttentionFlashMinRows rows).
//
//   grid (ceil(n / 64), hq); block (tile of 64 query rows, head h) of 4 warps, warp w owning
//   rows 16 w .. 16 w + 15. The block's Q tile is staged once in shared memory; then for each
//   tile of BN keys in [lo(first row), last row] the block stages K and V (f32 -> bf16 while
//   staging), each warp computes its S = Q K^T [16, BN] with mma.sync m16n8k16 (bf16 in, f32
//   accumulate), masks per element where the tile crosses the diagonal or the window's edge,
//   updates its rows' online softmax (f32, base 2: scale * log2(e) is folded into Q) and
//   accumulates O += P V [16, d] with mma.sync, P taken straight from S's registers.
//
// Accuracy: plain bf16 operands (relative rounding u = 2^-8) would give scores and outputs
// with relative errors ~1e-3, a normalized squared error ~1e-6..1e-5 against the f32 CPU
// reference: over the 1e-6 bound. So every operand is split, x = hi + lo with hi = bf16(x),
// lo = bf16(x - hi) (|x - hi - lo| <= u^2 |x|), and each product takes three mma:
// hi.hi + hi.lo + lo.hi (lo.lo, <= u^2 |x||y|, is dropped). Each product then carries a
// relative error of at most ~3 u^2 = 4.6e-5, random in sign, so a score (and an output row)
// is off by ~2^-16 of its magnitude: expected nse ~1e-9 (1e-10 .. 1e-8 by shape) against the
// CPU reference, three orders under the bound. Costs three times the mma of plain bf16. A bf16
// KV cache (Backend::kv_dtype) holds K and V exactly as bf16 (lo = 0): their products take two
// mma, al.bh + ah.bh, and their lo words are neither staged nor read.
//
// Shared memory rows are bf16 pairs (one 32-bit word = two consecutive head dims), P words a
// row with P % 8 == 4, so the 8 row addresses of an ldmatrix phase fall in 8 distinct 4-bank
// groups (conflict-free), as do the staging stores (a half-warp writes 128 contiguous bytes).
// V stays row-major [key][dim] like K; ldmatrix .trans hands out its column fragments.
#include "backends/cuda/attention_mma.cuh"
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

using namespace attention_mma;

constexpr int kRows = 64;  // query rows per block
constexpr int kWarps = 4;  // 16 query rows each (the mma's m)
constexpr float kLog2e = 1.4426950408889634f;

// Keys per tile: 64, or 32 at D = 256 (registers: O alone is D / 2 floats a thread).
template <int D> __host__ __device__ constexpr int key_tile() { return D > 128 ? 32 : 64; }
// Dynamic shared memory in bytes: Q hi/lo [kRows][P], K hi/lo and V hi/lo [BN][P], 32-bit words.
template <int D> constexpr size_t smem_bytes() {
  return 4ull * row_words<D>() * (2 * kRows + 4 * key_tile<D>());
}

// Rows [n_rows, ROWS) of the tile zero; row r of src at src + r * src_stride (elements of T:
// f32, or bf16), D each, times mul, split into hi/lo words at hi/lo + r * P (lo null: src
// bf16 and mul 1, whose lo words are 0).
template <int D, int ROWS, typename T>
__device__ __forceinline__ void stage_split(const T* __restrict__ src, int64_t src_stride, int n_rows, float mul,
                                            uint32_t* __restrict__ hi, uint32_t* __restrict__ lo) {
  constexpr int P = row_words<D>(), Q4 = D / 4;  // groups of 4 elements a row
  for (int e = threadIdx.x; e < ROWS * Q4; e += kWarps * 32) {
    const int r = e / Q4, c4 = e % Q4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r < n_rows) kv_load<4, true>(src + r * src_stride + 4 * c4, x);
    uint2 h, l;
    split_bf16x2(x[0] * mul, x[1] * mul, h.x, l.x);
    split_bf16x2(x[2] * mul, x[3] * mul, h.y, l.y);
    *reinterpret_cast<uint2*>(hi + r * P + 2 * c4) = h;  // 8-byte aligned: P and 2 c4 even
    if (lo) *reinterpret_cast<uint2*>(lo + r * P + 2 * c4) = l;
  }
}

// The first key the row at pos sees (a window's bound, a chunk's start: attention_lo), which
// never decreases with pos: the tile skipping and masking below rely on that.
__device__ __forceinline__ int64_t window_lo(int64_t pos, const AttentionSpan& span) { return attention_lo(pos, span); }

template <int D, typename KV>
__global__ void __launch_bounds__(kWarps * 32, D <= 64 ? 4 : D <= 128 ? 2 : 1)
    attention_flash_kernel(const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
                           float* __restrict__ out, int64_t n, int64_t hq, int64_t hkv, int64_t n_past_arg,
                           const int32_t* __restrict__ n_past_dev, float scale, const AttentionSpan window,
                           const float* __restrict__ sinks) {
  constexpr int P = row_words<D>(), BN = key_tile<D>();
  constexpr int NT = BN / 8;  // S tiles of 8 keys a warp holds
  constexpr int DT = D / 8;   // O tiles of 8 dims a warp holds
  constexpr bool kExactKv = std::is_same_v<KV, __nv_bfloat16>;  // K and V bf16: no lo words
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* q_hi = smem;               // [kRows][P]
  uint32_t* q_lo = q_hi + kRows * P;   // [kRows][P]
  uint32_t* k_hi = q_lo + kRows * P;   // [BN][P]
  uint32_t* k_lo = k_hi + BN * P;
  uint32_t* v_hi = k_lo + BN * P;
  uint32_t* v_lo = v_hi + BN * P;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mi = lane / 8, mr = lane % 8;  // ldmatrix: the matrix and the row this lane addresses
  const int64_t n_past = n_past_dev ? *n_past_dev : n_past_arg;
  // Row tiles in reverse: the last tiles see the most keys (causal), so they start first and
  // the short ones fill the tail of the grid.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y;
  const int64_t kvh = h / (hq / hkv);
  const int rows = static_cast<int>(n - i0 < kRows ? n - i0 : kRows);  // valid rows of this tile
  const int64_t p_first = n_past + i0, p_last = p_first + rows - 1;
  const int64_t kv_stride = hkv * D;  // elements between consecutive positions of k and v

  // The Q tile, times scale * log2(e): scores come out in base 2 for exp2f.
  stage_split<D, kRows>(q + (i0 * hq + h) * D, hq * D, rows, scale * kLog2e, q_hi, q_lo);

  // This thread's rows: r0 = 16 warp + g and r0 + 8 (positions pos0, pos1). Rows past n
  // (r >= rows) are computed on zero queries and never written.
  const int rw = 16 * warp, r0 = rw + g;
  const int64_t pos0 = p_first + r0, pos1 = pos0 + 8;
  const int64_t lo0 = window_lo(pos0, window), lo1 = window_lo(pos1, window);
  const int64_t wp_first = p_first + rw, wp_last = wp_first + 15;  // the warp's positions

  float o[DT][4];  // O [16, D] unnormalized: tile dt's c0..c3
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (base-2 scores) of rows r0, r0 + 8
  float l0 = 0.0f, l1 = 0.0f;            // running denominators, this lane's columns only

  const int64_t kv_begin = window_lo(p_first, window), kv_end = p_last + 1;
  for (int64_t kt = kv_begin; kt < kv_end; kt += BN) {
    __syncthreads();  // the last tile's readers are done (first pass: nothing to wait for)
    const int n_keys = static_cast<int>(kv_end - kt < BN ? kv_end - kt : BN);
    stage_split<D, BN>(k + kt * kv_stride + kvh * D, kv_stride, n_keys, 1.0f, k_hi, kExactKv ? nullptr : k_lo);
    stage_split<D, BN>(v + kt * kv_stride + kvh * D, kv_stride, n_keys, 1.0f, v_hi, kExactKv ? nullptr : v_lo);
    __syncthreads();
    // A warp none of whose rows sees a key of this tile skips it (warp-uniform: no shuffles lost).
    if (rw >= rows || kt > wp_last || kt + BN - 1 < window_lo(wp_first, window)) continue;

    // S = Q K^T [16, BN]: B = K^T (k = head dim, n = key) is K row-major, ldmatrix without
    // .trans. x4 over keys 16 j..16 j + 15: matrices (keys +0..7, dims +0..7), (+0..7, +8..15),
    // (+8..15, +0..7), (+8..15, +8..15) = b0, b1 of S tile 2 j, b0, b1 of tile 2 j + 1.
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      // A = Q rows rw..rw + 15, dims 16 ks..: matrices (rows +0..7, dims +0..7), (+8..15,
      // +0..7), (+0..7, +8..15), (+8..15, +8..15) = a0..a3.
      uint32_t ah[4], al[4];
      const int qa = (rw + (mi & 1) * 8 + mr) * P + 8 * ks + (mi >> 1) * 4;
      ldsm_x4<false>(ah, q_hi + qa);
      ldsm_x4<false>(al, q_lo + qa);
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {
        uint32_t bh[4], bl[4] = {};  // bl unread with kExactKv
        const int ka = (16 * j + (mi >> 1) * 8 + mr) * P + 8 * ks + (mi & 1) * 4;
        ldsm_x4<false>(bh, k_hi + ka);
        if constexpr (!kExactKv) ldsm_x4<false>(bl, k_lo + ka);
        mma_split<kExactKv>(s[2 * j], ah, al, bh[0], bh[1], bl[0], bl[1]);
        mma_split<kExactKv>(s[2 * j + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
      }
    }
    // Mask per element unless every key of the tile is visible to every row of the warp:
    // key j is visible to the row at pos iff lo(pos) <= j <= pos. Keys past the last row
    // (zero-filled) are past every valid row's position.
    if (!(kt + BN - 1 <= wp_first && kt >= window_lo(wp_last, window))) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = kt + 8 * nt + 2 * t + (e & 1);
          const int64_t pos = e < 2 ? pos0 : pos1, lo = e < 2 ? lo0 : lo1;
          if (j > pos || j < lo) s[nt][e] = -INFINITY;
        }
    }
    // Online softmax of rows r0 (c0, c1) and r0 + 8 (c2, c3); a row's BN columns are spread
    // over the 4 lanes of a quad (t), so the max is reduced over lanes xor 1, 2.
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row that has seen no visible key yet (max -inf) subtracts 0: exp2(-inf) = 0, no NaN.
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);  // 0 while m was -inf
    m0 = mx0;
    m1 = mx1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - b0);
      s[nt][1] = exp2f(s[nt][1] - b0);
      s[nt][2] = exp2f(s[nt][2] - b1);
      s[nt][3] = exp2f(s[nt][3] - b1);
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + rs0;
    l1 = l1 * c1 + rs1;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= c0;
      o[dt][1] *= c0;
      o[dt][2] *= c1;
      o[dt][3] *= c1;
    }
    // O += P V: A = P keys 16 j..16 j + 15 from S tiles 2 j (a0: row g, a1: row g + 8) and
    // 2 j + 1 (a2, a3), split; B = V (k = key, n = dim) from row-major V with .trans: x4 over
    // dims 16 dd..: matrices (keys +0..7, dims +0..7), (+8..15, +0..7), (+0..7, +8..15),
    // (+8..15, +8..15) = b0, b1 of O tile 2 dd, b0, b1 of tile 2 dd + 1.
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
      uint32_t ph[4], pl[4];
      split_bf16x2(s[2 * j][0], s[2 * j][1], ph[0], pl[0]);
      split_bf16x2(s[2 * j][2], s[2 * j][3], ph[1], pl[1]);
      split_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1], ph[2], pl[2]);
      split_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t vh[4], vl[4] = {};
        const int va = (16 * j + (mi & 1) * 8 + mr) * P + 8 * dd + (mi >> 1) * 4;
        ldsm_x4<true>(vh, v_hi + va);
        if constexpr (!kExactKv) ldsm_x4<true>(vl, v_lo + va);
        mma_split<kExactKv>(o[2 * dd], ph, pl, vh[0], vh[1], vl[0], vl[1]);
        mma_split<kExactKv>(o[2 * dd + 1], ph, pl, vh[2], vh[3], vl[2], vl[3]);
      }
    }
  }

  // Denominators over the quad's lanes, then out = O / l for the valid rows. An attention
  // sink (gpt-oss; softmax_finish) adds 2^(sink log2(e) - m) to l, taken against max(m, sink):
  // o and l scale by 2^(m - max), the sink's term by 2^(sink - max).
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  float f0 = 1.0f, f1 = 1.0f;  // the factors on o (with sinks), folded into inv
  if (sinks != nullptr) {
    const float sk = sinks[h] * kLog2e, mm0 = fmaxf(m0, sk), mm1 = fmaxf(m1, sk);
    f0 = exp2f(m0 - mm0);
    f1 = exp2f(m1 - mm1);
    l0 = l0 * f0 + exp2f(sk - mm0);
    l1 = l1 * f1 + exp2f(sk - mm1);
  }
  if (r0 < rows) {
    const float inv = sinks != nullptr ? f0 / l0 : 1.0f / l0;
    float* dst = out + ((i0 + r0) * hq + h) * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(dst + 8 * dt) = make_float2(o[dt][0] * inv, o[dt][1] * inv);
  }
  if (r0 + 8 < rows) {
    const float inv = sinks != nullptr ? f1 / l1 : 1.0f / l1;
    float* dst = out + ((i0 + r0 + 8) * hq + h) * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(dst + 8 * dt) = make_float2(o[dt][2] * inv, o[dt][3] * inv);
  }
}

template <int D, typename KV>
void launch_dkv(const AttentionParams& p, cudaStream_t st) {
  constexpr size_t smem = smem_bytes<D>();
  // Over 48 KiB of dynamic shared memory needs the opt-in (per device; cheap, so every launch).
  CUDA_CHECK(cudaFuncSetAttribute(attention_flash_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>((p.n + kRows - 1) / kRows), static_cast<unsigned>(p.hq));
  attention_flash_kernel<D, KV><<<grid, kWarps * 32, smem, st>>>(p.q, static_cast<const KV*>(p.k),
                                                                 static_cast<const KV*>(p.v), p.out, p.n, p.hq, p.hkv,
                                                                 p.n_past, p.n_past_dev, p.scale, p.span(), p.sinks);
}

template <int D>
void launch_d(const AttentionParams& p, cudaStream_t st) {
  if (p.kv_bf16) launch_dkv<D, __nv_bfloat16>(p, st);
  else launch_dkv<D, float>(p, st);
}

}  // namespace

bool attention_flash_supported(const AttentionParams& p) {
  const bool aligned = ((reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.k) |
                         reinterpret_cast<uintptr_t>(p.v) | reinterpret_cast<uintptr_t>(p.out)) & 15) == 0;
  return aligned && p.hkv > 0 && p.hq % p.hkv == 0 && p.hq <= 65535 && p.window >= 0 && p.chunk >= 0 &&
         p.temperature_floor_scale == 0 &&
         (p.d == 64 || p.d == 128 || p.d == 256);
}

void launch_attention_flash(const AttentionParams& p, Stream s) {
  SLUICE_CHECK(attention_flash_supported(p), Status::internal, "cuda attention_flash: unsupported (hq ", p.hq,
               ", hkv ", p.hkv, ", d ", p.d, ", or pointers not 16-byte aligned)");
  if (p.n == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  switch (p.d) {
    case 64: launch_d<64>(p, st); break;
    case 128: launch_d<128>(p, st); break;
    default: launch_d<256>(p, st); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
