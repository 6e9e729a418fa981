// CPU activate and mul: the gates of the hybrid families (attention output gate, gated
// RMSNorm, shared-expert gate, hyper-connection weights). Every element goes through the same
// 8-lane code (the tail of a tensor is zero-padded, never a scalar fallback), so a value's
// result does not depend on where it sits.
#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

constexpr int64_t kMinChunkElems = 16384;  // below this a thread wake-up costs more than the work

// act(x / div) * mul on eight lanes; the division and the multiply are skipped when 1 (exact
// either way). sigmoid = 1 / (1 + e^-x), silu = x / (1 + e^-x), as PyTorch's CPU kernels.
inline __m256 activate8(__m256 x, Activation act, float div, float mul) {
  if (div != 1.0f) x = _mm256_div_ps(x, _mm256_set1_ps(div));
  __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), cpu::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
  __m256 y = act == Activation::sigmoid ? _mm256_div_ps(_mm256_set1_ps(1.0f), den) : _mm256_div_ps(x, den);
  return mul != 1.0f ? _mm256_mul_ps(y, _mm256_set1_ps(mul)) : y;
}

}  // namespace

void CpuBackend::activate(const Tensor& x, Activation act, float in_div, float out_mul) {
  SLUICE_CHECK(x.dtype == DType::f32 && in_div != 0.0f, Status::internal, "cpu activate: x ", dtype_name(x.dtype),
               " ", x.shape_str(), ", in_div ", in_div, " (want f32, in_div != 0)");
  float* p = x.ptr<float>();
  const int64_t total = x.numel(), blocks = (total + 7) / 8;
  if (act == Activation::gelu_tanh || act == Activation::tanh) {
    // Scalar std::tanh (as PyTorch's f32 kernels evaluate these, to an ulp or two): Gemma 4's
    // MLP and expert gates and its logit softcap, not a hot path of the other families.
    pool().parallel_for(total, kMinChunkElems, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float v = p[i];
        if (in_div != 1.0f) v /= in_div;
        float y;
        if (act == Activation::tanh) {
          y = std::tanh(v);
        } else {
          constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2 / pi)
          y = 0.5f * v * (1.0f + std::tanh(kBeta * (v + kKappa * v * v * v)));
        }
        p[i] = out_mul != 1.0f ? y * out_mul : y;
      }
    });
    return;
  }
  pool().parallel_for(blocks, kMinChunkElems / 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t i = b * 8, r = std::min<int64_t>(8, total - i);
      if (r == 8) _mm256_storeu_ps(p + i, activate8(_mm256_loadu_ps(p + i), act, in_div, out_mul));
      else cpu::store8_tail(p + i, activate8(cpu::load8_tail<DType::f32>(p + i, r), act, in_div, out_mul), r);
    }
  });
}

void CpuBackend::mul(const Tensor& x, const Tensor& y) {
  const bool per_row = y.numel() != x.numel() && y.numel() == cpu::lead_rows(x) && y.cols() == 1;
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && (y.numel() == x.numel() || per_row) &&
                   (x.data == y.data || !cpu::overlaps(x, y)),
               Status::internal, "cpu mul: x ", dtype_name(x.dtype), " ", x.shape_str(), ", y ", dtype_name(y.dtype),
               " ", y.shape_str(), " (want f32, y of x's size or [x.rows(), 1])");
  float* xp = x.ptr<float>();
  const float* yp = y.ptr<float>();
  if (!per_row) {
    pool().parallel_for(x.numel(), kMinChunkElems, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) xp[i] *= yp[i];  // one rounding per element: any order is exact
    });
    return;
  }
  const int64_t c = x.cols();
  pool().parallel_for(cpu::lead_rows(x), std::max<int64_t>(1, kMinChunkElems / std::max<int64_t>(1, c)),
                      [&](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r)
                          for (int64_t i = 0; i < c; ++i) xp[r * c + i] *= yp[r];
                      });
}

}  // namespace sluice
