// CPU rms_norm_groups: RMSNorm over groups of a row (hyper-connection streams, PLE keys and
// queries), then one weight over the whole row. Each group is normalized exactly as
// rms_norm normalizes a row (norm.cpp): the canonical 8-lane sum of squares, then
// (x * (1 / sqrt(mean + eps))) * w.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

void CpuBackend::rms_norm_groups(const Tensor& x, const Tensor& w, float eps, int64_t group, const Tensor& y) {
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && x.numel() == y.numel() && x.cols() == y.cols() &&
                   group > 0 && x.cols() % group == 0 &&
                   (w.empty() || (w.dtype == DType::f32 && w.numel() == x.cols())),
               Status::internal, "cpu rms_norm_groups: x ", dtype_name(x.dtype), " ", x.shape_str(), ", w ",
               dtype_name(w.dtype), " ", w.shape_str(), ", group ", group, ", y ", dtype_name(y.dtype), " ",
               y.shape_str(), " (want f32 x, y [rows, c] with c % group == 0, w f32 [c] or empty)");
  const int64_t rows = cpu::lead_rows(x), c = x.cols(), n_group = c / std::max<int64_t>(1, group);
  if (rows == 0 || c == 0) return;
  const float* xp = x.ptr<float>();
  const float* wp = w.empty() ? nullptr : w.ptr<float>();
  float* yp = y.ptr<float>();
  pool().parallel_for(rows * n_group, std::max<int64_t>(1, 16384 / group), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t off = u * group, col = (u % n_group) * group;
      const float* xr = xp + off;
      float* yr = yp + off;
      float mean = cpu::dot<DType::f32>(xr, xr, group) / static_cast<float>(group);
      const float r = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < group; ++i) {
        float v = xr[i] * r;
        yr[i] = wp ? v * wp[col + i] : v;
      }
    }
  });
}

}  // namespace sluice
