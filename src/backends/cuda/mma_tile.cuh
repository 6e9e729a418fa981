// Tensor-core tiles for prefill products (matmul_tiled.cu, the grouped experts in
// moe_kernels.cu): y[rows, cols] = x[rows, k] . w[cols, k]^T for a block tile of BM rows x
// 64 columns, k in steps of 32, with mma.sync m16n8k16 (bf16 in, f32 accumulate; sm_80+).
//
// Accuracy. The weights reach the tensor cores exactly: bf16 weights as they are, q8 and q4
// as their small integers (|q| <= 127 is exact in bf16), the scale applied to the f32
// accumulator afterwards (q4: per group of 32 = one k step, q8: per row at the end), so the
// products use core/quant.cpp's dequantized values. The f32 activations are split into three
// bf16 parts, x = hi + mid + lo (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)):
// 8 significant bits each, so the three carry all 24 of x's (exactly, unless a part falls
// below bf16's normal range) and hi . w + mid . w + lo . w is the f32 product up to the order
// of the sums. Two parts (16 bits, relative error up to 2^-16 an element) were measured: the
// hybrid fixtures' logits moved 1.7e-4 from transformers' against 1e-5 on the f32 tiles, past
// the parity bound of 1e-4; three MMAs per product cost less than that accuracy. The tensor
// cores' f32 accumulation is not IEEE (its sums
// are aligned and truncated, so the error grows with k and is biased), so each k step of 32
// is summed in a fresh fragment and added to the running sums with ordinary f32 adds: the
// tensor cores never add more than 32 products a part into one value.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): g = lane / 4, t = lane % 4; A (16 x 16,
// row-major) a0: (g, 2t..2t+1), a1: (g + 8, 2t..), a2: (g, 2t + 8..), a3: (g + 8, 2t + 8..);
// B (16 x 8, k x n) b0: (k 2t..2t+1, n g), b1: (k 2t + 8.., n g); C c0, c1: (g, 2t, 2t + 1),
// c2, c3: (g + 8, 2t, 2t + 1). Each 32-bit register holds two bf16, the lower k in the low half.
#pragma once

#include "backends/cuda/common.cuh"
#include "core/switches.h"

namespace sluice::cuda::mma {

constexpr int kBN = 64;           // weight rows (output columns) per block tile
constexpr int kBK = 32;           // k per step: one q4 group
constexpr int kPad = 8;           // bf16 of padding per shared row: 40 bf16 = 20 words, conflict-free fragment loads
constexpr int kLd = kBK + kPad;   // shared row stride in bf16
constexpr int kThreads = 128;     // 4 warps
constexpr int kParts = 3;         // bf16 parts of each activation

// The weight types the tensor-core tiles read (others take the f32 FMA tiles).
__host__ __device__ constexpr bool supports(WType t) { return t == WType::bf16 || t == WType::q8 || t == WType::q4; }

// Whether a product of k columns with these row strides can use the tiles: whole k steps,
// rows 16-byte aligned (vector loads of x and w).
inline bool usable(WType t, int64_t k, const void* x, int64_t x_row_floats, const void* w, int64_t w_row_bytes) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return supports(t) && k % kBK == 0 && aligned(x) && x_row_floats % 4 == 0 && aligned(w) && w_row_bytes % 16 == 0;
}

// Whether prefill products may take the tensor-core tiles (SLUICE_CUDA_TENSOR_CORES=0 sends
// them to the f32 FMA tiles).
inline bool tensor_cores_enabled() { return switches::on(Switch::cuda_tensor_cores); }

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo_k, float hi_k) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo_k, hi_k);  // .x (low half) = lo_k
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x = part[0] + part[1] + part[2] for two consecutive k, each part a packed bf16 pair.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t (&part)[kParts]) {
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    const float ah = __bfloat162float(__float2bfloat16_rn(a)), bh = __bfloat162float(__float2bfloat16_rn(b));
    part[i] = pack_bf16(ah, bh);
    a -= ah;  // exact: the remainder of a rounding to 8 bits fits in f32
    b -= bh;
  }
}

// Shared memory of one block tile: NMAT weight matrices over the same x rows.
template <int BM, int NMAT>
struct Smem {
  __nv_bfloat16 x[kParts][BM][kLd];  // the activations' parts, hi first
  __nv_bfloat16 w[NMAT][kBN][kLd];
  float scale[NMAT][kBN];  // q4: this k step's group scale; q8: the row's scale
};

// Stages x rows [BM] x k [k0, k0 + 32) into s.x's parts: row r from xrow[r] (null: zero
// row, past the tile's end). 128 threads: row tid / (128 / BM), 32 / (128 / BM) floats each.
template <int BM, int NMAT>
__device__ __forceinline__ void stage_x(Smem<BM, NMAT>& s, const float* const* xrow, int64_t k0) {
  constexpr int kTpr = kThreads / BM, kEpt = kBK / kTpr;  // threads per row, floats per thread
  const int r = threadIdx.x / kTpr, c0 = (threadIdx.x % kTpr) * kEpt;
  const float* src = xrow[r];
#pragma unroll
  for (int c = 0; c < kEpt; c += 4) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (src) v = *reinterpret_cast<const float4*>(src + k0 + c0 + c);
    uint32_t p01[kParts], p23[kParts];
    split_pair(v.x, v.y, p01);
    split_pair(v.z, v.w, p23);
#pragma unroll
    for (int i = 0; i < kParts; ++i) *reinterpret_cast<uint2*>(&s.x[i][r][c0 + c]) = make_uint2(p01[i], p23[i]);
  }
}

// Stages weight rows [64] x k [k0, k0 + 32) of matrix m into s.w[m] as bf16 (q8/q4: the
// integers, exactly) and, for q4 (every step) and q8 (first step), the rows' scales.
// wrow[c]: row c's packed values (null past the matrix's end), srow[c] its scales. Two
// threads per row, 16 k each.
template <WType T, int BM, int NMAT>
__device__ __forceinline__ void stage_w(Smem<BM, NMAT>& s, int m, const uint8_t* const* wrow,
                                        const uint8_t* const* srow, int64_t k0) {
  const int c = threadIdx.x / 2, half = threadIdx.x % 2;
  const uint8_t* src = wrow[c];
  uint32_t out[8] = {};  // 16 bf16
  if (src) {
    if constexpr (T == WType::bf16) {
      const uint4* p = reinterpret_cast<const uint4*>(src + 2 * (k0 + 16 * half));
      const uint4 a = p[0], b = p[1];
      out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
      out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    } else if constexpr (T == WType::q8) {
      const uint4 a = *reinterpret_cast<const uint4*>(src + k0 + 16 * half);
      const uint32_t words[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int8_t* q = reinterpret_cast<const int8_t*>(&words[i]);
        out[2 * i] = pack_bf16(static_cast<float>(q[0]), static_cast<float>(q[1]));
        out[2 * i + 1] = pack_bf16(static_cast<float>(q[2]), static_cast<float>(q[3]));
      }
      if (k0 == 0 && half == 0) s.scale[m][c] = *reinterpret_cast<const float*>(srow[c]);
    } else {  // q4: group k0 / 32 is 16 bytes, this half's 16 elements are its bytes 8 * half ..
      const uint2 a = *reinterpret_cast<const uint2*>(src + k0 / 2 + 8 * half);
      const uint32_t words[2] = {a.x, a.y};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t byte = (words[i / 4] >> (8 * (i % 4))) & 0xffu;  // elements 2i (low nibble), 2i + 1
        out[i] = pack_bf16(static_cast<float>(static_cast<int>(byte & 15u) - 8),
                           static_cast<float>(static_cast<int>(byte >> 4) - 8));
      }
      if (half == 0) s.scale[m][c] = __half2float(reinterpret_cast<const __half*>(srow[c])[k0 / kBK]);
    }
  } else if (half == 0 && (T == WType::q4 || k0 == 0)) {
    s.scale[m][c] = 0.0f;
  }
  uint4* dst = reinterpret_cast<uint4*>(&s.w[m][c][16 * half]);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// Warp tiles: 4 warps over a BM x 64 block tile; BM = 64: 2 x 2 warps of 32 x 32; BM = 32:
// 1 x 4 warps of 32 x 16. A warp holds kMi x kNi fragments of 16 x 8.
template <int BM>
struct WarpTile {
  static constexpr int kWarpsN = BM == 64 ? 2 : 4;
  static constexpr int kWm = 32, kWn = kBN / kWarpsN;
  static constexpr int kMi = kWm / 16, kNi = kWn / 8;
  __device__ static int row0() { return (threadIdx.x / 32) / kWarpsN * kWm; }
  __device__ static int col0() { return (threadIdx.x / 32) % kWarpsN * kWn; }
};

template <int BM>
using Acc = float[WarpTile<BM>::kMi][WarpTile<BM>::kNi][4];

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix .x4): lane l gives the address of row
// l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); r[q] gets this lane's pair of matrix q,
// (row lane / 4, columns 2 (lane % 4), + 1): the fragments' layout.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// acc[m] += x_tile . w_tile[m]^T over one k step for every matrix m and part of x: xp the x
// parts [kParts][BM][kLd], ws the NMAT weight tiles [kBN][kLd], bf16 in shared memory. The
// fragments come by ldmatrix (A: one .x4 a 16 x 16 block; B: one .x4 two 8-column blocks), each
// A fragment serves every matrix. Each accumulator takes its MMAs in the order ks, part.
template <int BM, int NMAT>
__device__ __forceinline__ void step_tiles(const __nv_bfloat16 (&xp)[kParts][BM][kLd],
                                           const __nv_bfloat16 (&ws)[NMAT][kBN][kLd], Acc<BM> (&acc)[NMAT]) {
  using W = WarpTile<BM>;
  static_assert(W::kNi % 2 == 0, "B fragments load two 8-column blocks at a time");
  const int lane = threadIdx.x % 32, q = lane / 8, r = lane % 8;
  const int r0 = W::row0(), n0 = W::col0();
#pragma unroll
  for (int ks = 0; ks < kBK; ks += 16) {
    uint32_t b[NMAT][W::kNi][2];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int j = 0; j < W::kNi; j += 2) {
        // matrices: (cols 8j.., k ks..), (8j.., ks + 8..), (8j + 8.., ks..), (8j + 8.., ks + 8..)
        uint32_t f[4];
        ldmatrix_x4(f, &ws[m][n0 + 8 * (j + q / 2) + r][ks + 8 * (q % 2)]);
        b[m][j][0] = f[0];
        b[m][j][1] = f[1];
        b[m][j + 1][0] = f[2];
        b[m][j + 1][1] = f[3];
      }
#pragma unroll
    for (int part = 0; part < kParts; ++part)
#pragma unroll
      for (int i = 0; i < W::kMi; ++i) {
        // matrices: (rows 16i.., k ks..), (16i + 8.., ks..), (16i.., ks + 8..), (16i + 8.., ks + 8..)
        uint32_t a[4];
        ldmatrix_x4(a, &xp[part][r0 + 16 * i + 8 * (q % 2) + r][ks + 8 * (q / 2)]);
#pragma unroll
        for (int m = 0; m < NMAT; ++m)
#pragma unroll
          for (int j = 0; j < W::kNi; ++j) mma_bf16(acc[m][i][j], a, b[m][j]);
      }
  }
}

// acc[i][j][e] += part[i][j][e] * scale of its column (q4: after each group of 32 k).
template <int BM>
__device__ __forceinline__ void add_scaled(const float (&scale)[kBN], Acc<BM>& acc, Acc<BM>& part) {
  using W = WarpTile<BM>;
  const int t = threadIdx.x % 4, n0 = W::col0();
#pragma unroll
  for (int j = 0; j < W::kNi; ++j) {
    const float s0 = scale[n0 + 8 * j + 2 * t], s1 = scale[n0 + 8 * j + 2 * t + 1];
#pragma unroll
    for (int i = 0; i < W::kMi; ++i) {
      acc[i][j][0] = fmaf(part[i][j][0], s0, acc[i][j][0]);
      acc[i][j][1] = fmaf(part[i][j][1], s1, acc[i][j][1]);
      acc[i][j][2] = fmaf(part[i][j][2], s0, acc[i][j][2]);
      acc[i][j][3] = fmaf(part[i][j][3], s1, acc[i][j][3]);
      part[i][j][0] = part[i][j][1] = part[i][j][2] = part[i][j][3] = 0.0f;
    }
  }
}

// acc += part, part = 0 (bf16, q8).
template <int BM>
__device__ __forceinline__ void add_plain(Acc<BM>& acc, Acc<BM>& part) {
  using W = WarpTile<BM>;
#pragma unroll
  for (int i = 0; i < W::kMi; ++i)
#pragma unroll
    for (int j = 0; j < W::kNi; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[i][j][e] += part[i][j][e];
        part[i][j][e] = 0.0f;
      }
}

// The whole product of a block tile over k (a multiple of 32): acc[m] for each of the NMAT
// weight matrices, f32, scales applied. xrow / wrow / srow as stage_x / stage_w take them
// (wrow[m * 64 + c], srow likewise); all threads of the block call it.
template <WType T, int BM, int NMAT>
__device__ __forceinline__ void block_product(Smem<BM, NMAT>& s, const float* const* xrow,
                                              const uint8_t* const* wrow, const uint8_t* const* srow, int64_t k,
                                              Acc<BM> (&acc)[NMAT]) {
  using W = WarpTile<BM>;
  Acc<BM> part[NMAT];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int i = 0; i < W::kMi; ++i)
#pragma unroll
      for (int j = 0; j < W::kNi; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][i][j][e] = part[m][i][j][e] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    stage_x(s, xrow, k0);
#pragma unroll
    for (int m = 0; m < NMAT; ++m) stage_w<T>(s, m, wrow + m * kBN, srow + m * kBN, k0);
    __syncthreads();
    step_tiles<BM, NMAT>(s.x, s.w, part);
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      if constexpr (T == WType::q4) add_scaled<BM>(s.scale[m], acc[m], part[m]);
      else add_plain<BM>(acc[m], part[m]);
    }
    __syncthreads();
  }
  if constexpr (T == WType::q8) {  // one scale per row: applied once, at the end
    const int t = threadIdx.x % 4, n0 = W::col0();
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int j = 0; j < W::kNi; ++j) {
        const float s0 = s.scale[m][n0 + 8 * j + 2 * t], s1 = s.scale[m][n0 + 8 * j + 2 * t + 1];
#pragma unroll
        for (int i = 0; i < W::kMi; ++i) {
          acc[m][i][j][0] *= s0;
          acc[m][i][j][1] *= s1;
          acc[m][i][j][2] *= s0;
          acc[m][i][j][3] *= s1;
        }
      }
  }
}

// Visits the block tile's outputs of this thread: f(tile row, tile column, value per matrix).
template <int BM, int NMAT, typename F>
__device__ __forceinline__ void for_each_output(const Acc<BM> (&acc)[NMAT], F&& f) {
  using W = WarpTile<BM>;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < W::kMi; ++i)
#pragma unroll
    for (int j = 0; j < W::kNi; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = W::row0() + 16 * i + g + (e >= 2 ? 8 : 0), c = W::col0() + 8 * j + 2 * t + (e & 1);
        float v[NMAT];
#pragma unroll
        for (int m = 0; m < NMAT; ++m) v[m] = acc[m][i][j][e];
        f(r, c, v);
      }
}


// ---- Pipelined tiles over activations split beforehand (the grouped experts) ----
// x arrives as its three bf16 parts in global memory (part i of row r at xrow[r] + i * xpart;
// launch_split_bf16_parts, or the gate/up epilogue), so staging x is a plain copy (cp.async:
// no registers, no ALU) and the split is done once a row instead of once a column tile. Two
// stages: while the MMAs of k step s run on one, step s + 1's x copies and weight loads are in
// flight into the other; the weights are converted and stored after the MMAs; one barrier a
// step. The same products as block_product: the same parts, the same per-step sums.
template <int BM, int NMAT>
struct PipeSmem {
  __nv_bfloat16 x[2][kParts][BM][kLd];
  __nv_bfloat16 w[2][NMAT][kBN][kLd];
  float scale[2][NMAT][kBN];  // q4: the step's group scales; q8: the rows' scales (stage 0)
};

// One thread's raw weights of one k step: row tid / 2, k half tid % 2 (16 elements).
template <WType T>
struct WRegs {
  static constexpr int kWords = T == WType::bf16 ? 8 : T == WType::q8 ? 4 : 2;
  uint32_t raw[kWords];
  float scale;
};

template <WType T>
__device__ __forceinline__ void load_w(WRegs<T>& r, const uint8_t* src, const uint8_t* srow, int64_t k0) {
  const int half = threadIdx.x % 2;
  if (!src) {
#pragma unroll
    for (int i = 0; i < WRegs<T>::kWords; ++i) r.raw[i] = 0;
    r.scale = 0.0f;
    return;
  }
  if constexpr (T == WType::bf16) {
    const uint4* p = reinterpret_cast<const uint4*>(src + 2 * (k0 + 16 * half));
    const uint4 a = p[0], b = p[1];
    r.raw[0] = a.x; r.raw[1] = a.y; r.raw[2] = a.z; r.raw[3] = a.w;
    r.raw[4] = b.x; r.raw[5] = b.y; r.raw[6] = b.z; r.raw[7] = b.w;
  } else if constexpr (T == WType::q8) {
    const uint4 a = *reinterpret_cast<const uint4*>(src + k0 + 16 * half);
    r.raw[0] = a.x; r.raw[1] = a.y; r.raw[2] = a.z; r.raw[3] = a.w;
    if (k0 == 0) r.scale = *reinterpret_cast<const float*>(srow);
  } else {
    const uint2 a = *reinterpret_cast<const uint2*>(src + k0 / 2 + 8 * half);
    r.raw[0] = a.x; r.raw[1] = a.y;
    r.scale = __half2float(reinterpret_cast<const __half*>(srow)[k0 / kBK]);
  }
}

// The q4 byte b (element 2i in the low nibble, 2i + 1 in the high) as two bf16, each nibble
// minus 8: 0x4300 | q is bf16(128 + q) (7 mantissa bits: integers to 255 exact), and
// (128 + q) - 136 = q - 8 is exact too.
__device__ __forceinline__ uint32_t q4_byte_bf16x2(uint32_t b) {
  const uint32_t v = 0x43004300u | (b & 0x0fu) | ((b & 0xf0u) << 12);
  const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), __floats2bfloat162_rn(136.0f, 136.0f));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Stores a thread's loaded weights of matrix m into stage buf as bf16 (the integers, exactly).
template <WType T, int BM, int NMAT>
__device__ __forceinline__ void store_w(PipeSmem<BM, NMAT>& s, int buf, int m, const WRegs<T>& r, int64_t k0) {
  const int c = threadIdx.x / 2, half = threadIdx.x % 2;
  uint32_t out[8];
  if constexpr (T == WType::bf16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = r.raw[i];
  } else if constexpr (T == WType::q8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int8_t* q = reinterpret_cast<const int8_t*>(&r.raw[i]);
      out[2 * i] = pack_bf16(static_cast<float>(q[0]), static_cast<float>(q[1]));
      out[2 * i + 1] = pack_bf16(static_cast<float>(q[2]), static_cast<float>(q[3]));
    }
    if (k0 == 0 && half == 0) s.scale[0][m][c] = r.scale;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = q4_byte_bf16x2((r.raw[i / 4] >> (8 * (i % 4))) & 0xffu);
    if (half == 0) s.scale[buf][m][c] = r.scale;
  }
  uint4* dst = reinterpret_cast<uint4*>(&s.w[buf][m][c][16 * half]);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// Issues the copies of x rows [BM] x k [k0, k0 + 32) of every part into stage buf: row r from
// xrow[r] (null: zeros; `any` is a readable address for those).
template <int BM, int NMAT>
__device__ __forceinline__ void copy_x(PipeSmem<BM, NMAT>& s, int buf, const __nv_bfloat16* const* xrow, int64_t xpart,
                                       const __nv_bfloat16* any, int64_t k0) {
  constexpr int kChunks = kParts * BM * (kBK / 8);  // 16 bytes each
#pragma unroll
  for (int q = 0; q < kChunks / kThreads; ++q) {
    const int i = threadIdx.x + kThreads * q;
    const int part = i / (BM * 4), r = (i / 4) % BM, c = i % 4;
    const __nv_bfloat16* src = xrow[r];
    cp_async16(&s.x[buf][part][r][8 * c], src ? src + part * xpart + k0 + 8 * c : any, src != nullptr);
  }
}

// block_product over pre-split x: xrow[r] row r's part 0 (bf16), part i at + i * xpart.
template <WType T, int BM, int NMAT>
__device__ __forceinline__ void block_product_split(PipeSmem<BM, NMAT>& s, const __nv_bfloat16* const* xrow,
                                                    int64_t xpart, const __nv_bfloat16* any,
                                                    const uint8_t* const* wrow, const uint8_t* const* srow,
                                                    int64_t k, Acc<BM> (&acc)[NMAT]) {
  using W = WarpTile<BM>;
  static_assert(kParts * BM * (kBK / 8) % kThreads == 0, "x copies split evenly over the threads");
  Acc<BM> part[NMAT];
#pragma unroll
  for (int m = 0; m < NMAT; ++m)
#pragma unroll
    for (int i = 0; i < W::kMi; ++i)
#pragma unroll
      for (int j = 0; j < W::kNi; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][i][j][e] = part[m][i][j][e] = 0.0f;
  const int c = threadIdx.x / 2;
  WRegs<T> wr[NMAT];
  copy_x(s, 0, xrow, xpart, any, 0);
  cp_async_commit();
#pragma unroll
  for (int m = 0; m < NMAT; ++m) load_w<T>(wr[m], wrow[m * kBN + c], srow[m * kBN + c], 0);
#pragma unroll
  for (int m = 0; m < NMAT; ++m) store_w<T>(s, 0, m, wr[m], 0);
  cp_async_wait<0>();
  __syncthreads();
  const int64_t steps = k / kBK;
  for (int64_t st = 0; st < steps; ++st) {
    const int buf = static_cast<int>(st & 1);
    const bool next = st + 1 < steps;
    const int64_t k1 = (st + 1) * kBK;
    if (next) {  // stage buf ^ 1 was last read before the previous barrier
      copy_x(s, buf ^ 1, xrow, xpart, any, k1);
#pragma unroll
      for (int m = 0; m < NMAT; ++m) load_w<T>(wr[m], wrow[m * kBN + c], srow[m * kBN + c], k1);
    }
    cp_async_commit();
    step_tiles<BM, NMAT>(s.x[buf], s.w[buf], part);
#pragma unroll
    for (int m = 0; m < NMAT; ++m) {
      if constexpr (T == WType::q4) add_scaled<BM>(s.scale[buf][m], acc[m], part[m]);
      else add_plain<BM>(acc[m], part[m]);
    }
    if (next)
#pragma unroll
      for (int m = 0; m < NMAT; ++m) store_w<T>(s, buf ^ 1, m, wr[m], k1);
    cp_async_wait<0>();
    __syncthreads();
  }
  if constexpr (T == WType::q8) {  // one scale per row: applied once, at the end
    const int t = threadIdx.x % 4, n0 = W::col0();
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
      for (int j = 0; j < W::kNi; ++j) {
        const float s0 = s.scale[0][m][n0 + 8 * j + 2 * t], s1 = s.scale[0][m][n0 + 8 * j + 2 * t + 1];
#pragma unroll
        for (int i = 0; i < W::kMi; ++i) {
          acc[m][i][j][0] *= s0;
          acc[m][i][j][1] *= s1;
          acc[m][i][j][2] *= s0;
          acc[m][i][j][3] *= s1;
        }
      }
  }
}

}  // namespace sluice::cuda::mma
