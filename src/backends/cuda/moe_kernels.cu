// The generic per-pair MoE expert kernels (moe_kernels.h): the routed experts of a batch read
// through an ExpertRef table with per-pair done flags (two-phase dispatch), and the combine
// that counts pairs never computed as zero. The router's top-k is in moe_router.cu, the
// grouped prefill kernels in moe_grouped.cu.
//
// Experts: three launches per phase.
//   1. gate/up: one warp per (pair, 2 ff rows): act[p, j] = silu(gate_j . h) * (up_j . h)
//               (with the entry's biases and activation: expert_gate_up, moe_common.cuh)
//   2. down:    one warp per (pair, 4 embd rows): pair_out[p, i] = down_i . act[p] (+ its bias)
//   3. mark:    done[p] = 1 for the pairs this phase computed
// Each launch tests the same condition (done[p] == 0 and the expert available), so the marks
// of launch 3 cannot change which pairs launches 1 and 2 compute. A pair's sums depend only
// on its row and its expert's weights. Launches 1 and 2 (and the fused down + combine) of
// bf16, int8, q4 and mxfp4 experts take the decode kernels of moe_decode.cu where the sizes allow:
// the same sums, bit for bit; the kernels here serve the other types, mixed types and odd
// sizes.
#include "backends/cuda/moe_kernels.h"

#include "backends/cuda/expert_copy.h"
#include "backends/cuda/kernels.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_common.cuh"
#include "backends/cuda/moe_decode.h"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

constexpr int kExpertWarps = 8;  // warps per expert block
constexpr int kGateRows = 2;     // ff rows per warp in gate/up (4 weight rows with up)
constexpr int kDownRows = 4;     // embd rows per warp in down
// A decode token's 8 pairs make 384 gate/up blocks of 256 threads; at 96 registers a thread 2
// blocks fit an SM (264 on an H200) and the last ones ran as a second wave. Compiled for 3 an
// SM (80 registers, no spills) they run in one; q2 and the mixed-type variant would spill
// there and keep 2. Down + combine: 8 rows a block, 256 blocks, one wave at 2 an SM (at most
// 128 registers; q4 spills 60 bytes); q2 and mixed would spill there and keep 4 rows and the
// compiler's choice of registers.
template <WType WT>
constexpr int gate_up_blocks_per_sm() {
  return WT == WType::q2 || WT == WType::unavailable ? 2 : 3;
}

// NW dots of one activation row: compiled for weight type WT, or (WT == WType::unavailable) switching on the
// expert's type at run time. The same sums either way.
template <WType WT, int NW>
__device__ __forceinline__ void expert_rows_dot(WType wtype, const uint8_t* const (&w)[NW], const uint8_t* const (&s)[NW],
                                                const float* __restrict__ x, int64_t k, bool vec, int lane,
                                                float (&out)[NW]) {
  if constexpr (WT == WType::unavailable) {
    rows_dot_any<NW>(wtype, w, s, x, k, vec, lane, out);
  } else {
    float acc[1][NW];
#pragma unroll
    for (int r = 0; r < NW; ++r) acc[0][r] = 0.0f;
    rows_dot_partial<WT, 1, NW>(w, s, x, 0, k, vec, lane, acc);
#pragma unroll
    for (int r = 0; r < NW; ++r) out[r] = warp_sum(acc[0][r]);
  }
}

// grid (n_pairs, ceil(n_ff / (kExpertWarps * kGateRows))); warp -> (pair, ff rows j0, j0 + 1):
// four rows (two of gate, two of up) share every activation chunk loaded.
template <WType WT>
__global__ void __launch_bounds__(kExpertWarps * 32, gate_up_blocks_per_sm<WT>()) moe_gate_up_kernel(const float* __restrict__ h, const int32_t* __restrict__ ids,
                                   const ExpertRef* __restrict__ table, const uint8_t* __restrict__ done,
                                   float* __restrict__ act, int64_t k, int64_t n_embd, int64_t n_ff) {
  chained_kernel_entry();
  const int64_t p = blockIdx.x;
  if (!pair_active(ids, table, done, p)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.y) * kExpertWarps + warp) * kGateRows;
  if (j0 >= n_ff) return;
  const ExpertRef& ref = table[ids[p]];
  const WType t = ref.wtype;
  const int64_t rb = dot_row_bytes(t, n_embd), sb = dot_scale_row_bytes(t, n_embd);
  const float* x = h + (p / k) * n_embd;
  const bool vec = row_dot_vec_ok(t, ref.data[0], n_embd, x, n_embd) && row_dot_vec_ok(t, ref.data[1], n_embd, x, n_embd);
  const uint8_t* w[2 * kGateRows];
  const uint8_t* sc[2 * kGateRows];
#pragma unroll
  for (int r = 0; r < kGateRows; ++r) {
    const int64_t j = j0 + r < n_ff ? j0 + r : n_ff - 1;
#pragma unroll
    for (int m = 0; m < 2; ++m) {  // gate, up
      w[2 * r + m] = static_cast<const uint8_t*>(ref.data[m]) + j * rb;
      sc[2 * r + m] = ref.scales[m] ? static_cast<const uint8_t*>(ref.scales[m]) + j * sb : nullptr;
    }
  }
  float y[2 * kGateRows];
  expert_rows_dot<WT, 2 * kGateRows>(ref.wtype, w, sc, x, n_embd, vec, lane, y);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kGateRows; ++r)
      if (j0 + r < n_ff) {
        act[p * n_ff + j0 + r] = expert_gate_up(ref, j0 + r, y[2 * r], y[2 * r + 1]);
      }
}

// The down rows i0 .. i0 + kDownRows - 1 of pair p's expert applied to act[p]: y[r].
// Per-row sums do not depend on DR (each row's chunks are summed in the same order).
template <WType WT, int DR>
__device__ __forceinline__ void down_rows(const ExpertRef& ref, const float* __restrict__ a, int64_t i0,
                                          int64_t n_embd, int64_t n_ff, int lane, float (&y)[DR]) {
  const WType t = ref.wtype;
  const int64_t rb = dot_row_bytes(t, n_ff), sb = dot_scale_row_bytes(t, n_ff);
  const bool vec = row_dot_vec_ok(t, ref.data[2], n_ff, a, n_ff);
  const uint8_t* w[DR];
  const uint8_t* sc[DR];
#pragma unroll
  for (int r = 0; r < DR; ++r) {
    const int64_t i = i0 + r < n_embd ? i0 + r : n_embd - 1;
    w[r] = static_cast<const uint8_t*>(ref.data[2]) + i * rb;
    sc[r] = ref.scales[2] ? static_cast<const uint8_t*>(ref.scales[2]) + i * sb : nullptr;
  }
  expert_rows_dot<WT, DR>(ref.wtype, w, sc, a, n_ff, vec, lane, y);
}

// grid (n_pairs, ceil(n_embd / (kExpertWarps * kDownRows))); warp -> (pair, embd rows i0..).
template <WType WT>
__global__ void moe_down_kernel(const int32_t* __restrict__ ids, const ExpertRef* __restrict__ table,
                                const uint8_t* __restrict__ done, const float* __restrict__ act,
                                float* __restrict__ pair_out, int64_t n_embd, int64_t n_ff) {
  chained_kernel_entry();
  const int64_t p = blockIdx.x;
  if (!pair_active(ids, table, done, p)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i0 = (static_cast<int64_t>(blockIdx.y) * kExpertWarps + warp) * kDownRows;
  if (i0 >= n_embd) return;
  float y[kDownRows];
  down_rows<WT, kDownRows>(table[ids[p]], act + p * n_ff, i0, n_embd, n_ff, lane, y);
  if (lane == 0) {
    const ExpertRef& ref = table[ids[p]];  // read again, as in down + combine
#pragma unroll
    for (int r = 0; r < kDownRows; ++r)
      if (i0 + r < n_embd) pair_out[p * n_embd + i0 + r] = expert_down(ref, i0 + r, y[r]);
  }
}

// grid (n_rows, ceil(n_embd / kCombineRows)); block -> (row, embd rows i0 .. i0 + kCombineRows - 1),
// its warps splitting the row's k ranks (warp w: ranks w, w + kExpertWarps, ...), so that a
// decode token's 8 experts are read in parallel; the per-rank sums meet in shared memory and
// are combined in rank order with the fmaf of moe_combine_done_kernel.
// dynamic shared memory: k * kCombineRows floats.
template <WType WT>
constexpr int combine_rows() {
  return WT == WType::q2 || WT == WType::unavailable ? kDownRows : 8;
}

template <WType WT, int kCombineRows = combine_rows<WT>()>
__global__ void __launch_bounds__(kExpertWarps * 32, kCombineRows == 8 ? 2 : 1) moe_down_combine_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights,
                                        const ExpertRef* __restrict__ table, const float* __restrict__ act,
                                        float* __restrict__ out, int64_t k, int64_t n_embd, int64_t n_ff) {
  chained_kernel_entry();
  extern __shared__ float ys[];  // [k][kCombineRows]
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kCombineRows;
  for (int64_t rank = warp; rank < k; rank += kExpertWarps) {
    const int64_t p = row * k + rank;
    float y[kCombineRows];
    down_rows<WT, kCombineRows>(table[ids[p]], act + p * n_ff, i0, n_embd, n_ff, lane, y);
    if (lane == 0) {
      const ExpertRef& ref = table[ids[p]];  // read again: a pointer kept live through the dots costs registers
#pragma unroll
      for (int r = 0; r < kCombineRows; ++r)
        ys[rank * kCombineRows + r] = i0 + r < n_embd ? expert_down(ref, i0 + r, y[r]) : y[r];
    }
  }
  __syncthreads();
  combine_ranks(ys, kCombineRows, weights, row, k, i0, n_embd, out);
}

__global__ void moe_mark_kernel(const int32_t* __restrict__ ids, const ExpertRef* __restrict__ table,
                                uint8_t* __restrict__ done, int64_t n_pairs) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < n_pairs && pair_active(ids, table, done, p)) done[p] = 1;
}

__global__ void moe_combine_done_kernel(const float* __restrict__ pair_out, const float* __restrict__ w,
                                        const uint8_t* __restrict__ done, const int32_t* __restrict__ ids,
                                        const ExpertRef* __restrict__ table, float* __restrict__ out, int64_t n,
                                        int64_t k, int64_t cols) {
  chained_kernel_entry();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * cols) return;
  const int64_t row = t / cols, c = t % cols;
  float acc = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    const int64_t p = row * k + r;
    const bool computed = done != nullptr ? done[p] != 0 : table[ids[p]].wtype != WType::unavailable;
    const float e = computed ? pair_out[p * cols + c] : 0.0f;
    acc = fmaf(w ? w[p] : 1.0f, e, acc);  // as launch_moe_combine
  }
  out[t] = acc;
}

}  // namespace

namespace {

// gate/up of launch_moe_experts*: the decode kernel where it takes the shape, else the generic one.
template <WType WT>
void launch_gate_up_t(const float* h, const int32_t* ids, const ExpertRef* table, const uint8_t* done, float* act,
                      const MoeShape& shape, cudaStream_t st, const CopyList& copies = {}) {
  if (launch_moe_decode_gate_up(h, ids, table, done, act, shape, st, copies)) return;
  if (copies.descs != nullptr) launch_expert_copies(copies.descs, copies.count, st);  // on the stream first
  launch_chained(moe_gate_up_kernel<WT>,
                 dim3(static_cast<unsigned>(shape.n_rows * shape.k), blocks_for(shape.n_ff, kExpertWarps * kGateRows)),
                 dim3(kExpertWarps * 32), 0, st, h, ids, table, done, act, shape.k, shape.n_embd, shape.n_ff);
  CUDA_CHECK(cudaGetLastError());
}

template <WType WT>
void launch_down_t(const int32_t* ids, const ExpertRef* table, const uint8_t* done, const float* act, float* pair_out,
                   const MoeShape& shape, cudaStream_t st) {
  if (launch_moe_decode_down(ids, table, done, act, pair_out, shape, st)) return;
  launch_chained(moe_down_kernel<WT>,
                 dim3(static_cast<unsigned>(shape.n_rows * shape.k), blocks_for(shape.n_embd, kExpertWarps * kDownRows)),
                 dim3(kExpertWarps * 32), 0, st, ids, table, done, act, pair_out, shape.n_embd, shape.n_ff);
  CUDA_CHECK(cudaGetLastError());
}

template <WType WT>
void launch_experts_combine_t(const float* h, const int32_t* ids, const float* weights, const ExpertRef* table,
                              float* act, float* out, const MoeShape& shape, size_t smem, cudaStream_t st) {
  launch_gate_up_t<WT>(h, ids, table, nullptr, act, shape, st);  // no done flags: every available pair
  // No copies ride with that gate/up launch: the down + combine may read all but act early.
  if (launch_moe_decode_down_combine(ids, weights, table, act, out, shape, st, /*early=*/true)) return;
  launch_chained(moe_down_combine_kernel<WT>,
                 dim3(static_cast<unsigned>(shape.n_rows), blocks_for(shape.n_embd, combine_rows<WT>())),
                 dim3(kExpertWarps * 32), smem, st, ids, weights, table, act, out, shape.k, shape.n_embd, shape.n_ff);
  CUDA_CHECK(cudaGetLastError());
}

// Runs the statement with WT, a constant, set to the shape's uniform weight type (-1: mixed).
#define SLUICE_WITH_WTYPE(wtype, ...)                               \
  switch (wtype) {                                                  \
    case WType::f32: { constexpr WType WT = WType::f32; __VA_ARGS__; } break;   \
    case WType::f16: { constexpr WType WT = WType::f16; __VA_ARGS__; } break;   \
    case WType::bf16: { constexpr WType WT = WType::bf16; __VA_ARGS__; } break; \
    case WType::q8: { constexpr WType WT = WType::q8; __VA_ARGS__; } break;     \
    case WType::q4: { constexpr WType WT = WType::q4; __VA_ARGS__; } break;     \
    case WType::q2: { constexpr WType WT = WType::q2; __VA_ARGS__; } break;     \
    case WType::mxfp4: { constexpr WType WT = WType::mxfp4; __VA_ARGS__; } break; \
    default: { constexpr WType WT = WType::unavailable; __VA_ARGS__; } break;                   \
  }

}  // namespace

void launch_moe_gate_up(const float* h, const int32_t* ids, const ExpertRef* table, const uint8_t* done, float* act,
                        const MoeShape& shape, Stream s, const CopyList& copies) {
  auto st = static_cast<cudaStream_t>(s);
  if (shape.n_rows * shape.k == 0) {
    if (copies.descs != nullptr) launch_expert_copies(copies.descs, copies.count, st);
    return;
  }
  SLUICE_WITH_WTYPE(shape.wtype, launch_gate_up_t<WT>(h, ids, table, done, act, shape, st, copies))
}

void launch_moe_experts(const float* h, const int32_t* ids, const ExpertRef* table, uint8_t* done, float* act,
                        float* pair_out, const MoeShape& shape, Stream s, bool mark, const CopyList& copies) {
  launch_moe_gate_up(h, ids, table, done, act, shape, s, copies);
  const int64_t pairs = shape.n_rows * shape.k;
  if (pairs == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  SLUICE_WITH_WTYPE(shape.wtype, launch_down_t<WT>(ids, table, done, act, pair_out, shape, st))
  if (mark) moe_mark_kernel<<<blocks_for(pairs, 256), 256, 0, st>>>(ids, table, done, pairs);
  CUDA_CHECK(cudaGetLastError());
}

void launch_moe_down_combine_table(const int32_t* ids, const float* weights, const ExpertRef* table, const float* act,
                                   float* pair_out, float* out, const MoeShape& shape, Stream s) {
  if (shape.n_rows * shape.k == 0) return;
  if (launch_moe_decode_down_combine(ids, weights, table, act, out, shape, s)) return;
  // Shapes the fused decode kernel does not take: the pairs' down products, then the combine
  // by the table (the kernels of launch_moe_experts and launch_moe_combine_done).
  SLUICE_WITH_WTYPE(shape.wtype, launch_down_t<WT>(ids, table, nullptr, act, pair_out, shape, static_cast<cudaStream_t>(s)))
  launch_moe_combine_done(pair_out, weights, nullptr, out, shape, s, ids, table);
}

void launch_moe_experts_combine(const float* h, const int32_t* ids, const float* weights, const ExpertRef* table,
                                float* act, float* out, const MoeShape& shape, Stream s) {
  const int64_t pairs = shape.n_rows * shape.k;
  if (pairs == 0) return;
  const size_t smem = static_cast<size_t>(shape.k) * 8 * sizeof(float);  // the most rows of combine_rows
  SLUICE_CHECK(smem <= 48 * 1024, Status::unsupported, "cuda moe: top-k ", shape.k, " too large");
  auto st = static_cast<cudaStream_t>(s);
  SLUICE_WITH_WTYPE(shape.wtype, launch_experts_combine_t<WT>(h, ids, weights, table, act, out, shape, smem, st))
}

void launch_moe_combine_done(const float* pair_out, const float* weights, const uint8_t* done, float* out,
                             const MoeShape& shape, Stream s, const int32_t* ids, const ExpertRef* table) {
  const int64_t total = shape.n_rows * shape.n_embd;
  if (total == 0) return;
  SLUICE_CHECK(done != nullptr || (ids != nullptr && table != nullptr), Status::internal,
               "launch_moe_combine_done: neither done flags nor a table");
  launch_chained(moe_combine_done_kernel, dim3(blocks_for(total, 256)), dim3(256), 0, static_cast<cudaStream_t>(s),
                 pair_out, weights, done, ids, table, out, shape.n_rows, shape.k, shape.n_embd);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
