// CPU matmul: y[n, m] = x[n, k] . w[m, k]^T with f32 activations and f32/bf16/f16 weights.
//
// Every output element is cpu::dot(x row, w row, k) bit for bit (one 8-lane FMA accumulator
// over k in blocks of 8, zero-padded tail block, fixed horizontal sum; see simd.h), whatever
// n, the thread count or the path below, so prefill and decode agree exactly.
//
// Two paths; each computes a tile of outputs with one independent accumulator per output
// (enough chains to hide FMA latency):
//  - decode (n <= 4): memory-bound; each weight row is streamed from memory once, converted
//    to f32 in registers and used for all n rows of x (tile<>). Threads split the output
//    columns; each tile prefetches the weights of the tiles ahead of it.
//  - blocked (n > 4): compute-bound; each task converts a block of weight rows to f32 once,
//    packed into an L2-resident buffer, and reuses it for a block of x rows in 4 x 3 tiles
//    (kernel_4x3). Tasks are (column block, row block) pairs.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

namespace {

using cpu::elem_t;

// y[i * ldy + j] = dot(x[i * ldx, +k), w[j * ldw, +k)) for i < NX, j < NW.
// pf: memory to pull into L2 while this tile runs (weights at least a tile ahead: the rows
// are contiguous), swept linearly at NW * 8 weights per k step. Each weight row is only k
// elements long and the hardware prefetcher does not cross pages, so without this every row
// start waits on DRAM: measured here, 1.5x the cold bf16 decode bandwidth (an L1 or
// non-temporal hint gained nothing). Prefetches never fault, so any address is safe (kept
// as an integer: it may point past the weights).
template <DType T, int NX, int NW>
inline void tile(const float* x, int64_t ldx, const elem_t<T>* w, int64_t ldw, int64_t k,
                 float* y, int64_t ldy, uintptr_t pf = 0) {
  constexpr int64_t kPfStep = NW * 8 * static_cast<int64_t>(sizeof(elem_t<T>));
  __m256 acc[NX][NW];
#pragma GCC unroll 16
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    if (pf) {
#pragma GCC unroll 8
      for (int64_t b = 0; b < kPfStep; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + b), _MM_HINT_T1);
      pf += kPfStep;
    }
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

// Weight rows per decode tile for NX rows of x: at least 6 accumulators in flight, and the
// accumulators plus weight vectors within the 16 ymm registers (for n = 1, 8 rows spilled
// and ran at 60% of 6 rows' speed on cached bf16 weights).
template <int NX>
constexpr int decode_nw() { return NX == 1 ? 6 : NX == 2 ? 4 : NX == 3 ? 4 : 3; }

// How far ahead of a decode tile its prefetch runs, at least: DRAM latency times a core's
// share of the bandwidth, with margin (32 KiB at 30 GB/s is 1 us).
constexpr int64_t kPrefetchAheadBytes = 32 * 1024;

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
        const int64_t tile_bytes = NW * k * static_cast<int64_t>(sizeof(elem_t<T>));
        const uintptr_t pf = reinterpret_cast<uintptr_t>(w + j0 * k) + std::max(tile_bytes, kPrefetchAheadBytes);
        tile<T, NX, NW>(x, k, w + j0 * k, k, k, y + j0, m, pf);
      } else {
        for (int64_t j = j0; j < m; ++j) tile<T, NX, 1>(x, k, w + j * k, k, k, y + j, m);
      }
    }
  });
}

// ---- blocked path ----
// Operands are packed per task into zero-padded, interleaved panels so the micro-kernel has
// one sequential stream per operand and no tails: x as [k8][kBlockNx][8] per row tile, the
// weight block as [w tile][k8][kBlockNw][8] (k8 = ceil(k / 8) blocks of 8 along k). Padding
// rows and columns produce outputs that are never stored; the zero-padded last k block is
// exactly cpu::dot's padded tail. The k dimension is walked in chunks of kBlockKc blocks
// (the x panel chunk stays in L1 while the weight tiles stream from L2); the accumulators
// are parked in memory between chunks, which leaves their bits unchanged.
constexpr int kBlockNx = 4;    // x rows per tile
constexpr int kBlockNw = 3;    // weight rows per tile: 12 accumulators + 3 weights + 1 x = 16 ymm
constexpr int64_t kBlockKc = 64;  // k blocks of 8 per chunk: an 8 KiB x chunk, 6 KiB per weight tile
constexpr int64_t kBlockMb = 16 * kBlockNw;  // weight rows per task: 48 x k f32, in L2
constexpr int64_t kBlockNb = 16 * kBlockNx;  // x rows per task: the weight block is packed once per 64

// A per-thread scratch buffer of at least n floats, 64-byte aligned, kept between calls;
// null when the allocation fails (a pool task must not throw: the caller reports it).
float* scratch(int slot, size_t n) {
  struct Buf {
    float* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[3];  // 0: packed weights, 1: parked accumulators, 2: packed x (caller)
  Buf& b = bufs[slot];
  n = std::max<size_t>(n, 16);
  if (b.n < n) {
    std::free(b.p);
    b.n = (n + 15) / 16 * 16;
    b.p = static_cast<float*>(std::aligned_alloc(64, b.n * sizeof(float)));
    if (!b.p) b.n = 0;
  }
  return b.p;
}

// acc[i][j] over `steps` k blocks of the packed panels, starting from zero or from park
// (12 vectors), then either parked again or reduced into y (rows < nx, cols < nw stored).
inline void kernel_4x3(const float* xp, const float* wp, int64_t steps, bool first, bool last, float* park,
                       float* y, int64_t ldy, int64_t nx, int64_t nw) {
  __m256 a00, a01, a02, a10, a11, a12, a20, a21, a22, a30, a31, a32;
  if (first) {
    a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = a30 = a31 = a32 = _mm256_setzero_ps();
  } else {
    a00 = _mm256_load_ps(park + 0), a01 = _mm256_load_ps(park + 8), a02 = _mm256_load_ps(park + 16);
    a10 = _mm256_load_ps(park + 24), a11 = _mm256_load_ps(park + 32), a12 = _mm256_load_ps(park + 40);
    a20 = _mm256_load_ps(park + 48), a21 = _mm256_load_ps(park + 56), a22 = _mm256_load_ps(park + 64);
    a30 = _mm256_load_ps(park + 72), a31 = _mm256_load_ps(park + 80), a32 = _mm256_load_ps(park + 88);
  }
  for (int64_t s = 0; s < steps; ++s, xp += 32, wp += 24) {
    __m256 w0 = _mm256_load_ps(wp), w1 = _mm256_load_ps(wp + 8), w2 = _mm256_load_ps(wp + 16);
    __m256 x = _mm256_load_ps(xp);
    a00 = _mm256_fmadd_ps(x, w0, a00), a01 = _mm256_fmadd_ps(x, w1, a01), a02 = _mm256_fmadd_ps(x, w2, a02);
    x = _mm256_load_ps(xp + 8);
    a10 = _mm256_fmadd_ps(x, w0, a10), a11 = _mm256_fmadd_ps(x, w1, a11), a12 = _mm256_fmadd_ps(x, w2, a12);
    x = _mm256_load_ps(xp + 16);
    a20 = _mm256_fmadd_ps(x, w0, a20), a21 = _mm256_fmadd_ps(x, w1, a21), a22 = _mm256_fmadd_ps(x, w2, a22);
    x = _mm256_load_ps(xp + 24);
    a30 = _mm256_fmadd_ps(x, w0, a30), a31 = _mm256_fmadd_ps(x, w1, a31), a32 = _mm256_fmadd_ps(x, w2, a32);
  }
  if (!last) {
    _mm256_store_ps(park + 0, a00), _mm256_store_ps(park + 8, a01), _mm256_store_ps(park + 16, a02);
    _mm256_store_ps(park + 24, a10), _mm256_store_ps(park + 32, a11), _mm256_store_ps(park + 40, a12);
    _mm256_store_ps(park + 48, a20), _mm256_store_ps(park + 56, a21), _mm256_store_ps(park + 64, a22);
    _mm256_store_ps(park + 72, a30), _mm256_store_ps(park + 80, a31), _mm256_store_ps(park + 88, a32);
    return;
  }
  const __m256 acc[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
  for (int64_t i = 0; i < nx; ++i)
    for (int64_t j = 0; j < nw; ++j) y[i * ldy + j] = cpu::hsum8(acc[i][j]);
}

// Packs rows [0, rows) of src (row stride k, dtype T) as `width`-row interleaved panels
// [rows / width][k8][width][8] at dst, zero-padding k to 8 * k8 and rows to a multiple of width.
template <DType T>
void pack_panels(const elem_t<T>* src, int64_t rows, int64_t k, int width, float* dst) {
  const int64_t k8 = (k + 7) / 8;
  for (int64_t r0 = 0; r0 < rows; r0 += width) {
    float* panel = dst + r0 * k8 * 8;
    for (int r = 0; r < width; ++r) {
      if (r0 + r < rows) {
        const elem_t<T>* row = src + (r0 + r) * k;
        int64_t b = 0;
        for (; b < k / 8; ++b) {
          // The weight block is contiguous: pull the bytes 1 KiB ahead (across the row ends,
          // where the hardware prefetcher stops at the page boundary).
          if (b % (64 / (8 * sizeof(elem_t<T>))) == 0)
            _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row + b * 8) + 1024), _MM_HINT_T0);
          _mm256_store_ps(panel + (b * width + r) * 8, cpu::load8<T>(row + b * 8));
        }
        if (b < k8) _mm256_store_ps(panel + (b * width + r) * 8, cpu::load8_tail<T>(row + b * 8, k - b * 8));
      } else {
        for (int64_t b = 0; b < k8; ++b) _mm256_store_ps(panel + (b * width + r) * 8, _mm256_setzero_ps());
      }
    }
  }
}

template <DType T>
void matmul_blocked(const float* x, const elem_t<T>* w, float* y, int64_t n, int64_t m, int64_t k,
                    ThreadPool& pool) {
  const int64_t k8 = (k + 7) / 8;
  const int64_t n_tiles = (n + kBlockNx - 1) / kBlockNx;
  const int64_t m_blocks = (m + kBlockMb - 1) / kBlockMb, n_blocks = (n + kBlockNb - 1) / kBlockNb;
  const int64_t n_chunks = std::max<int64_t>(1, (k8 + kBlockKc - 1) / kBlockKc);
  const int64_t tile_floats = kBlockNx * k8 * 8;  // one packed x row tile
  const size_t wpack_floats = static_cast<size_t>(kBlockMb * k8 * 8);
  const size_t park_floats = static_cast<size_t>(kBlockMb / kBlockNw) * 96;

  // x is packed once per call, on the calling thread's scratch, shared by all tasks.
  float* xpack = scratch(2, static_cast<size_t>(n_tiles * tile_floats));
  SLUICE_CHECK(xpack != nullptr, Status::out_of_memory, "cpu matmul: ", n_tiles * tile_floats * 4,
               " bytes to pack x ", n, " x ", k);
  pool.parallel_for(n_tiles, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, tile_floats)), [&](int64_t i0, int64_t i1) {
    for (int64_t it = i0; it < i1; ++it)
      pack_panels<DType::f32>(x + it * kBlockNx * k, std::min<int64_t>(kBlockNx, n - it * kBlockNx), k, kBlockNx,
                              xpack + it * tile_floats);
  });

  std::atomic<bool> out_of_memory{false};
  pool.parallel_for(m_blocks * n_blocks, 1, [&](int64_t t0, int64_t t1) {
    float* wpack = scratch(0, wpack_floats);
    float* park = scratch(1, park_floats);  // [w tiles][12 accumulator vectors]
    if (!wpack || !park) {
      out_of_memory = true;
      return;
    }
    int64_t packed = -1;  // column block held in wpack
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t cb = t / n_blocks, rb = t % n_blocks;
      const int64_t j_begin = cb * kBlockMb, j_rows = std::min(m, j_begin + kBlockMb) - j_begin;
      const int64_t i_begin = rb * kBlockNb, i_end = std::min(n, i_begin + kBlockNb);
      const int64_t j_tiles = (j_rows + kBlockNw - 1) / kBlockNw;
      if (packed != cb) {
        pack_panels<T>(w + j_begin * k, j_rows, k, kBlockNw, wpack);
        packed = cb;
      }
      for (int64_t i = i_begin; i < i_end; i += kBlockNx) {
        const int64_t nx = std::min<int64_t>(kBlockNx, i_end - i);
        const float* xt = xpack + (i / kBlockNx) * tile_floats;
        for (int64_t c = 0; c < n_chunks; ++c) {
          const int64_t b0 = c * kBlockKc, steps = std::min(kBlockKc, k8 - b0);
          for (int64_t jt = 0; jt < j_tiles; ++jt) {
            const int64_t j = jt * kBlockNw;
            kernel_4x3(xt + b0 * kBlockNx * 8, wpack + (jt * k8 + b0) * kBlockNw * 8, steps, c == 0,
                       c == n_chunks - 1, park + jt * 96, y + i * m + j_begin + j, m, nx,
                       std::min<int64_t>(kBlockNw, j_rows - j));
          }
        }
      }
    }
  });
  SLUICE_CHECK(!out_of_memory, Status::out_of_memory, "cpu matmul: scratch of ", (wpack_floats + park_floats) * 4,
               " bytes per thread for k = ", k);
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
