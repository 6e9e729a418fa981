// AVX2/FMA/F16C building blocks shared by the CPU kernels (x86-64-v3 baseline, no AVX-512).
//
// Reproducibility rule: every reduction here has ONE fixed order that does not depend on
// where a vector sits in a row, on the batch size or on threading. A k-long dot product is
// always: one 8-lane accumulator, acc = fma(a[8b..8b+8), b[8b..8b+8), acc) for b = 0, 1, ...
// with the last partial block zero-padded (0 * 0 adds +0, exactly as a full block would),
// then hsum8's fixed horizontal order. The matmul, attention and norm kernels all use it, so
// batched prefill and token-by-token decode produce the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace sluice::cpu {

// The element type a weight dtype is stored as: f32 -> float, bf16 and f16 -> uint16_t.
template <DType T>
using elem_t = std::conditional_t<T == DType::f32, float, uint16_t>;

// Eight consecutive elements of a weight row converted to f32 (exact for every dtype:
// bf16 by a 16-bit shift, f16 by F16C). p need not be aligned.
template <DType T>
inline __m256 load8(const elem_t<T>* p) {
  if constexpr (T == DType::f32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (T == DType::bf16) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    static_assert(T == DType::f16);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// The first `count` (0 < count < 8) elements at p, zero-padded to eight; never reads past
// p + count.
template <DType T>
inline __m256 load8_tail(const elem_t<T>* p, int64_t count) {
  alignas(32) elem_t<T> buf[8] = {};
  std::memcpy(buf, p, static_cast<size_t>(count) * sizeof(elem_t<T>));
  return load8<T>(buf);
}

// Stores the first `count` (0 < count < 8) lanes of v at p; never writes past p + count.
inline void store8_tail(float* p, __m256 v, int64_t count) {
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(count) * sizeof(float));
}

// Sum of the eight lanes in one fixed order: ((0+4)+(2+6)) + ((1+5)+(3+7)).
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Maximum of the eight lanes (order-free: max is exact).
inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The canonical f32 dot product of a[0, k) (f32) and b[0, k) (any weight dtype); see the
// reproducibility rule above. Every matmul tile computes exactly this per output element.
template <DType T>
inline float dot(const float* a, const elem_t<T>* b, int64_t k) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8<T>(b + i), acc);
  if (i < k) acc = _mm256_fmadd_ps(load8_tail<DType::f32>(a + i, k - i), load8_tail<T>(b + i, k - i), acc);
  return hsum8(acc);
}

// out[r] = dot(a, b + r * ldb, k) for r < 4, bit for bit, with four independent accumulator
// chains so the FMA latency is hidden (attention scores: one query against four keys); b of
// any weight dtype, as dot.
template <DType T = DType::f32>
inline void dot4(const float* a, const elem_t<T>* b, int64_t ldb, int64_t k, float* out) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 av = _mm256_loadu_ps(a + i);
    acc0 = _mm256_fmadd_ps(av, load8<T>(b + i), acc0);
    acc1 = _mm256_fmadd_ps(av, load8<T>(b + ldb + i), acc1);
    acc2 = _mm256_fmadd_ps(av, load8<T>(b + 2 * ldb + i), acc2);
    acc3 = _mm256_fmadd_ps(av, load8<T>(b + 3 * ldb + i), acc3);
  }
  if (i < k) {
    __m256 av = load8_tail<DType::f32>(a + i, k - i);
    acc0 = _mm256_fmadd_ps(av, load8_tail<T>(b + i, k - i), acc0);
    acc1 = _mm256_fmadd_ps(av, load8_tail<T>(b + ldb + i, k - i), acc1);
    acc2 = _mm256_fmadd_ps(av, load8_tail<T>(b + 2 * ldb + i, k - i), acc2);
    acc3 = _mm256_fmadd_ps(av, load8_tail<T>(b + 3 * ldb + i, k - i), acc3);
  }
  out[0] = hsum8(acc0);
  out[1] = hsum8(acc1);
  out[2] = hsum8(acc2);
  out[3] = hsum8(acc3);
}

// e^x for eight lanes (Cephes expf: range reduction by ln 2 in two parts, degree-6
// polynomial), relative error about 2 ulp. Results below the smallest subnormal are 0,
// above FLT_MAX +inf, NaN stays NaN. Used wherever a kernel needs exp, so every lane,
// including the padded tail of a row, computes the same function.
inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228391f);   // ln(FLT_MAX)
  const __m256 lo = _mm256_set1_ps(-103.972077f);  // ln(smallest subnormal / 2)
  __m256 too_small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 too_big = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // operand order keeps NaN
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n with n in [-150, 128] as 2^n1 * 2^n2 (both normal), so the ends neither wrap the
  // exponent field nor lose subnormal results.
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1);
  __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), too_small);
  return _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), too_big);
}

// Converts count elements of a weight row to f32 (exact).
template <DType T>
inline void convert_row(const elem_t<T>* src, float* dst, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, load8<T>(src + i));
  if (i < count) store8_tail(dst + i, load8_tail<T>(src + i, count - i), count - i);
}

}  // namespace sluice::cpu
