// CPU matmul with quantized weights (q8, q4, q2, mxfp4; layouts in core/quant.h):
// y[n, m] = x[n, k] . dequantize(w)[m, k]^T.
//
// Each task dequantizes a block of weight rows into f32 once (dequantize_row, the same
// function the tests and the reference use, so the weights are bit for bit what the layout
// defines) and reuses it for every row of x in NX x NW register tiles. Every output element
// is cpu::dot(x row, dequantized w row, k) bit for bit: one 8-lane FMA accumulator over k in
// blocks of 8, the zero-padded tail block, hsum8 (simd.h). So the result depends neither on
// n, nor the thread count, nor the block a row falls in, and a checkpoint whose weights are
// the dequantized values gives exactly the same logits through the f32 matmul.
#include <algorithm>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"
#include "core/quant.h"

namespace sluice::cpu {
namespace {

// y[i * ldy + j] = dot(x[i * ldx, +k), w[j * k, +k)) for i < NX, j < NW (w is f32).
template <int NX, int NW>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t k, float* y, int64_t ldy) {
  __m256 acc[NX][NW];
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 wv[NW];
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) wv[j] = _mm256_loadu_ps(w + j * k + kk);
#pragma GCC unroll 16
    for (int i = 0; i < NX; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + kk);
#pragma GCC unroll 16
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < k) {  // the zero-padded last block, exactly as cpu::dot does it
    const int64_t r = k - kk;
    __m256 wv[NW];
    for (int j = 0; j < NW; ++j) wv[j] = load8_tail<DType::f32>(w + j * k + kk, r);
    for (int i = 0; i < NX; ++i) {
      __m256 xv = load8_tail<DType::f32>(x + i * ldx + kk, r);
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = hsum8(acc[i][j]);
}

template <int NW>
inline void tile_rows(int64_t nx, const float* x, int64_t ldx, const float* w, int64_t k, float* y, int64_t ldy) {
  switch (nx) {
    case 1: tile<1, NW>(x, ldx, w, k, y, ldy); break;
    case 2: tile<2, NW>(x, ldx, w, k, y, ldy); break;
    case 3: tile<3, NW>(x, ldx, w, k, y, ldy); break;
    case 4: tile<4, NW>(x, ldx, w, k, y, ldy); break;
    default: SLUICE_ASSERT(nx >= 1 && nx <= 4);
  }
}

// Tile shape: 4 x 3 = 12 accumulators + 3 weight vectors + 1 x vector = the 16 ymm registers.
constexpr int kNx = 4;
constexpr int kNw = 3;
constexpr int64_t kRowsPerTask = 64;  // rows of x per task: a weight block is dequantized once per 64 rows

}  // namespace

void matmul_quantized(const Tensor& x, const Tensor& w, const Tensor& y, ThreadPool& pool) {
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && w.ndim == 2 && dtype_is_quantized(w.dtype) &&
                   x.ndim >= 1 && y.ndim >= 1 && x.cols() == w.shape[1] && y.cols() == w.shape[0] &&
                   lead_rows(x) == lead_rows(y) && (w.numel() == 0 || (w.data && w.scales)),
               Status::internal, "cpu matmul: x ", dtype_name(x.dtype), " ", x.shape_str(), ", w ",
               dtype_name(w.dtype), " ", w.shape_str(), w.scales ? "" : " (no scales)", ", y ",
               dtype_name(y.dtype), " ", y.shape_str(), " (want x f32 [n, k], w q8/q4/q2/mxfp4 [m, k], y f32 [n, m])");
  SLUICE_CHECK(!overlaps(x, y), Status::internal, "cpu matmul: y ", y.shape_str(), " aliases x ", x.shape_str());
  const int64_t n = lead_rows(x), k = x.cols(), m = w.shape[0];
  if (n == 0 || m == 0) return;
  const DType dt = w.dtype;
  const int64_t row_bytes = quant_row_bytes(dt, k), scale_bytes = quant_scale_row_bytes(dt, k);
  const auto* wq = static_cast<const uint8_t*>(w.data);
  const auto* ws = static_cast<const uint8_t*>(w.scales);
  const float* xp = x.ptr<float>();
  float* yp = y.ptr<float>();

  // Weight rows per block: what fits 128 KiB of f32 (stays in L2 while x streams past),
  // a multiple of the tile width, 3..96 rows; smaller blocks when that leaves threads idle.
  int64_t mb = std::clamp<int64_t>((128 * 1024) / std::max<int64_t>(1, 4 * k), 1, 32) * kNw;
  const int64_t n_blocks = (n + kRowsPerTask - 1) / kRowsPerTask;
  while (mb > kNw && ((m + mb - 1) / mb) * n_blocks < 4 * pool.size()) mb = std::max<int64_t>(kNw, mb / 2 / kNw * kNw);
  const int64_t m_blocks = (m + mb - 1) / mb;

  pool.parallel_for(m_blocks * n_blocks, 1, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<float[]> wbuf(new float[static_cast<size_t>(mb * k)]);
    int64_t held = -1;  // column block dequantized in wbuf
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t cb = t / n_blocks, rb = t % n_blocks;
      const int64_t j_begin = cb * mb, j_end = std::min(m, j_begin + mb);
      const int64_t i_begin = rb * kRowsPerTask, i_end = std::min(n, i_begin + kRowsPerTask);
      if (held != cb) {
        for (int64_t j = j_begin; j < j_end; ++j)
          dequantize_row(dt, wq + j * row_bytes, ws + j * scale_bytes, k, wbuf.get() + (j - j_begin) * k);
        held = cb;
      }
      const float* wf = wbuf.get();
      for (int64_t i = i_begin; i < i_end; i += kNx) {
        const int64_t nx = std::min<int64_t>(kNx, i_end - i);
        const float* xi = xp + i * k;
        float* yi = yp + i * m;
        int64_t j = j_begin;
        for (; j + kNw <= j_end; j += kNw) tile_rows<kNw>(nx, xi, k, wf + (j - j_begin) * k, k, yi + j, m);
        for (; j < j_end; ++j) tile_rows<1>(nx, xi, k, wf + (j - j_begin) * k, k, yi + j, m);
      }
    }
  });
}

}  // namespace sluice::cpu
