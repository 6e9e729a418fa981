// Warp-wide dot products of one weight row with one f32 activation row, for every weight
// type the backend reads (f32, f16, bf16, and the quantized kinds of core/quant.h). Shared by
// the decode matrix-vector kernels and the MoE expert kernels.
//
// Two paths per type:
//   - vectorized: each lane loads 16 bytes of the row per step (f32: 4 values, bf16/f16: 8,
//     q8: 16, q4: one group of 32, q2: four groups of 16), when the row is 16-byte aligned
//     and k is a multiple of the step's width (row_dot_vec_ok);
//   - scalar: one element per lane per step, any k (partial quantized groups included).
// Elements are dequantized exactly as core/quant.cpp does (q4: (q - 8) * d; q2:
// fma(q, scale, min); q8: q * scale), so only the summation order differs from the CPU.
// Every lane returns the full sum.
#pragma once

#include "backends/cuda/common.cuh"

namespace sluice::cuda {

// Weight codes of the dot products: WType's 0..2 and the quantized kinds.
enum class DotType : int { f32 = 0, f16 = 1, bf16 = 2, q8 = 10, q4 = 11, q2 = 12 };

// Elements one lane consumes per 16-byte load.
template <DotType T> __host__ __device__ constexpr int dot_vec_elems() {
  if constexpr (T == DotType::f32) return 4;
  else if constexpr (T == DotType::f16 || T == DotType::bf16) return 8;
  else if constexpr (T == DotType::q8) return 16;
  else if constexpr (T == DotType::q4) return 32;
  else return 64;
}

// Bytes of one row's packed values and of its scales, for k columns.
__host__ __device__ inline int64_t dot_row_bytes(DotType t, int64_t k) {
  switch (t) {
    case DotType::f32: return 4 * k;
    case DotType::f16:
    case DotType::bf16: return 2 * k;
    case DotType::q8: return k;
    case DotType::q4: return (k + 31) / 32 * 16;
    case DotType::q2: return (k + 15) / 16 * 4;
  }
  return 0;
}
__host__ __device__ inline int64_t dot_scale_row_bytes(DotType t, int64_t k) {
  switch (t) {
    case DotType::q8: return 4;
    case DotType::q4: return (k + 31) / 32 * 2;
    case DotType::q2: return (k + 15) / 16 * 4;
    default: return 0;
  }
}

__host__ __device__ inline int dot_vec_width(DotType t) {
  switch (t) {
    case DotType::f32: return 4;
    case DotType::f16:
    case DotType::bf16: return 8;
    case DotType::q8: return 16;
    case DotType::q4: return 32;
    case DotType::q2: return 64;
  }
  return 1;
}

// Whether the vectorized path applies: k a multiple of the load width, row starts (base and
// stride) 16-byte aligned, x rows 16-byte aligned.
__host__ __device__ inline bool row_dot_vec_ok(DotType t, const void* w, int64_t k, const float* x, int64_t ldx) {
  const int64_t rb = dot_row_bytes(t, k);
  return k % dot_vec_width(t) == 0 && rb % 16 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(x) & 15) == 0 && ldx % 4 == 0;
}

__device__ __forceinline__ void bf16x2_to_f32(uint32_t v, float& a, float& b) {
  a = __uint_as_float(v << 16);
  b = __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ void f16x2_to_f32(uint32_t v, float& a, float& b) {
  const __half2 h = *reinterpret_cast<const __half2*>(&v);
  const float2 f = __half22float2(h);
  a = f.x;
  b = f.y;
}

// One 16-byte chunk: the partial dot of chunk c (in units of dot_vec_elems) of a row.
// wrow: the row's packed values; srow: its scales; x: the activation row.
template <DotType T>
__device__ __forceinline__ float dot_chunk(const uint4 wv, const uint8_t* __restrict__ srow, const float* __restrict__ x,
                                           int64_t c, float acc) {
  constexpr int E = dot_vec_elems<T>();
  const float4* xv = reinterpret_cast<const float4*>(x + c * E);
  const uint32_t w32[4] = {wv.x, wv.y, wv.z, wv.w};
  if constexpr (T == DotType::f32) {
    const float4 a = xv[0];
    acc = fmaf(__uint_as_float(w32[0]), a.x, acc);
    acc = fmaf(__uint_as_float(w32[1]), a.y, acc);
    acc = fmaf(__uint_as_float(w32[2]), a.z, acc);
    acc = fmaf(__uint_as_float(w32[3]), a.w, acc);
  } else if constexpr (T == DotType::bf16 || T == DotType::f16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float4 a = xv[i];
      float w0, w1, w2, w3;
      if constexpr (T == DotType::bf16) {
        bf16x2_to_f32(w32[2 * i], w0, w1);
        bf16x2_to_f32(w32[2 * i + 1], w2, w3);
      } else {
        f16x2_to_f32(w32[2 * i], w0, w1);
        f16x2_to_f32(w32[2 * i + 1], w2, w3);
      }
      acc = fmaf(w0, a.x, acc);
      acc = fmaf(w1, a.y, acc);
      acc = fmaf(w2, a.z, acc);
      acc = fmaf(w3, a.w, acc);
    }
  } else if constexpr (T == DotType::q8) {
    const float scale = *reinterpret_cast<const float*>(srow);
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 a = xv[i];
      const uint32_t v = w32[i];
      // q * scale per element, as dequantize_row (one f32 multiply), then the dot.
      part = fmaf(static_cast<float>(static_cast<int8_t>(v & 0xff)) * scale, a.x, part);
      part = fmaf(static_cast<float>(static_cast<int8_t>((v >> 8) & 0xff)) * scale, a.y, part);
      part = fmaf(static_cast<float>(static_cast<int8_t>((v >> 16) & 0xff)) * scale, a.z, part);
      part = fmaf(static_cast<float>(static_cast<int8_t>(v >> 24)) * scale, a.w, part);
    }
    acc += part;
  } else if constexpr (T == DotType::q4) {
    // One group of 32: byte j holds element 2j (low nibble) and 2j+1 (high nibble).
    const float d = __half2float(reinterpret_cast<const __half*>(srow)[c]);
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = w32[i];
      const float4 a = xv[2 * i], b = xv[2 * i + 1];
      part = fmaf(static_cast<float>(static_cast<int>(v & 15) - 8) * d, a.x, part);
      part = fmaf(static_cast<float>(static_cast<int>((v >> 4) & 15) - 8) * d, a.y, part);
      part = fmaf(static_cast<float>(static_cast<int>((v >> 8) & 15) - 8) * d, a.z, part);
      part = fmaf(static_cast<float>(static_cast<int>((v >> 12) & 15) - 8) * d, a.w, part);
      part = fmaf(static_cast<float>(static_cast<int>((v >> 16) & 15) - 8) * d, b.x, part);
      part = fmaf(static_cast<float>(static_cast<int>((v >> 20) & 15) - 8) * d, b.y, part);
      part = fmaf(static_cast<float>(static_cast<int>((v >> 24) & 15) - 8) * d, b.z, part);
      part = fmaf(static_cast<float>(static_cast<int>(v >> 28) - 8) * d, b.w, part);
    }
    acc += part;
  } else {
    // Four groups of 16: byte j holds elements 4j..4j+3 in bits 0-1, 2-3, 4-5, 6-7.
    const __half2* s = reinterpret_cast<const __half2*>(srow) + 4 * c;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const float2 sm = __half22float2(s[g]);  // (scale, min)
      const uint32_t v = w32[g];
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 a = xv[4 * g + i];
        const uint32_t byte = (v >> (8 * i)) & 0xff;
        part = fmaf(fmaf(static_cast<float>(byte & 3), sm.x, sm.y), a.x, part);
        part = fmaf(fmaf(static_cast<float>((byte >> 2) & 3), sm.x, sm.y), a.y, part);
        part = fmaf(fmaf(static_cast<float>((byte >> 4) & 3), sm.x, sm.y), a.z, part);
        part = fmaf(fmaf(static_cast<float>(byte >> 6), sm.x, sm.y), a.w, part);
      }
      acc += part;
    }
  }
  return acc;
}

// Element c of a row (scalar path).
template <DotType T>
__device__ __forceinline__ float load_elem(const uint8_t* __restrict__ w, const uint8_t* __restrict__ s, int64_t c) {
  if constexpr (T == DotType::f32) return reinterpret_cast<const float*>(w)[c];
  else if constexpr (T == DotType::f16) return __half2float(reinterpret_cast<const __half*>(w)[c]);
  else if constexpr (T == DotType::bf16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(w)[c]);
  else if constexpr (T == DotType::q8)
    return static_cast<float>(reinterpret_cast<const int8_t*>(w)[c]) * *reinterpret_cast<const float*>(s);
  else if constexpr (T == DotType::q4) {
    const float d = __half2float(reinterpret_cast<const __half*>(s)[c / 32]);
    const int q = (w[c / 2] >> (4 * (c & 1))) & 15;
    return static_cast<float>(q - 8) * d;
  } else {
    const __half* sc = reinterpret_cast<const __half*>(s) + 2 * (c / 16);
    const int q = (w[c / 4] >> (2 * (c & 3))) & 3;
    return fmaf(static_cast<float>(q), __half2float(sc[0]), __half2float(sc[1]));
  }
}

// Partial (per lane) dot of a row with NX activation rows x + i * ldx; the caller reduces
// with warp_sum. vec: the vectorized path (row_dot_vec_ok held on the host).
template <DotType T, int NX>
__device__ __forceinline__ void row_dot_partial(const uint8_t* __restrict__ wrow, const uint8_t* __restrict__ srow,
                                                const float* __restrict__ x, int64_t ldx, int64_t k, bool vec,
                                                int lane, float (&acc)[NX]) {
  if (vec) {
    constexpr int E = dot_vec_elems<T>();
    const int64_t chunks = k / E;
    const uint4* wv = reinterpret_cast<const uint4*>(wrow);
    int64_t c = lane;
    // Two loads in flight per lane before the arithmetic.
    for (; c + 32 < chunks; c += 64) {
      const uint4 a = __ldg(wv + c), b = __ldg(wv + c + 32);
#pragma unroll
      for (int i = 0; i < NX; ++i) {
        acc[i] = dot_chunk<T>(a, srow, x + i * ldx, c, acc[i]);
        acc[i] = dot_chunk<T>(b, srow, x + i * ldx, c + 32, acc[i]);
      }
    }
    for (; c < chunks; c += 32) {
      const uint4 a = __ldg(wv + c);
#pragma unroll
      for (int i = 0; i < NX; ++i) acc[i] = dot_chunk<T>(a, srow, x + i * ldx, c, acc[i]);
    }
  } else {
    for (int64_t c = lane; c < k; c += 32) {
      const float wv = load_elem<T>(wrow, srow, c);
#pragma unroll
      for (int i = 0; i < NX; ++i) acc[i] = fmaf(wv, x[i * ldx + c], acc[i]);
    }
  }
}

// The whole dot of one row with one activation row, in every lane.
template <DotType T>
__device__ __forceinline__ float row_dot(const uint8_t* __restrict__ wrow, const uint8_t* __restrict__ srow,
                                         const float* __restrict__ x, int64_t k, bool vec, int lane) {
  float acc[1] = {0.0f};
  row_dot_partial<T, 1>(wrow, srow, x, 0, k, vec, lane, acc);
  return warp_sum(acc[0]);
}

// Runtime dispatch over the weight type (uniform across a warp, so no divergence).
__device__ __forceinline__ float row_dot_any(int wtype, const uint8_t* __restrict__ wrow,
                                             const uint8_t* __restrict__ srow, const float* __restrict__ x, int64_t k,
                                             bool vec, int lane) {
  switch (static_cast<DotType>(wtype)) {
    case DotType::f32: return row_dot<DotType::f32>(wrow, srow, x, k, vec, lane);
    case DotType::f16: return row_dot<DotType::f16>(wrow, srow, x, k, vec, lane);
    case DotType::bf16: return row_dot<DotType::bf16>(wrow, srow, x, k, vec, lane);
    case DotType::q8: return row_dot<DotType::q8>(wrow, srow, x, k, vec, lane);
    case DotType::q4: return row_dot<DotType::q4>(wrow, srow, x, k, vec, lane);
    case DotType::q2: return row_dot<DotType::q2>(wrow, srow, x, k, vec, lane);
  }
  return 0.0f;
}

}  // namespace sluice::cuda
