// Matrix-vector products for decode and small batches: y[n, m] = x[n, k] . w[m, k]^T for
// n <= kMatvecMaxRows, every weight type (row_dot.cuh). One warp per 1 to 4 weight rows, or
// several warps per row splitting k (launch_t, launch_rows: by m and n), 8 warps per block;
// each lane streams the rows in 16-byte loads and applies each loaded chunk to all n
// activation rows, so every weight byte is read once. Rows that are not
// 16-byte aligned (odd k) take the scalar path of row_dot.cuh.
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_row.cuh"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 8;

// A block's kWarps warps form kWarps / KS groups of KS warps; a group computes weight rows
// j0 .. j0 + NW - 1 (rows past m read row m - 1 and store nothing), its warps splitting k
// (small m: enough blocks to fill the GPU); the KS partial sums are added in warp order.
template <WType T, int NX, int NW, int KS, bool RESID>
__global__ void matvec_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w,
                              const uint8_t* __restrict__ scales, float* __restrict__ y, int64_t m, int64_t k,
                              int64_t row_bytes, int64_t scale_row_bytes, bool vec, MatvecResidualNorm rn) {
  static_assert(!RESID || NX == 1, "a residual norm takes one activation row");
  chained_kernel_entry();
  __shared__ float part[kWarps][NX * NW];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / KS, ks = warp % KS;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / KS) + group) * NW;
  const bool live = j0 < m;
  const uint8_t* wr[NW];
  const uint8_t* sr[NW];
#pragma unroll
  for (int r = 0; r < NW; ++r) {
    const int64_t j = j0 + r < m ? j0 + r : m - 1;
    wr[r] = w + j * row_bytes;
    sr[r] = scales ? scales + j * scale_row_bytes : nullptr;
  }
  float acc[NX][NW];
#pragma unroll
  for (int i = 0; i < NX; ++i)
#pragma unroll
    for (int r = 0; r < NW; ++r) acc[i][r] = 0.0f;
  if (live) rows_dot_partial<T, NX, NW>(wr, sr, x, k, k, vec, lane, acc, ks, KS);
#pragma unroll
  for (int i = 0; i < NX; ++i)
#pragma unroll
    for (int r = 0; r < NW; ++r) {
      const float s = warp_sum(acc[i][r]);
      if (KS == 1) {
        if (live && lane == 0 && j0 + r < m) {
          if constexpr (RESID) y[j0 + r] += s;
          else y[i * m + j0 + r] = s;
        }
      } else if (lane == 0) {
        part[warp][i * NW + r] = s;
      }
    }
  if constexpr (KS > 1) {
    __syncthreads();
    if (live && ks == 0 && lane < NX * NW) {
      const int i = lane / NW, r = lane % NW;
      float s = 0.0f;
      for (int q = 0; q < KS; ++q) s += part[warp + q][lane];
      if (j0 + r < m) {
        if constexpr (RESID) y[j0 + r] += s;
        else y[i * m + j0 + r] = s;
      }
    }
  }
  if constexpr (RESID) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(rn.counter, 1) == static_cast<int>(gridDim.x) - 1;
      if (last) *rn.counter = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    switch (rn.norm_type) {
      case WType::f16: rms_norm_row_vec<WType::f16, true>(y, nullptr, rn.norm_w, rn.h, m, rn.eps); break;
      case WType::bf16: rms_norm_row_vec<WType::bf16, true>(y, nullptr, rn.norm_w, rn.h, m, rn.eps); break;
      default: rms_norm_row_vec<WType::f32, true>(y, nullptr, rn.norm_w, rn.h, m, rn.eps); break;
    }
  }
}

template <WType T, int NX, int NW, int KS, bool RESID = false>
void launch_nx(const float* x, const void* w, const void* scales, float* y, int64_t m, int64_t k, int64_t rb,
               int64_t sb, bool vec, cudaStream_t st, const MatvecResidualNorm& rn = {}) {
  static_assert(kWarps * 32 == kNormThreads, "the last block norms the row with all its threads");
  const dim3 grid(blocks_for(m, (kWarps / KS) * NW));
  launch_chained(matvec_kernel<T, NX, NW, KS, RESID>, grid, dim3(kWarps * 32), 0, st, x, static_cast<const uint8_t*>(w),
                 static_cast<const uint8_t*>(scales), y, m, k, rb, sb, vec, rn);
}

// Batches of NX rows (a batch decode step): 2 weight rows a warp from 8192 rows (an output
// head), a row a warp below (q, k, v, o: twice the warps in flight; 2 a warp ran the o
// projection of 8 rows at 22 us on the H200, a third of the bandwidth), and below 1024 rows
// (k, v of few kv heads, routers) a row per 4 warps splitting k, so that enough blocks run.
template <WType T, int NX>
void launch_rows(const float* x, const void* w, const void* scales, float* y, int64_t m, int64_t k, int64_t rb,
                 int64_t sb, bool vec, cudaStream_t st) {
  if (m >= 8192) launch_nx<T, NX, 2, 1>(x, w, scales, y, m, k, rb, sb, vec, st);
  else if (m >= 1024) launch_nx<T, NX, 1, 1>(x, w, scales, y, m, k, rb, sb, vec, st);
  else launch_nx<T, NX, 1, 4>(x, w, scales, y, m, k, rb, sb, vec, st);
}

// Decode (n = 1): large m, 4 weight rows per warp; 1024..8191 rows (attention projections),
// a row per warp with 8 of its chunks in flight per lane (a warp per row fills the GPU with
// loads; a block per row, as below, spent each block's life on one round trip); fewer rows
// (routers, expert-sized matrices), one row per 8 warps splitting k, so that enough blocks run. Small batches: 2 rows per warp (registers hold n x 2 sums).
template <WType T>
void launch_t(const float* x, const void* w, const void* scales, float* y, int64_t n, int64_t m, int64_t k,
              int64_t rb, int64_t sb, bool vec, cudaStream_t st, const MatvecResidualNorm* rn) {
  if (rn) {  // n == 1
    if (m >= 8192) launch_nx<T, 1, 4, 1, true>(x, w, scales, y, m, k, rb, sb, vec, st, *rn);
    else if (m >= 1024) launch_nx<T, 1, 1, 1, true>(x, w, scales, y, m, k, rb, sb, vec, st, *rn);
    else launch_nx<T, 1, 1, 8, true>(x, w, scales, y, m, k, rb, sb, vec, st, *rn);
    return;
  }
  switch (n) {
    case 1:
      if (m >= 8192) launch_nx<T, 1, 4, 1>(x, w, scales, y, m, k, rb, sb, vec, st);
      else if (m >= 1024) launch_nx<T, 1, 1, 1>(x, w, scales, y, m, k, rb, sb, vec, st);
      else launch_nx<T, 1, 1, 8>(x, w, scales, y, m, k, rb, sb, vec, st);
      break;
    case 2: launch_rows<T, 2>(x, w, scales, y, m, k, rb, sb, vec, st); break;
    case 3: launch_rows<T, 3>(x, w, scales, y, m, k, rb, sb, vec, st); break;
    case 4: launch_rows<T, 4>(x, w, scales, y, m, k, rb, sb, vec, st); break;
    case 5: launch_rows<T, 5>(x, w, scales, y, m, k, rb, sb, vec, st); break;
    case 6: launch_rows<T, 6>(x, w, scales, y, m, k, rb, sb, vec, st); break;
    case 7: launch_rows<T, 7>(x, w, scales, y, m, k, rb, sb, vec, st); break;
    default: launch_rows<T, 8>(x, w, scales, y, m, k, rb, sb, vec, st); break;
  }
}

}  // namespace

namespace {

void launch_matvec_any(const MatmulParams& p, const MatvecResidualNorm* rn, Stream s) {
  const float* x = p.x;
  const void *w = p.w, *scales = p.scales;
  float* y = p.y;
  const int64_t n = p.n, m = p.m, k = p.k;
  SLUICE_CHECK(n >= 1 && n <= kMatvecMaxRows, Status::internal, "cuda matvec: ", n, " rows (1..", kMatvecMaxRows,
               ")");
  if (m == 0) return;
  const WType t = p.wtype;
  const int64_t rb = dot_row_bytes(t, k), sb = dot_scale_row_bytes(t, k);
  const bool vec = row_dot_vec_ok(t, w, k, x, k);
  auto st = static_cast<cudaStream_t>(s);
  switch (t) {
    case WType::f32: launch_t<WType::f32>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    case WType::f16: launch_t<WType::f16>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    case WType::bf16: launch_t<WType::bf16>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    case WType::q8: launch_t<WType::q8>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    case WType::q4: launch_t<WType::q4>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    case WType::q2: launch_t<WType::q2>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    case WType::mxfp4: launch_t<WType::mxfp4>(x, w, scales, y, n, m, k, rb, sb, vec, st, rn); break;
    default: fail(Status::internal, "cuda matvec: weight type ", static_cast<int>(t));
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_matvec(const MatmulParams& p, Stream s) { launch_matvec_any(p, nullptr, s); }

bool matvec_add_rms_norm_supported(int64_t n, int64_t m, const void* y, const void* h) {
  return n == 1 && m % 4 == 0 && m <= int64_t{kNormThreads} * 4 * kNormMaxVec &&
         ((reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(h)) & 15) == 0;
}

void launch_matvec_add_rms_norm(const MatmulParams& p, const MatvecResidualNorm& rn, Stream s) {
  SLUICE_CHECK(matvec_add_rms_norm_supported(p.n, p.m, p.y, rn.h) && rn.counter, Status::internal,
               "cuda matvec_add_rms_norm: ", p.n, " rows of ", p.m);
  launch_matvec_any(p, &rn, s);
}

}  // namespace sluice::cuda
