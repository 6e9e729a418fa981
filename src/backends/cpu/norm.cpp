// CPU rms_norm: y = (x * (1 / sqrt(mean(x^2) + eps))) * w per row, as PyTorch computes
// `weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))`. The sum of squares is
// the canonical 8-lane f32 accumulation of simd.h, so a row's result never depends on the
// number of rows or on threading.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

// One row: x[0, c) -> y[0, c); y may alias x (each block is read before it is written).
template <DType T>
void rms_norm_row(const float* x, const cpu::elem_t<T>* w, float eps, float* y, int64_t c) {
  float mean = cpu::dot<DType::f32>(x, x, c) / static_cast<float>(c);
  __m256 r = _mm256_set1_ps(1.0f / std::sqrt(mean + eps));
  int64_t i = 0;
  for (; i + 8 <= c; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), r);
    if (w) v = _mm256_mul_ps(v, cpu::load8<T>(w + i));
    _mm256_storeu_ps(y + i, v);
  }
  if (i < c) {
    __m256 v = _mm256_mul_ps(cpu::load8_tail<DType::f32>(x + i, c - i), r);
    if (w) v = _mm256_mul_ps(v, cpu::load8_tail<T>(w + i, c - i));
    cpu::store8_tail(y + i, v, c - i);
  }
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && x.numel() == y.numel() &&
                   x.cols() == y.cols() && (w.empty() || (cpu::is_weight_dtype(w.dtype) && w.numel() == x.cols())),
               Status::internal, "cpu rms_norm: x ", dtype_name(x.dtype), " ", x.shape_str(), ", w ",
               dtype_name(w.dtype), " ", w.shape_str(), ", y ", dtype_name(y.dtype), " ", y.shape_str(),
               " (want x, y f32 [rows, c], w f32/bf16/f16 [c] or empty)");
  int64_t rows = cpu::lead_rows(x), c = x.cols();
  if (rows == 0 || c == 0) return;
  const float* xp = x.ptr<float>();
  float* yp = y.ptr<float>();
  cpu::dispatch_weight(w.empty() ? DType::f32 : w.dtype, [&]<DType T>() {
    const auto* wp = static_cast<const cpu::elem_t<T>*>(w.data);  // null when empty: no scale
    pool().parallel_for(rows, std::max<int64_t>(1, 16384 / c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) rms_norm_row<T>(xp + r * c, wp, eps, yp + r * c, c);
    });
  });
}

}  // namespace sluice
