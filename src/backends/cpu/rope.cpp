// CPU rope: rotary position embedding in place on x[n, n_head, head_dim]. Each pair (a, b)
// of the first rot_dim dims of a head, with angle index i in [0, rot_dim / 2), becomes
//   a' = a * cos[t, i] - b * sin[t, i],  b' = b * cos[t, i] + a * sin[t, i].
// Neox layout pairs dim i with i + rot_dim / 2; GPT-J layout pairs 2i with 2i + 1. Dims
// from rot_dim on are untouched. The rounding is spelled out so another backend can reproduce
// it exactly: a' = fma(a, cos, -(b * sin)), b' = fma(b, cos, a * sin). (Written with explicit
// FMAs because g++ in C++ mode contracts a separate multiply and add on its own.)
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

// a' = fma(a, c, -(b * s)) and b' = fma(b, c, a * s) on eight pairs.
inline void rotate8(__m256& a, __m256& b, __m256 c, __m256 s) {
  __m256 a2 = _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s));
  __m256 b2 = _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s));
  a = a2;
  b = b2;
}

void rope_neox(float* x, const float* cs, const float* sn, int64_t half) {
  float* xa = x;
  float* xb = x + half;
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    __m256 a = _mm256_loadu_ps(xa + i), b = _mm256_loadu_ps(xb + i);
    rotate8(a, b, _mm256_loadu_ps(cs + i), _mm256_loadu_ps(sn + i));
    _mm256_storeu_ps(xa + i, a);
    _mm256_storeu_ps(xb + i, b);
  }
  if (i < half) {
    int64_t r = half - i;
    __m256 a = cpu::load8_tail<DType::f32>(xa + i, r), b = cpu::load8_tail<DType::f32>(xb + i, r);
    rotate8(a, b, cpu::load8_tail<DType::f32>(cs + i, r), cpu::load8_tail<DType::f32>(sn + i, r));
    cpu::store8_tail(xa + i, a, r);
    cpu::store8_tail(xb + i, b, r);
  }
}

void rope_gptj(float* x, const float* cs, const float* sn, int64_t half) {
  // Scalar (the pairs are interleaved; the rotation is cheap next to attention), same
  // rounding as rotate8.
  for (int64_t i = 0; i < half; ++i) {
    float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = std::fma(a, cs[i], -(b * sn[i]));
    x[2 * i + 1] = std::fma(b, cs[i], a * sn[i]);
  }
}

}  // namespace

void CpuBackend::rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim,
                      bool interleaved) {
  SLUICE_CHECK(x.dtype == DType::f32 && x.ndim == 3 && cos.dtype == DType::f32 &&
                   sin.dtype == DType::f32 && rot_dim >= 0 && rot_dim % 2 == 0 && rot_dim <= x.shape[2] &&
                   cos.numel() == x.shape[0] * (rot_dim / 2) && sin.numel() == cos.numel(),
               Status::internal, "cpu rope: x ", dtype_name(x.dtype), " ", x.shape_str(), ", cos ",
               cos.shape_str(), ", sin ", sin.shape_str(), ", rot_dim ", rot_dim,
               " (want x f32 [n, n_head, head_dim], cos and sin f32 [n, rot_dim / 2], rot_dim even <= head_dim)");
  int64_t n = x.shape[0], n_head = x.shape[1], head_dim = x.shape[2], half = rot_dim / 2;
  if (n == 0 || n_head == 0 || half == 0) return;
  float* xp = x.ptr<float>();
  const float* cp = cos.ptr<float>();
  const float* sp = sin.ptr<float>();
  int64_t units = n * n_head;  // (token, head) pairs
  pool().parallel_for(units, std::max<int64_t>(1, 16384 / rot_dim), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t t = u / n_head;
      float* xh = xp + u * head_dim;
      if (interleaved) rope_gptj(xh, cp + t * half, sp + t * half, half);
      else rope_neox(xh, cp + t * half, sp + t * half, half);
    }
  });
}

}  // namespace sluice
