// CPU hyper-connection and PLE ops: hyper_mix (the input mixer of a gated residual),
// hyper_inject (a block's output added to every stream with its weight), ple_gate (PLE's
// per-stream gate on the n-gram value). Written as transformers' qwen4_exp evaluates them:
// products rounded on their own, sums over streams in stream order, then the division.
#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void CpuBackend::hyper_mix(const Tensor& xn, const Tensor& logits, const Tensor& out) {
  const int64_t n = cpu::lead_rows(out), c = out.cols();
  const int64_t n_stream = c ? xn.cols() / c : 0;
  SLUICE_CHECK(xn.dtype == DType::f32 && logits.dtype == DType::f32 && out.dtype == DType::f32 && c > 0 &&
                   n_stream > 0 && xn.cols() == n_stream * c && cpu::lead_rows(xn) == n &&
                   logits.numel() == xn.numel() && !cpu::overlaps(out, xn) && !cpu::overlaps(out, logits),
               Status::internal, "cpu hyper_mix: xn ", xn.shape_str(), ", logits ", logits.shape_str(), ", out ",
               out.shape_str(), " (want f32 xn, logits [n, n_stream * c], out [n, c])");
  const float* xp = xn.ptr<float>();
  const float* lp = logits.ptr<float>();
  float* op = out.ptr<float>();
  const float div = static_cast<float>(n_stream);
  pool().parallel_for(n, std::max<int64_t>(1, 16384 / xn.cols()), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * n_stream * c;
      const float* lr = lp + r * n_stream * c;
      for (int64_t i = 0; i < c; ++i) {
        float acc = sigmoid(lr[i]) * xr[i];
        for (int64_t s = 1; s < n_stream; ++s) {
          const float p = sigmoid(lr[s * c + i]) * xr[s * c + i];
          acc += p;
        }
        op[r * c + i] = acc / div;
      }
    }
  });
}

void CpuBackend::hyper_inject(const Tensor& x, const Tensor& y, const Tensor& w) {
  const int64_t n = cpu::lead_rows(y), c = y.cols(), n_stream = w.cols();
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && w.dtype == DType::f32 && c > 0 && n_stream > 0 &&
                   x.cols() == n_stream * c && cpu::lead_rows(x) == n && cpu::lead_rows(w) == n &&
                   !cpu::overlaps(x, y) && !cpu::overlaps(x, w),
               Status::internal, "cpu hyper_inject: x ", x.shape_str(), ", y ", y.shape_str(), ", w ", w.shape_str(),
               " (want f32 x [n, n_stream * c], y [n, c], w [n, n_stream])");
  float* xp = x.ptr<float>();
  const float* yp = y.ptr<float>();
  const float* wp = w.ptr<float>();
  pool().parallel_for(n, std::max<int64_t>(1, 16384 / x.cols()), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t s = 0; s < n_stream; ++s) {
        const float ws = wp[r * n_stream + s];
        float* xs = xp + (r * n_stream + s) * c;
        for (int64_t i = 0; i < c; ++i) {
          const float p = yp[r * c + i] * ws;
          xs[i] += p;
        }
      }
  });
}

void CpuBackend::ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, const Tensor& out) {
  const int64_t n = cpu::lead_rows(value), c = value.cols();
  const int64_t n_stream = c ? key.cols() / c : 0;
  SLUICE_CHECK(key.dtype == DType::f32 && query.dtype == DType::f32 && value.dtype == DType::f32 &&
                   out.dtype == DType::f32 && c > 0 && n_stream > 0 && key.cols() == n_stream * c &&
                   cpu::lead_rows(key) == n && query.numel() == key.numel() && out.numel() == key.numel() &&
                   !cpu::overlaps(out, key) && !cpu::overlaps(out, query) && !cpu::overlaps(out, value),
               Status::internal, "cpu ple_gate: key ", key.shape_str(), ", query ", query.shape_str(), ", value ",
               value.shape_str(), ", out ", out.shape_str(),
               " (want f32 key, query, out [n, n_stream * c], value [n, c])");
  const float* kp = key.ptr<float>();
  const float* qp = query.ptr<float>();
  const float* vp = value.ptr<float>();
  float* op = out.ptr<float>();
  const float sqrt_c = static_cast<float>(std::sqrt(static_cast<double>(c)));
  pool().parallel_for(n * n_stream, std::max<int64_t>(1, 16384 / c), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t r = u / n_stream;
      float a = cpu::dot<DType::f32>(kp + u * c, qp + u * c, c) / sqrt_c;
      const float sign = a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f);
      a = std::sqrt(std::max(std::fabs(a), 1e-6f)) * sign;
      const float gate = sigmoid(a);
      for (int64_t i = 0; i < c; ++i) op[u * c + i] = gate * vp[r * c + i];
    }
  });
}

}  // namespace sluice
