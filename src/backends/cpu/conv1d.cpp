// CPU causal_conv1d: the depthwise causal convolution of the Gated DeltaNet (kernel 4,
// dilation 1) and of PLE (dilated by the n-gram size), with the state a decode step carries.
// Per output element the K taps are accumulated in tap order, acc = fma(w[ch, j], x, acc)
// from +0, then SiLU = acc / (1 + e^-acc) (cpu::exp8); nothing depends on n or threading, so a
// prefill and token-by-token decode give the same bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

void CpuBackend::causal_conv1d(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& out,
                               int64_t dilation, bool silu) {
  const int64_t n = cpu::lead_rows(x), c = x.cols(), K = w.cols();
  const int64_t S = (K - 1) * dilation;
  SLUICE_CHECK(x.dtype == DType::f32 && w.dtype == DType::f32 && state.dtype == DType::f32 &&
                   out.dtype == DType::f32 && dilation >= 1 && K >= 1 && cpu::lead_rows(w) == c &&
                   out.numel() == x.numel() && out.cols() == c && state.cols() == c && cpu::lead_rows(state) == S &&
                   !cpu::overlaps(x, out) && !cpu::overlaps(state, out),
               Status::internal, "cpu causal_conv1d: x ", x.shape_str(), ", w ", w.shape_str(), ", state ",
               state.shape_str(), ", out ", out.shape_str(), ", dilation ", dilation,
               " (want f32 x, out [n, c], w [c, K], state [(K - 1) * dilation, c], out not overlapping)");
  if (n == 0 || c == 0) return;
  const float* xp = x.ptr<float>();
  const float* wp = w.ptr<float>();
  float* sp = state.ptr<float>();
  float* op = out.ptr<float>();
  // Tap weights transposed to [K, c] so that a tap reads eight consecutive channels.
  std::vector<float> wt(static_cast<size_t>(K * c));
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t j = 0; j < K; ++j) wt[j * c + ch] = wp[ch * K + j];
  // Row u of xx = [state; x].
  auto row = [&](int64_t u) { return u < S ? sp + u * c : xp + (u - S) * c; };
  pool().parallel_for(n, std::max<int64_t>(1, 16384 / (c * K)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t ch = 0; ch < c; ch += 8) {
        const int64_t r = std::min<int64_t>(8, c - ch);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = 0; j < K; ++j) {
          const float* xr = row(S + t - (K - 1 - j) * dilation) + ch;
          const float* wr = wt.data() + j * c + ch;
          __m256 xv = r == 8 ? _mm256_loadu_ps(xr) : cpu::load8_tail<DType::f32>(xr, r);
          __m256 wv = r == 8 ? _mm256_loadu_ps(wr) : cpu::load8_tail<DType::f32>(wr, r);
          acc = _mm256_fmadd_ps(wv, xv, acc);
        }
        if (silu) {
          __m256 e = cpu::exp8(_mm256_sub_ps(_mm256_setzero_ps(), acc));
          acc = _mm256_div_ps(acc, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        }
        if (r == 8) _mm256_storeu_ps(op + t * c + ch, acc);
        else cpu::store8_tail(op + t * c + ch, acc, r);
      }
    }
  });
  // The new state: the last S rows of xx (after every output has read the old one).
  if (S == 0) return;
  const size_t row_bytes = static_cast<size_t>(c) * sizeof(float);
  if (n >= S) {
    std::memcpy(sp, xp + (n - S) * c, static_cast<size_t>(S) * row_bytes);
  } else {
    std::memmove(sp, sp + n * c, static_cast<size_t>(S - n) * row_bytes);
    std::memcpy(sp + (S - n) * c, xp, static_cast<size_t>(n) * row_bytes);
  }
}

}  // namespace sluice
