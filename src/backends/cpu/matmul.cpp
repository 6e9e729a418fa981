// CPU matmul: y[n, m] = x[n, k] . w[m, k]^T with f32 activations and f32/bf16/f16 weights.
//
// Every output element is cpu::dot(x row, w row, k) bit for bit (one 8-lane FMA accumulator
// over k in blocks of 8, zero-padded tail block, fixed horizontal sum; see simd.h), whatever
// n, the thread count or the path below, so prefill and decode agree exactly.
//
// Two paths, both built from tile<>, which computes an NX x NW block of outputs with NX*NW
// independent accumulators (enough chains to hide FMA latency):
//  - decode (n <= 4): memory-bound; each weight row is streamed from memory once, converted
//    to f32 in registers and used for all n rows of x. Threads split the output columns.
//  - blocked (n > 4): compute-bound; each task converts a block of weight rows to f32 once
//    (into a buffer that stays in L2) and reuses it for a block of x rows in 4 x 3 tiles.
//    Tasks are (column block, row block) pairs.
#include <algorithm>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

using cpu::elem_t;

// y[i * ldy + j] = dot(x[i * ldx, +k), w[j * ldw, +k)) for i < NX, j < NW.
template <DType T, int NX, int NW>
inline void tile(const float* x, int64_t ldx, const elem_t<T>* w, int64_t ldw, int64_t k,
                 float* y, int64_t ldy) {
  __m256 acc[NX][NW];
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 wv[NW];
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) wv[j] = cpu::load8<T>(w + j * ldw + kk);
#pragma GCC unroll 16
    for (int i = 0; i < NX; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + kk);
#pragma GCC unroll 16
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < k) {  // the zero-padded last block, exactly as cpu::dot does it
    int64_t r = k - kk;
    __m256 wv[NW];
    for (int j = 0; j < NW; ++j) wv[j] = cpu::load8_tail<T>(w + j * ldw + kk, r);
    for (int i = 0; i < NX; ++i) {
      __m256 xv = cpu::load8_tail<DType::f32>(x + i * ldx + kk, r);
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = cpu::hsum8(acc[i][j]);
}

// tile<T, nx, NW> for a run-time nx in 1..4.
template <DType T, int NW>
inline void tile_rows(int64_t nx, const float* x, int64_t ldx, const elem_t<T>* w, int64_t ldw,
                      int64_t k, float* y, int64_t ldy) {
  switch (nx) {
    case 1: tile<T, 1, NW>(x, ldx, w, ldw, k, y, ldy); break;
    case 2: tile<T, 2, NW>(x, ldx, w, ldw, k, y, ldy); break;
    case 3: tile<T, 3, NW>(x, ldx, w, ldw, k, y, ldy); break;
    case 4: tile<T, 4, NW>(x, ldx, w, ldw, k, y, ldy); break;
    default: SLUICE_ASSERT(nx >= 1 && nx <= 4);
  }
}

// Weight rows per decode tile for NX rows of x: 8 accumulators or more in flight, with
// registers left for the weight vectors.
template <int NX>
constexpr int decode_nw() { return NX == 1 ? 8 : NX == 2 ? 4 : NX == 3 ? 4 : 3; }

// Smallest share of a weight matrix worth handing to a thread (bytes): below this the
// pool's wake-up costs more than the work.
constexpr int64_t kMinChunkBytes = 64 * 1024;

template <DType T, int NX>
void matmul_decode(const float* x, const elem_t<T>* w, float* y, int64_t m, int64_t k,
                   ThreadPool& pool) {
  constexpr int NW = decode_nw<NX>();
  int64_t groups = (m + NW - 1) / NW;
  int64_t group_bytes = std::max<int64_t>(1, NW * k * static_cast<int64_t>(sizeof(elem_t<T>)));
  pool.parallel_for(groups, std::max<int64_t>(1, kMinChunkBytes / group_bytes), [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      int64_t j0 = g * NW;
      if (j0 + NW <= m) {
        tile<T, NX, NW>(x, k, w + j0 * k, k, k, y + j0, m);
      } else {
        for (int64_t j = j0; j < m; ++j) tile<T, NX, 1>(x, k, w + j * k, k, k, y + j, m);
      }
    }
  });
}

// Blocked path tile shape: 4 x 3 = 12 accumulators + 3 weight vectors + 1 x vector = the 16
// ymm registers.
constexpr int kBlockNx = 4;
constexpr int kBlockNw = 3;

template <DType T>
void matmul_blocked(const float* x, const elem_t<T>* w, float* y, int64_t n, int64_t m, int64_t k,
                    ThreadPool& pool) {
  // Column block: as many weight rows as fit 256 KiB of f32 (stays in L2 while every row
  // block of x streams past it), a multiple of the tile width, 3..96 rows.
  int64_t mb = std::clamp<int64_t>((256 * 1024) / std::max<int64_t>(1, 4 * k), 1, 32) * kBlockNw;
  int64_t nb = 64;  // rows of x per task: the weight block is converted once per 64 rows
  int64_t m_blocks = (m + mb - 1) / mb, n_blocks = (n + nb - 1) / nb;
  pool.parallel_for(m_blocks * n_blocks, 1, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<float[]> wbuf;
    int64_t converted = -1;  // column block held in wbuf
    for (int64_t t = t0; t < t1; ++t) {
      int64_t cb = t / n_blocks, rb = t % n_blocks;
      int64_t j_begin = cb * mb, j_end = std::min(m, j_begin + mb);
      int64_t i_begin = rb * nb, i_end = std::min(n, i_begin + nb);
      const float* wf;
      if constexpr (T == DType::f32) {
        wf = w + j_begin * k;
      } else {
        if (!wbuf) wbuf.reset(new float[static_cast<size_t>(mb * k)]);
        if (converted != cb) {
          for (int64_t j = j_begin; j < j_end; ++j)
            cpu::convert_row<T>(w + j * k, wbuf.get() + (j - j_begin) * k, k);
          converted = cb;
        }
        wf = wbuf.get();
      }
      for (int64_t i = i_begin; i < i_end; i += kBlockNx) {
        int64_t nx = std::min<int64_t>(kBlockNx, i_end - i);
        const float* xi = x + i * k;
        float* yi = y + i * m;
        int64_t j = j_begin;
        for (; j + kBlockNw <= j_end; j += kBlockNw)
          tile_rows<DType::f32, kBlockNw>(nx, xi, k, wf + (j - j_begin) * k, k, k, yi + j, m);
        for (; j < j_end; ++j)
          tile_rows<DType::f32, 1>(nx, xi, k, wf + (j - j_begin) * k, k, k, yi + j, m);
      }
    }
  });
}

}  // namespace

void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& y) {
  if (dtype_is_quantized(w.dtype)) {
    cpu::matmul_quantized(x, w, y, pool());
    return;
  }
  SLUICE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && w.ndim == 2 &&
                   cpu::is_weight_dtype(w.dtype) && x.ndim >= 1 && y.ndim >= 1 &&
                   x.cols() == w.shape[1] && y.cols() == w.shape[0] &&
                   cpu::lead_rows(x) == cpu::lead_rows(y),
               Status::internal, "cpu matmul: x ", dtype_name(x.dtype), " ", x.shape_str(), ", w ",
               dtype_name(w.dtype), " ", w.shape_str(), ", y ", dtype_name(y.dtype), " ", y.shape_str(),
               " (want x f32 [n, k], w f32/bf16/f16 [m, k], y f32 [n, m])");
  SLUICE_CHECK(!cpu::overlaps(x, y), Status::internal, "cpu matmul: y ", y.shape_str(), " aliases x ",
               x.shape_str());
  int64_t n = cpu::lead_rows(x), k = x.cols(), m = w.shape[0];
  if (n == 0 || m == 0) return;
  const float* xp = x.ptr<float>();
  float* yp = y.ptr<float>();
  ThreadPool& tp = pool();
  cpu::dispatch_weight(w.dtype, [&]<DType T>() {
    const elem_t<T>* wp = static_cast<const elem_t<T>*>(w.data);
    switch (n) {
      case 1: matmul_decode<T, 1>(xp, wp, yp, m, k, tp); break;
      case 2: matmul_decode<T, 2>(xp, wp, yp, m, k, tp); break;
      case 3: matmul_decode<T, 3>(xp, wp, yp, m, k, tp); break;
      case 4: matmul_decode<T, 4>(xp, wp, yp, m, k, tp); break;
      default: matmul_blocked<T>(xp, wp, yp, n, m, k, tp); break;
    }
  });
}

}  // namespace sluice
