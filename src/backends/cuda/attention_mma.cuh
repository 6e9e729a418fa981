// Tensor-core pieces of the attention kernels (attention_flash.cu: prefill; attention_decode_mma.cu:
// a decode token's grouped query heads): mma.sync m16n8k16 with bf16 operands and f32
// accumulation, ldmatrix from shared rows of bf16 pairs, and the hi/lo split of f32 operands
// (attention_flash.cu's header says why two parts and three products).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace sluice::cuda::attention_mma {

// Words (bf16 pairs) per shared row of a head of D dims: D / 2 + 4, so P % 8 == 4 for D % 16 == 0.
template <int D> __host__ __device__ constexpr int row_words() { return D / 2 + 4; }
// Two consecutive f32 (a: the lower index) as bf16 pairs hi = bf16(x), lo = bf16(x - hi);
// each word holds the lower index in its low half, as mma's fragments want.
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  memcpy(&hi, &h, 4);
  memcpy(&lo, &l, 4);
}

// c[16 x 8] += a[16 x 16] . b[16 x 8] (bf16 in, f32 accumulate). With g = lane / 4, t = lane % 4:
// a0 (row g, k 2t..2t+1), a1 (row g + 8, k 2t..), a2 (row g, k 2t + 8..), a3 (row g + 8, k 2t + 8..);
// b0 (k 2t..2t+1, n g), b1 (k 2t + 8.., n g); c0, c1 (row g, n 2t, 2t + 1), c2, c3 (row g + 8, ...).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The split product: c += ah.bh + ah.bl + al.bh (small terms first); kBExact: b is exactly
// bf16 (bl = 0, not read), c += al.bh + ah.bh.
template <bool kBExact>
__device__ __forceinline__ void mma_split(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                          uint32_t bh0, uint32_t bh1, uint32_t bl0, uint32_t bl1) {
  mma_bf16(c, al, bh0, bh1);
  if constexpr (!kBExact) mma_bf16(c, ah, bl0, bl1);
  mma_bf16(c, ah, bh0, bh1);
}

// Four 8x8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 (16 bytes, 16-byte aligned); r[i] is matrix i's fragment (lane: row l / 4, cols
// 2 (l % 4), +1; with .trans: rows 2 (l % 4), +1 of col l / 4).
template <bool Trans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint32_t* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

}  // namespace sluice::cuda::attention_mma
