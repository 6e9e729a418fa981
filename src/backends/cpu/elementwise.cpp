// CPU elementwise ops: swiglu, swiglu_clamped, add, add_bias. Every element is computed by the same 8-lane
// code (a row's last partial block is zero-padded, never a scalar fallback), so an element's
// result does not depend on where it sits.
#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

constexpr int64_t kMinChunkElems = 16384;  // below this a thread wake-up costs more than the work

// silu(g) * u = (g / (1 + exp(-g))) * u on eight lanes.
inline __m256 swiglu8(__m256 g, __m256 u) {
  __m256 e = cpu::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// gpt-oss's clamped SwiGLU on eight lanes (Backend::swiglu_clamped): min/max take the clamp
// bound as their first operand, so a NaN (the second) passes through.
inline __m256 swiglu_clamped8(__m256 g, __m256 u, __m256 alpha, __m256 limit) {
  g = _mm256_min_ps(limit, g);
  u = _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), limit), _mm256_min_ps(limit, u));
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 e = cpu::exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(g, alpha)));
  __m256 glu = _mm256_mul_ps(g, _mm256_div_ps(one, _mm256_add_ps(one, e)));
  return _mm256_mul_ps(_mm256_add_ps(u, one), glu);
}

// out[i] = f(gate[i], up[i]) for every element, eight lanes at a time (f: __m256 (g, u)).
template <typename F>
void gated_elementwise(ThreadPool& pool, const Tensor& gate, const Tensor& up, const Tensor& out, const char* what,
                       F&& f) {
  SLUICE_CHECK(gate.dtype == DType::f32 && up.dtype == DType::f32 && out.dtype == DType::f32 &&
                   gate.numel() == up.numel() && gate.numel() == out.numel(),
               Status::internal, "cpu ", what, ": gate ", dtype_name(gate.dtype), " ", gate.shape_str(), ", up ",
               dtype_name(up.dtype), " ", up.shape_str(), ", out ", dtype_name(out.dtype), " ", out.shape_str(),
               " (want f32, same number of elements)");
  const float* g = gate.ptr<float>();
  const float* u = up.ptr<float>();
  float* o = out.ptr<float>();
  int64_t blocks = (gate.numel() + 7) / 8, total = gate.numel();
  pool.parallel_for(blocks, kMinChunkElems / 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t i = b * 8, r = std::min<int64_t>(8, total - i);
      if (r == 8) {
        _mm256_storeu_ps(o + i, f(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
      } else {
        cpu::store8_tail(o + i, f(cpu::load8_tail<DType::f32>(g + i, r), cpu::load8_tail<DType::f32>(u + i, r)), r);
      }
    }
  });
}

}  // namespace

void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  gated_elementwise(pool(), gate, up, out, "swiglu", swiglu8);
}

void CpuBackend::swiglu_clamped(const Tensor& gate, const Tensor& up, const Tensor& out, float alpha, float limit) {
  const __m256 a = _mm256_set1_ps(alpha), l = _mm256_set1_ps(limit);
  gated_elementwise(pool(), gate, up, out, "swiglu_clamped",
                    [&](__m256 g, __m256 u) { return swiglu_clamped8(g, u, a, l); });
}

void CpuBackend::add(const Tensor& x, const Tensor& y) {
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && x.numel() == y.numel(), Status::internal,
               "cpu add: x ", dtype_name(x.dtype), " ", x.shape_str(), ", y ", dtype_name(y.dtype), " ",
               y.shape_str(), " (want f32, same number of elements)");
  float* xp = x.ptr<float>();
  const float* yp = y.ptr<float>();
  int64_t total = x.numel();
  pool().parallel_for(total, kMinChunkElems, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) xp[i] += yp[i];  // one rounding per element: any order is exact
  });
}

void CpuBackend::clamp(const Tensor& x, float lo, float hi) {
  SLUICE_CHECK(x.dtype == DType::f32, Status::internal, "cpu clamp: x ", dtype_name(x.dtype), " (want f32)");
  float* xp = x.ptr<float>();
  pool().parallel_for(x.numel(), kMinChunkElems, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) xp[i] = std::min(std::max(xp[i], lo), hi);
  });
}

void CpuBackend::add_bias(const Tensor& y, const Tensor& b) {
  SLUICE_CHECK(y.dtype == DType::f32 && cpu::is_weight_dtype(b.dtype) && b.numel() == y.cols(),
               Status::internal, "cpu add_bias: y ", dtype_name(y.dtype), " ", y.shape_str(), ", b ",
               dtype_name(b.dtype), " ", b.shape_str(), " (want y f32 [rows, c], b f32/bf16/f16 [c])");
  int64_t rows = cpu::lead_rows(y), c = y.cols();
  if (rows == 0 || c == 0) return;
  float* yp = y.ptr<float>();
  cpu::dispatch_weight(b.dtype, [&]<DType T>() {
    const auto* bp = static_cast<const cpu::elem_t<T>*>(b.data);
    pool().parallel_for(rows, std::max<int64_t>(1, kMinChunkElems / c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* yr = yp + r * c;
        int64_t i = 0;
        for (; i + 8 <= c; i += 8)
          _mm256_storeu_ps(yr + i, _mm256_add_ps(_mm256_loadu_ps(yr + i), cpu::load8<T>(bp + i)));
        if (i < c)
          cpu::store8_tail(yr + i, _mm256_add_ps(cpu::load8_tail<DType::f32>(yr + i, c - i), cpu::load8_tail<T>(bp + i, c - i)), c - i);
      }
    });
  });
}

}  // namespace sluice
