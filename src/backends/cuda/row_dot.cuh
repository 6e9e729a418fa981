// Warp-wide dot products of one weight row with one f32 activation row, for every weight
// type the backend reads (f32, f16, bf16, and the quantized kinds of core/quant.h). Shared by
// the decode matrix-vector kernels and the MoE expert kernels.
//
// Two paths per type:
//   - vectorized: each lane loads 16 bytes of a row per step (f32: 4 values, bf16/f16: 8,
//     q8: 16, q4: one group of 32, q2: four groups of 16), when the rows are 16-byte aligned
//     and k is a multiple of the step's width (row_dot_vec_ok); several rows share each
//     activation chunk loaded;
//   - scalar: one element per lane per step, any k (partial quantized groups included),
//     dequantized exactly as core/quant.cpp does.
// The vectorized path applies a quantized group's scale once to the group's sum (the same
// weights, summed in another order); only the summation order differs from the CPU.
#pragma once

#include "backends/cuda/common.cuh"
#include "core/mxfp4_bits.h"

namespace sluice::cuda {


// Elements one lane consumes per 16-byte load.
template <WType T> __host__ __device__ constexpr int dot_vec_elems() {
  if constexpr (T == WType::f32) return 4;
  else if constexpr (T == WType::f16 || T == WType::bf16) return 8;
  else if constexpr (T == WType::q8) return 16;
  else if constexpr (T == WType::q4 || T == WType::mxfp4) return 32;
  else return 64;
}

// Bytes of one row's packed values and of its scales, for k columns.
__host__ __device__ inline int64_t dot_row_bytes(WType t, int64_t k) {
  switch (t) {
    case WType::f32: return 4 * k;
    case WType::f16:
    case WType::bf16: return 2 * k;
    case WType::q8: return k;
    case WType::q4: return (k + 31) / 32 * 16;
    case WType::q2: return (k + 15) / 16 * 4;
    case WType::mxfp4: return (k + 31) / 32 * 16;
    default: return 0;
  }
}
__host__ __device__ inline int64_t dot_scale_row_bytes(WType t, int64_t k) {
  switch (t) {
    case WType::q8: return 4;
    case WType::q4: return (k + 31) / 32 * 2;
    case WType::q2: return (k + 15) / 16 * 4;
    case WType::mxfp4: return (k + 31) / 32;
    default: return 0;
  }
}

__host__ __device__ inline int dot_vec_width(WType t) {
  switch (t) {
    case WType::f32: return 4;
    case WType::f16:
    case WType::bf16: return 8;
    case WType::q8: return 16;
    case WType::q4:
    case WType::mxfp4: return 32;
    case WType::q2: return 64;
    default: return 1;
  }
}

// Whether the vectorized path applies: k a multiple of the load width, row starts (base and
// stride) 16-byte aligned, x rows 16-byte aligned.
__host__ __device__ inline bool row_dot_vec_ok(WType t, const void* w, int64_t k, const float* x, int64_t ldx) {
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
// Byte b of v (a value 0..255) as the float 2^23 + byte, exactly: one byte permute, no
// integer-to-float conversion (those run at 1/4 rate and bound a 4-bit matvec otherwise).
template <int B>
__device__ __forceinline__ float byte_f(uint32_t v) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440 | B));
}
constexpr float kTwo23 = 8388608.0f;

// The activations of chunk c (dot_vec_elems values) in registers.
template <WType T>
__device__ __forceinline__ void load_x_chunk(const float* __restrict__ x, int64_t c, float (&xr)[dot_vec_elems<T>()]) {
  constexpr int E = dot_vec_elems<T>();
  const float4* xv = reinterpret_cast<const float4*>(x + c * E);
#pragma unroll
  for (int i = 0; i < E / 4; ++i) {
    const float4 a = __ldg(xv + i);
    xr[4 * i] = a.x;
    xr[4 * i + 1] = a.y;
    xr[4 * i + 2] = a.z;
    xr[4 * i + 3] = a.w;
  }
}

// The scales of one 16-byte weight chunk, loaded together with the chunk (so that their load
// is in flight with the weights', not issued when the sums need them): q8 the row's scale,
// q4 the group's scale, q2 four (scale, min) pairs; nothing for the float kinds.
template <WType T>
struct ChunkScale {
  float v[T == WType::q2 ? 8 : 1] = {};
};
template <WType T>
__device__ __forceinline__ ChunkScale<T> load_chunk_scale(const uint8_t* __restrict__ srow, int64_t c) {
  ChunkScale<T> cs;
  if constexpr (T == WType::q8) {
    cs.v[0] = __ldg(reinterpret_cast<const float*>(srow));
  } else if constexpr (T == WType::q4) {
    cs.v[0] = __half2float(reinterpret_cast<const __half*>(srow)[c]);
  } else if constexpr (T == WType::mxfp4) {
    cs.v[0] = e8m0_value(__ldg(srow + c));
  } else if constexpr (T == WType::q2) {
    const __half2* sm = reinterpret_cast<const __half2*>(srow) + 4 * c;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const float2 f = __half22float2(sm[g]);
      cs.v[2 * g] = f.x;
      cs.v[2 * g + 1] = f.y;
    }
  }
  return cs;
}

// The dot of one 16-byte weight chunk (sc: its scales, load_chunk_scale) with the
// activations xr. Quantized kinds sum q * x per group and apply the group's scale (and min)
// once: the same weights, summed in another order.
template <WType T>
__device__ __forceinline__ float chunk_dot(const uint4 wv, const ChunkScale<T>& sc,
                                           const float (&xr)[dot_vec_elems<T>()]) {
  const uint32_t w32[4] = {wv.x, wv.y, wv.z, wv.w};
  float acc = 0.0f;
  if constexpr (T == WType::f32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc = fmaf(__uint_as_float(w32[i]), xr[i], acc);
  } else if constexpr (T == WType::bf16 || T == WType::f16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float w0, w1;
      if constexpr (T == WType::bf16) bf16x2_to_f32(w32[i], w0, w1);
      else f16x2_to_f32(w32[i], w0, w1);
      acc = fmaf(w0, xr[2 * i], acc);
      acc = fmaf(w1, xr[2 * i + 1], acc);
    }
  } else if constexpr (T == WType::q8) {
    // int8 q: q + 128 = byte ^ 0x80, so byte_f - (2^23 + 128) = q exactly.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = w32[i] ^ 0x80808080u;
      acc = fmaf(byte_f<0>(v) - (kTwo23 + 128.0f), xr[4 * i], acc);
      acc = fmaf(byte_f<1>(v) - (kTwo23 + 128.0f), xr[4 * i + 1], acc);
      acc = fmaf(byte_f<2>(v) - (kTwo23 + 128.0f), xr[4 * i + 2], acc);
      acc = fmaf(byte_f<3>(v) - (kTwo23 + 128.0f), xr[4 * i + 3], acc);
    }
    acc *= sc.v[0];
  } else if constexpr (T == WType::q4) {
    // One group of 32: byte j holds element 2j (low nibble) and 2j+1 (high nibble); w = (q - 8) d.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = w32[i] & 0x0F0F0F0Fu, hi = (w32[i] >> 4) & 0x0F0F0F0Fu;
      acc = fmaf(byte_f<0>(lo) - (kTwo23 + 8.0f), xr[8 * i], acc);
      acc = fmaf(byte_f<0>(hi) - (kTwo23 + 8.0f), xr[8 * i + 1], acc);
      acc = fmaf(byte_f<1>(lo) - (kTwo23 + 8.0f), xr[8 * i + 2], acc);
      acc = fmaf(byte_f<1>(hi) - (kTwo23 + 8.0f), xr[8 * i + 3], acc);
      acc = fmaf(byte_f<2>(lo) - (kTwo23 + 8.0f), xr[8 * i + 4], acc);
      acc = fmaf(byte_f<2>(hi) - (kTwo23 + 8.0f), xr[8 * i + 5], acc);
      acc = fmaf(byte_f<3>(lo) - (kTwo23 + 8.0f), xr[8 * i + 6], acc);
      acc = fmaf(byte_f<3>(hi) - (kTwo23 + 8.0f), xr[8 * i + 7], acc);
    }
    acc *= sc.v[0];
  } else if constexpr (T == WType::mxfp4) {
    // One group of 32, codes laid out as q4's (byte j: element 2j low nibble, 2j+1 high).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte = (w32[i] >> (8 * b)) & 0xFFu;
        acc = fmaf(e2m1_value(byte & 15u), xr[8 * i + 2 * b], acc);
        acc = fmaf(e2m1_value(byte >> 4), xr[8 * i + 2 * b + 1], acc);
      }
    }
    acc *= sc.v[0];
  } else {
    // Four groups of 16: byte j holds elements 4j..4j+3 in bits 0-1, 2-3, 4-5, 6-7;
    // w = q scale + min, so the group's dot is scale * sum(q x) + min * sum(x).
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const float2 s = make_float2(sc.v[2 * g], sc.v[2 * g + 1]);  // (scale, min)
      const float* xg = xr + 16 * g;
      float qx = 0.0f, sx = 0.0f;
#pragma unroll
      for (int sh = 0; sh < 4; ++sh) {  // element 4j + sh of byte j
        const uint32_t t = (w32[g] >> (2 * sh)) & 0x03030303u;
        qx = fmaf(byte_f<0>(t) - kTwo23, xg[sh], qx);
        qx = fmaf(byte_f<1>(t) - kTwo23, xg[4 + sh], qx);
        qx = fmaf(byte_f<2>(t) - kTwo23, xg[8 + sh], qx);
        qx = fmaf(byte_f<3>(t) - kTwo23, xg[12 + sh], qx);
      }
#pragma unroll
      for (int e = 0; e < 16; ++e) sx += xg[e];
      acc = fmaf(s.x, qx, fmaf(s.y, sx, acc));
    }
  }
  return acc;
}

// Element c of a row (scalar path).
template <WType T>
__device__ __forceinline__ float load_elem(const uint8_t* __restrict__ w, const uint8_t* __restrict__ s, int64_t c) {
  if constexpr (T == WType::f32) return reinterpret_cast<const float*>(w)[c];
  else if constexpr (T == WType::f16) return __half2float(reinterpret_cast<const __half*>(w)[c]);
  else if constexpr (T == WType::bf16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(w)[c]);
  else if constexpr (T == WType::q8)
    return static_cast<float>(reinterpret_cast<const int8_t*>(w)[c]) * *reinterpret_cast<const float*>(s);
  else if constexpr (T == WType::q4) {
    const float d = __half2float(reinterpret_cast<const __half*>(s)[c / 32]);
    const int q = (w[c / 2] >> (4 * (c & 1))) & 15;
    return static_cast<float>(q - 8) * d;
  } else if constexpr (T == WType::mxfp4) {
    return e2m1_value((w[c / 2] >> (4 * (c & 1))) & 15) * e8m0_value(s[c / 32]);
  } else {
    const __half* sc = reinterpret_cast<const __half*>(s) + 2 * (c / 16);
    const int q = (w[c / 4] >> (2 * (c & 3))) & 3;
    return fmaf(static_cast<float>(q), __half2float(sc[0]), __half2float(sc[1]));
  }
}

// Chunk c of each of NW rows (and its scales) into registers.
template <WType T, int NW>
__device__ __forceinline__ void load_row_chunks(const uint8_t* const (&w)[NW], const uint8_t* const (&s)[NW], int64_t c,
                                                uint4 (&wv)[NW], ChunkScale<T> (&sv)[NW]) {
#pragma unroll
  for (int r = 0; r < NW; ++r) {
    wv[r] = __ldg(reinterpret_cast<const uint4*>(w[r]) + c);
    sv[r] = load_chunk_scale<T>(s[r], c);
  }
}

// acc[i][r] += the dot of row r's chunk c (wv, sv) with activation row i's chunk.
template <WType T, int NX, int NW>
__device__ __forceinline__ void apply_row_chunks(const uint4 (&wv)[NW], const ChunkScale<T> (&sv)[NW],
                                                 const float* __restrict__ x, int64_t ldx, int64_t c,
                                                 float (&acc)[NX][NW]) {
#pragma unroll
  for (int i = 0; i < NX; ++i) {
    float xr[dot_vec_elems<T>()];
    load_x_chunk<T>(x + i * ldx, c, xr);
#pragma unroll
    for (int r = 0; r < NW; ++r) acc[i][r] += chunk_dot<T>(wv[r], sv[r], xr);
  }
}

// Chunks in flight a lane in rows_dot_partial's vectorized loop: about 8 rows' (NW rows a
// step), a memory round trip each.
template <int NW>
__host__ __device__ constexpr int rows_dot_unroll() {
  return NW >= 4 ? 2 : 8 / NW;
}

// Per-lane partial dots of NW weight rows (any rows of the same type and k: w[r], s[r]) with NX
// activation rows x + i * ldx: acc[i][r]. Each loaded activation chunk serves all NW rows
// (the activations, not the weights, would otherwise bound the L1 traffic of a 4-bit row).
// The caller reduces with warp_sum. vec: the vectorized path (row_dot_vec_ok held for every
// row and x).
template <WType T, int NX, int NW>
__device__ __forceinline__ void rows_dot_partial(const uint8_t* const (&w)[NW], const uint8_t* const (&s)[NW],
                                                 const float* __restrict__ x, int64_t ldx, int64_t k, bool vec,
                                                 int lane, float (&acc)[NX][NW], int ks = 0, int n_ks = 1) {
  // Split over k (ks of n_ks warps on the same rows): lane takes chunks lane + 32 (ks + n_ks i).
  const int64_t step = 32 * static_cast<int64_t>(n_ks);
  if (vec) {
    const int64_t chunks = k / dot_vec_elems<T>();
    int64_t c = lane + 32 * ks;
    constexpr int kUnroll = rows_dot_unroll<NW>();
#pragma unroll kUnroll
    for (; c < chunks; c += step) {
      uint4 wv[NW];
      ChunkScale<T> sv[NW];
      load_row_chunks<T, NW>(w, s, c, wv, sv);
      apply_row_chunks<T, NX, NW>(wv, sv, x, ldx, c, acc);
    }
  } else {
    for (int64_t c = lane + 32 * ks; c < k; c += step) {
#pragma unroll
      for (int r = 0; r < NW; ++r) {
        const float wv = load_elem<T>(w[r], s[r], c);
#pragma unroll
        for (int i = 0; i < NX; ++i) acc[i][r] = fmaf(wv, x[i * ldx + c], acc[i][r]);
      }
    }
  }
}

// NW whole dots of rows with one activation row, in every lane (runtime type, uniform across
// the warp).
template <int NW>
__device__ __forceinline__ void rows_dot_any(WType wtype, const uint8_t* const (&w)[NW], const uint8_t* const (&s)[NW],
                                             const float* __restrict__ x, int64_t k, bool vec, int lane,
                                             float (&out)[NW]) {
  float acc[1][NW];
#pragma unroll
  for (int r = 0; r < NW; ++r) acc[0][r] = 0.0f;
  switch (wtype) {
    case WType::f32: rows_dot_partial<WType::f32, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    case WType::f16: rows_dot_partial<WType::f16, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    case WType::bf16: rows_dot_partial<WType::bf16, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    case WType::q8: rows_dot_partial<WType::q8, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    case WType::q4: rows_dot_partial<WType::q4, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    case WType::q2: rows_dot_partial<WType::q2, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    case WType::mxfp4: rows_dot_partial<WType::mxfp4, 1, NW>(w, s, x, 0, k, vec, lane, acc); break;
    default: break;
  }
#pragma unroll
  for (int r = 0; r < NW; ++r) out[r] = warp_sum(acc[0][r]);
}

}  // namespace sluice::cuda
