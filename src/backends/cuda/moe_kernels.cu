// Device-side MoE dispatch (moe_kernels.h): router top-k, the routed experts of a batch read
// through an ExpertRef table with per-pair done flags (two-phase dispatch), and the combine
// that counts pairs never computed as zero.
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
#include "backends/cuda/mma_tile.cuh"
#include "backends/cuda/moe_common.cuh"
#include "backends/cuda/moe_decode.h"
#include "backends/cuda/router_topk.cuh"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

constexpr int kRouterWarps = 4;  // rows per router block
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

// The row's k ids and weights, once the warp wrote them, copied to `copy` (the streamer's
// host-mapped handshake memory: the host reads the routing there without a device-to-host
// copy on the stream); nothing when copy.ids is null. The whole warp calls it.
__device__ __forceinline__ void copy_routing_row(const int32_t* ids, const float* weights, RoutingCopy copy,
                                                 int64_t row, int64_t k) {
  if (copy.ids == nullptr) return;
  __syncwarp();  // the lanes' (or lane 0's) stores of the row are visible to the warp
  for (int64_t r = threadIdx.x % 32; r < k; r += 32) {
    copy.ids[row * k + r] = ids[row * k + r];
    copy.weights[row * k + r] = weights[row * k + r];
  }
  __threadfence_system();  // in host memory before whatever signals the host after this kernel
}

// One warp per row: softmax over n_expert logits (kept in shared memory), then k rounds of a
// warp arg-max (equal probabilities: the lower expert id), as route_topk does.
__global__ void router_topk_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k, bool norm,
                                   int32_t* __restrict__ ids, float* __restrict__ weights,
                                   const float* __restrict__ expert_scale, RoutingCopy copy) {
  chained_kernel_entry();
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= n) return;
  float* p = smem + static_cast<int64_t>(warp) * E;
  const float* l = logits + row * E;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) {
    const float v = expf(l[e] - mx);
    p[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  for (int64_t e = lane; e < E; e += 32) p[e] = p[e] / sum;
  __syncwarp();
  float top_sum = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    float best = -1.0f;
    int32_t best_id = INT32_MAX;
    for (int64_t e = lane; e < E; e += 32) {
      const float v = p[e];
      if (v > best) {  // ascending e per lane: the first of equal values is the lowest id
        best = v;
        best_id = static_cast<int32_t>(e);
      }
    }
    warp_argmax(best, best_id);
    if (lane == 0) {
      ids[row * k + r] = best_id;
      weights[row * k + r] = best;
      p[best_id] = -2.0f;  // taken; probabilities are >= 0
    }
    top_sum += best;  // in rank order, as the CPU sums
    __syncwarp();
  }
  if (lane == 0)
    for (int64_t r = 0; r < k; ++r) {
      float w = norm ? weights[row * k + r] / top_sum : weights[row * k + r];
      if (expert_scale != nullptr) w = __fmul_rn(w, expert_scale[ids[row * k + r]]);
      weights[row * k + r] = w;
    }
  copy_routing_row(ids, weights, copy, row, k);
}

// router_topk_kernel with the row's probabilities in registers (router_topk.cuh): one warp a
// row, E <= 32 NV, k <= 32; the same bits.
template <int NV>
__global__ void router_topk_regs_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k, bool norm,
                                        int32_t* __restrict__ ids, float* __restrict__ weights,
                                        const float* __restrict__ expert_scale, RoutingCopy copy) {
  chained_kernel_entry();
  const int warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= n) return;
  router_topk_warp<NV>(logits + row * E, E, k, norm, ids + row * k, weights + row * k, expert_scale);
  copy_routing_row(ids, weights, copy, row, k);
}

// One warp per row, E <= 32 NV: route_topk's sigmoid scoring. Lane l holds the logits of
// experts l, l + 32, ...; k rounds of a warp arg-max over the ones not yet taken (a mask, not
// a sentinel value: any logit may be chosen), the lower expert id first among equal logits.
template <int NV>
__global__ void router_topk_sigmoid_kernel(const float* __restrict__ logits, int64_t n, int64_t E, int64_t k,
                                           int32_t* __restrict__ ids, float* __restrict__ weights, RoutingCopy copy) {
  chained_kernel_entry();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (row >= n) return;
  const float* l = logits + row * E;
  float v[NV];
  uint32_t open = 0;  // bit i: expert lane + 32 i exists and is not taken
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool exists = lane + 32 * i < E;
    v[i] = exists ? l[lane + 32 * i] : 0.0f;
    open |= exists ? 1u << i : 0u;
  }
  float mine = 0.0f;
  int32_t mine_id = 0;
  for (int64_t r = 0; r < k; ++r) {
    float best = -INFINITY;
    int32_t best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if ((open >> i & 1u) && (best_id == INT32_MAX || v[i] > best)) {  // ascending id per lane: the first of equals
        best = v[i];
        best_id = lane + 32 * i;
      }
    warp_argmax(best, best_id);
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (lane + 32 * i == best_id) open &= ~(1u << i);
    if (lane == r) {
      mine = best;
      mine_id = best_id;
    }
  }
  if (lane < k) {
    ids[row * k + lane] = mine_id;
    weights[row * k + lane] = 1.0f / (1.0f + expf(-mine));
  }
  copy_routing_row(ids, weights, copy, row, k);
}

__global__ void scale_pair_inputs_kernel(const float* __restrict__ h, const float* __restrict__ w,
                                         float* __restrict__ x, int64_t pairs, int64_t k, int64_t n_embd) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= pairs * n_embd) return;
  const int64_t p = t / n_embd, c = t % n_embd;
  x[t] = __fmul_rn(h[(p / k) * n_embd + c], w[p]);
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

// ---- grouped (prefill) ----
constexpr int kGTM = 64, kGTN = 64, kGTK = 32;  // pairs x output columns x k per tile

// One block: counts pairs per expert, offsets[e] = first slot of expert e in order[],
// order[] = pair indices grouped by expert (in each group in arrival order: a pair's result
// does not depend on its neighbours). tile_bm > 0 also lists the tiles of tile_bm pairs:
// tiles[0] = their count, then (expert, first slot) per tile, expert by expert (at most
// pairs / tile_bm + n_expert of them). dynamic shared memory: 2 * n_expert ints.
__global__ void moe_group_kernel(const int32_t* __restrict__ ids, int64_t pairs, int64_t n_expert,
                                 int32_t* __restrict__ offsets, int32_t* __restrict__ order, int32_t tile_bm,
                                 int32_t* __restrict__ tiles) {
  extern __shared__ int32_t sh[];
  int32_t* count = sh;
  int32_t* cursor = sh + n_expert;
  for (int64_t e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0, n_tiles = 0;
    for (int64_t e = 0; e < n_expert; ++e) {
      offsets[e] = run;
      cursor[e] = run;
      if (tile_bm > 0)
        for (int32_t f = 0; f < count[e]; f += tile_bm) {
          tiles[1 + 2 * n_tiles] = static_cast<int32_t>(e);
          tiles[2 + 2 * n_tiles] = run + f;
          ++n_tiles;
        }
      run += count[e];
    }
    offsets[n_expert] = run;
    if (tile_bm > 0) tiles[0] = n_tiles;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) order[atomicAdd(&cursor[ids[p]], 1)] = static_cast<int32_t>(p);
}

// The tile list's bound for tiles of bm pairs.
__host__ __device__ inline int64_t max_tiles(int64_t pairs, int64_t n_expert, int64_t bm) {
  return (pairs + bm - 1) / bm + n_expert;
}

// grid (ceil(cols / kGTN), n_expert, ceil(pairs / kGTM)). Tile t of expert e: its pairs
// order[offsets[e] + t * kGTM ..]; x row of pair p: x + (GATE ? p / k : p) * kdim. NMAT = 2
// (gate and up: act = silu(g) * u) or 1 (down: pair_out).
template <WType T, int NMAT>
__global__ void __launch_bounds__(256) moe_grouped_kernel(const float* __restrict__ x, const int32_t* __restrict__ order,
                                                          const int32_t* __restrict__ offsets,
                                                          const ExpertRef* __restrict__ table, float* __restrict__ y,
                                                          int64_t k, int64_t kdim, int64_t cols) {
  __shared__ float xs[kGTK][kGTM + 1];
  __shared__ float ws[NMAT][kGTK][kGTN + 1];
  __shared__ int32_t rows[kGTM];
  const int64_t e = blockIdx.y;
  const int64_t first = offsets[e] + static_cast<int64_t>(blockIdx.z) * kGTM, end = offsets[e + 1];
  if (first >= end || table[e].wtype == WType::unavailable) return;  // no pairs, or not in this wave
  const int n_rows = static_cast<int>(end - first < kGTM ? end - first : kGTM);
  const int tid = threadIdx.x;
  if (tid < kGTM) rows[tid] = tid < n_rows ? order[first + tid] : -1;
  const ExpertRef& ref = table[e];
  const int64_t rb = dot_row_bytes(T, kdim), sb = dot_scale_row_bytes(T, kdim);
  const int mat0 = NMAT == 2 ? 0 : 2;  // gate/up, or down
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kGTN;
  const int tr = tid / 16, tc = tid % 16;
  float acc[NMAT][4][4] = {};
  __syncthreads();
  for (int64_t k0 = 0; k0 < kdim; k0 += kGTK) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int idx = tid + 256 * q, r = idx / kGTK, c = idx % kGTK;
      const int64_t kk = k0 + c;
      const int32_t p = rows[r];
      xs[c][r] = (p >= 0 && kk < kdim) ? x[(NMAT == 2 ? p / k : p) * kdim + kk] : 0.0f;
      const int64_t wr = col0 + r;
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {
        const auto* base = static_cast<const uint8_t*>(ref.data[mat0 + m]);
        const auto* sc = static_cast<const uint8_t*>(ref.scales[mat0 + m]);
        ws[m][c][r] = (wr < cols && kk < kdim) ? load_elem<T>(base + wr * rb, sc ? sc + wr * sb : nullptr, kk) : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < kGTK; ++c) {
      float a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[c][tr + 16 * i];
#pragma unroll
      for (int m = 0; m < NMAT; ++m) {
        float b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = ws[m][c][tc + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[m][i][j] = fmaf(a[i], b[j], acc[m][i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int32_t p = rows[tr + 16 * i];
    if (p < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tc + 16 * j;
      if (c >= cols) continue;
      if constexpr (NMAT == 2) {
        y[p * cols + c] = expert_gate_up(ref, c, acc[0][i][j], acc[1][i][j]);
      } else {
        y[p * cols + c] = expert_down(ref, c, acc[0][i][j]);
      }
    }
  }
}

// The tensor-core form of moe_grouped_kernel (mma_tile.cuh), tiles of BM pairs x 64 columns,
// 128 threads; grid (ceil(cols / 64), max_tiles): block y takes tile y of moe_group_kernel's
// list (none past its count). Every expert's rows are 16-byte aligned (the launcher checks
// the shapes; tables hold 64-byte aligned blocks).
template <WType T, int BM, int NMAT>
__global__ void __launch_bounds__(mma::kThreads) moe_grouped_mma_kernel(const float* __restrict__ x,
                                                                        const int32_t* __restrict__ order,
                                                                        const int32_t* __restrict__ offsets,
                                                                        const int32_t* __restrict__ tiles,
                                                                        const ExpertRef* __restrict__ table,
                                                                        float* __restrict__ y, int64_t k,
                                                                        int64_t kdim, int64_t cols) {
  __shared__ mma::Smem<BM, NMAT> s;
  __shared__ const float* xrow[BM];
  __shared__ int32_t pair[BM];
  __shared__ const uint8_t* wrow[NMAT * mma::kBN];
  __shared__ const uint8_t* srow[NMAT * mma::kBN];
  if (static_cast<int32_t>(blockIdx.y) >= tiles[0]) return;
  const int64_t e = tiles[1 + 2 * blockIdx.y], first = tiles[2 + 2 * blockIdx.y], end = offsets[e + 1];
  if (table[e].wtype == WType::unavailable) return;  // not in this wave
  const int64_t n_rows = end - first < BM ? end - first : BM;
  const int tid = threadIdx.x;
  const ExpertRef& ref = table[e];
  const int64_t rb = dot_row_bytes(T, kdim), sb = dot_scale_row_bytes(T, kdim);
  const int mat0 = NMAT == 2 ? 0 : 2;  // gate/up, or down
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * mma::kBN;
  if (tid < BM) {
    const int32_t p = tid < n_rows ? order[first + tid] : -1;
    pair[tid] = p;
    xrow[tid] = p >= 0 ? x + (NMAT == 2 ? p / k : p) * kdim : nullptr;
  }
  for (int i = tid; i < NMAT * mma::kBN; i += mma::kThreads) {
    const int m = i / mma::kBN, c = i % mma::kBN;
    const bool in = col0 + c < cols;
    const auto* base = static_cast<const uint8_t*>(ref.data[mat0 + m]);
    const auto* sc = static_cast<const uint8_t*>(ref.scales[mat0 + m]);
    wrow[i] = in ? base + (col0 + c) * rb : nullptr;
    srow[i] = in && sc ? sc + (col0 + c) * sb : nullptr;
  }
  __syncthreads();
  mma::Acc<BM> acc[NMAT];
  mma::block_product<T, BM, NMAT>(s, xrow, wrow, srow, kdim, acc);
  mma::for_each_output<BM, NMAT>(acc, [&](int r, int c, const float(&v)[NMAT]) {
    const int32_t p = pair[r];
    if (p < 0 || col0 + c >= cols) return;
    if constexpr (NMAT == 2) {
      y[p * cols + col0 + c] = expert_gate_up(ref, col0 + c, v[0], v[1]);
    } else {
      y[p * cols + col0 + c] = expert_down(ref, col0 + c, v[0]);
    }
  });
}

// moe_grouped_mma_kernel over activations split beforehand (mma_tile.cuh's
// block_product_split, two stages): gate/up (NMAT = 2) reads h's parts (part i of row r at
// x + i * xpart + r * kdim) and writes act = silu(g) * u as its three parts (y + i * ypart +
// pair * cols), which down (NMAT = 1) reads, writing f32 pair_out. The same sums as
// moe_grouped_mma_kernel, bit for bit. dynamic shared memory: sizeof(PipeSmem<BM, NMAT>).
template <WType T, int BM, int NMAT>
__global__ void __launch_bounds__(mma::kThreads) moe_grouped_split_kernel(const __nv_bfloat16* __restrict__ x,
                                                                          int64_t xpart,
                                                                          const int32_t* __restrict__ order,
                                                                          const int32_t* __restrict__ offsets,
                                                                          const int32_t* __restrict__ tiles,
                                                                          const ExpertRef* __restrict__ table,
                                                                          void* __restrict__ y, int64_t ypart,
                                                                          int64_t k, int64_t kdim, int64_t cols) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& s = *reinterpret_cast<mma::PipeSmem<BM, NMAT>*>(smem_raw);
  __shared__ const __nv_bfloat16* xrow[BM];
  __shared__ int32_t pair[BM];
  __shared__ const uint8_t* wrow[NMAT * mma::kBN];
  __shared__ const uint8_t* srow[NMAT * mma::kBN];
  if (static_cast<int32_t>(blockIdx.y) >= tiles[0]) return;
  const int64_t e = tiles[1 + 2 * blockIdx.y], first = tiles[2 + 2 * blockIdx.y], end = offsets[e + 1];
  if (table[e].wtype == WType::unavailable) return;  // not in this wave
  const int64_t n_rows = end - first < BM ? end - first : BM;
  const int tid = threadIdx.x;
  const ExpertRef& ref = table[e];
  const int64_t rb = dot_row_bytes(T, kdim), sb = dot_scale_row_bytes(T, kdim);
  const int mat0 = NMAT == 2 ? 0 : 2;  // gate/up, or down
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * mma::kBN;
  if (tid < BM) {
    const int32_t p = tid < n_rows ? order[first + tid] : -1;
    pair[tid] = p;
    xrow[tid] = p >= 0 ? x + (NMAT == 2 ? p / k : p) * kdim : nullptr;
  }
  for (int i = tid; i < NMAT * mma::kBN; i += mma::kThreads) {
    const int m = i / mma::kBN, c = i % mma::kBN;
    const bool in = col0 + c < cols;
    const auto* base = static_cast<const uint8_t*>(ref.data[mat0 + m]);
    const auto* sc = static_cast<const uint8_t*>(ref.scales[mat0 + m]);
    wrow[i] = in ? base + (col0 + c) * rb : nullptr;
    srow[i] = in && sc ? sc + (col0 + c) * sb : nullptr;
  }
  __syncthreads();
  mma::Acc<BM> acc[NMAT];
  mma::block_product_split<T, BM, NMAT>(s, xrow, xpart, x, wrow, srow, kdim, acc);
  mma::for_each_output<BM, NMAT>(acc, [&](int r, int c, const float(&v)[NMAT]) {
    const int32_t p = pair[r];
    if (p < 0 || col0 + c >= cols) return;
    if constexpr (NMAT == 2) {
      float a = expert_gate_up(ref, col0 + c, v[0], v[1]);
      auto* parts = static_cast<__nv_bfloat16*>(y) + p * cols + col0 + c;
#pragma unroll
      for (int i = 0; i < mma::kParts; ++i) {  // mma_tile.cuh's split, as the split kernel makes it
        const __nv_bfloat16 hb = __float2bfloat16_rn(a);
        parts[i * ypart] = hb;
        a -= __bfloat162float(hb);
      }
    } else {
      static_cast<float*>(y)[p * cols + col0 + c] = expert_down(ref, col0 + c, v[0]);
    }
  });
}

// Tiles of 32 pairs when an expert averages fewer than 48 (a 512-token prompt over 128
// experts top-8 gives 32: a 64-pair tile would be half empty), else 64.
int grouped_mma_bm(const MoeShape& shape) { return shape.n_rows * shape.k < 48 * shape.n_expert ? 32 : 64; }

// The grouped experts' split activations (moe_grouped_scratch_bytes): h's parts [3][n_rows][n_embd]
// and act's [3][pairs][n_ff], bf16, after the index arrays.
struct SplitScratch {
  __nv_bfloat16* h_parts;
  __nv_bfloat16* act_parts;
};
int64_t index_bytes(const MoeShape& shape) {
  const int64_t pairs = shape.n_rows * shape.k;
  return (shape.n_expert + 1 + pairs + 1 + 2 * max_tiles(pairs, shape.n_expert, 32)) * static_cast<int64_t>(sizeof(int32_t));
}
int64_t round_up_256(int64_t b) { return (b + 255) / 256 * 256; }
SplitScratch split_scratch(void* group, const MoeShape& shape) {
  auto* base = static_cast<unsigned char*>(group);
  auto* h = reinterpret_cast<__nv_bfloat16*>(base + round_up_256(index_bytes(shape)));
  return {h, h + round_up_256(mma::kParts * shape.n_rows * shape.n_embd * 2) / 2};
}

// Whether the grouped experts take the split kernels (SLUICE_CUDA_MOE_SPLIT=0: the tiles that
// split x while staging, to compare).
bool moe_split_enabled() {
  const char* e = std::getenv("SLUICE_CUDA_MOE_SPLIT");
  return !(e && std::strcmp(e, "0") == 0);
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <WType T, int BM>
void launch_grouped_mma_t(const float* h, const int32_t* order, const int32_t* offsets, const int32_t* tiles,
                          const ExpertRef* table, float* act, float* pair_out, const MoeShape& shape, void* group,
                          cudaStream_t st) {
  const int64_t pairs = shape.n_rows * shape.k;
  const auto bound = static_cast<unsigned>(max_tiles(pairs, shape.n_expert, BM));
  if (moe_split_enabled()) {  // h's parts: launch_moe_grouped_prepare
    const SplitScratch sp = split_scratch(group, shape);
    constexpr size_t gate_smem = sizeof(mma::PipeSmem<BM, 2>), down_smem = sizeof(mma::PipeSmem<BM, 1>);
    static const bool attributes_set = [] {  // once a process for each instantiation
      allow_smem(moe_grouped_split_kernel<T, BM, 2>, gate_smem);
      allow_smem(moe_grouped_split_kernel<T, BM, 1>, down_smem);
      return true;
    }();
    (void)attributes_set;
    moe_grouped_split_kernel<T, BM, 2><<<dim3(blocks_for(shape.n_ff, mma::kBN), bound), mma::kThreads, gate_smem, st>>>(
        sp.h_parts, shape.n_rows * shape.n_embd, order, offsets, tiles, table, sp.act_parts, pairs * shape.n_ff, shape.k,
        shape.n_embd, shape.n_ff);
    CUDA_CHECK(cudaGetLastError());
    moe_grouped_split_kernel<T, BM, 1><<<dim3(blocks_for(shape.n_embd, mma::kBN), bound), mma::kThreads, down_smem, st>>>(
        sp.act_parts, pairs * shape.n_ff, order, offsets, tiles, table, pair_out, 0, shape.k, shape.n_ff, shape.n_embd);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  moe_grouped_mma_kernel<T, BM, 2><<<dim3(blocks_for(shape.n_ff, mma::kBN), bound), mma::kThreads, 0, st>>>(
      h, order, offsets, tiles, table, act, shape.k, shape.n_embd, shape.n_ff);
  CUDA_CHECK(cudaGetLastError());
  moe_grouped_mma_kernel<T, BM, 1><<<dim3(blocks_for(shape.n_embd, mma::kBN), bound), mma::kThreads, 0, st>>>(
      act, order, offsets, tiles, table, pair_out, shape.k, shape.n_ff, shape.n_embd);
  CUDA_CHECK(cudaGetLastError());
}

template <WType T>
void launch_grouped_mma(const float* h, const int32_t* order, const int32_t* offsets, const int32_t* tiles,
                        const ExpertRef* table, float* act, float* pair_out, const MoeShape& shape, void* group,
                        cudaStream_t st) {
  if (grouped_mma_bm(shape) == 32)
    launch_grouped_mma_t<T, 32>(h, order, offsets, tiles, table, act, pair_out, shape, group, st);
  else
    launch_grouped_mma_t<T, 64>(h, order, offsets, tiles, table, act, pair_out, shape, group, st);
}

// Whether the grouped experts can take the tensor cores: a supported type, both products'
// k (n_embd, n_ff) whole steps and every row 16-byte aligned.
bool grouped_mma_usable(const MoeShape& shape) {
  const WType t = shape.wtype;
  return mma::supports(t) && mma::tensor_cores_enabled() && shape.n_embd % mma::kBK == 0 &&
         shape.n_ff % mma::kBK == 0 && dot_row_bytes(t, shape.n_embd) % 16 == 0 &&
         dot_row_bytes(t, shape.n_ff) % 16 == 0;
}

template <WType T>
void launch_grouped_t(const float* h, const int32_t* order, const int32_t* offsets, const ExpertRef* table, float* act,
                      float* pair_out, const MoeShape& shape, cudaStream_t st) {
  const int64_t pairs = shape.n_rows * shape.k;
  const unsigned tiles = static_cast<unsigned>((pairs + kGTM - 1) / kGTM);
  const unsigned E = static_cast<unsigned>(shape.n_expert);
  moe_grouped_kernel<T, 2><<<dim3(blocks_for(shape.n_ff, kGTN), E, tiles), 256, 0, st>>>(h, order, offsets, table, act,
                                                                                          shape.k, shape.n_embd,
                                                                                          shape.n_ff);
  CUDA_CHECK(cudaGetLastError());
  moe_grouped_kernel<T, 1><<<dim3(blocks_for(shape.n_embd, kGTN), E, tiles), 256, 0, st>>>(
      act, order, offsets, table, pair_out, shape.k, shape.n_ff, shape.n_embd);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// offsets [n_expert + 1], order [pairs], the tile list [1 + 2 * max_tiles] (bound of the
// smallest tile, 32 pairs), then the split activations of the tensor-core path (SplitScratch).
int64_t moe_grouped_scratch_bytes(const MoeShape& shape) {
  const int64_t pairs = shape.n_rows * shape.k;
  return round_up_256(index_bytes(shape)) + round_up_256(mma::kParts * shape.n_rows * shape.n_embd * 2) +
         mma::kParts * pairs * shape.n_ff * 2;
}

namespace {

// The index arrays of moe_grouped_scratch_bytes' layout.
struct GroupIndex {
  int32_t* offsets;
  int32_t* order;
  int32_t* tiles;
};
GroupIndex group_index(const MoeGroupedParams& p) {
  auto* offsets = static_cast<int32_t*>(p.group);
  int32_t* order = offsets + p.shape.n_expert + 1;
  return {offsets, order, order + p.shape.n_rows * p.shape.k};
}

}  // namespace

void launch_moe_grouped_prepare(const MoeGroupedParams& p, Stream s) {
  const MoeShape& shape = p.shape;
  const int64_t pairs = shape.n_rows * shape.k;
  if (pairs == 0) return;
  SLUICE_CHECK((pairs + kGTM - 1) / kGTM < 65536 && shape.n_expert < 65536 &&
                   2 * shape.n_expert * sizeof(int32_t) <= 48 * 1024,
               Status::unsupported, "cuda moe grouped: ", pairs, " pairs over ", shape.n_expert, " experts");
  auto st = static_cast<cudaStream_t>(s);
  const GroupIndex gi = group_index(p);
  const bool tensor_cores = grouped_mma_usable(shape);
  SLUICE_CHECK(!tensor_cores || max_tiles(pairs, shape.n_expert, grouped_mma_bm(shape)) < 65536, Status::unsupported,
               "cuda moe grouped: ", pairs, " pairs over ", shape.n_expert, " experts");
  moe_group_kernel<<<1, 1024, 2 * shape.n_expert * sizeof(int32_t), st>>>(
      p.ids, pairs, shape.n_expert, gi.offsets, gi.order, tensor_cores ? grouped_mma_bm(shape) : 0, gi.tiles);
  CUDA_CHECK(cudaGetLastError());
  if (tensor_cores && moe_split_enabled())
    launch_split_bf16_parts(p.h, shape.n_rows, shape.n_embd, split_scratch(p.group, shape).h_parts, st);
}

void launch_moe_grouped_experts(const MoeGroupedParams& p, Stream s) {
  const MoeShape& shape = p.shape;
  if (shape.n_rows * shape.k == 0) return;
  auto st = static_cast<cudaStream_t>(s);
  const GroupIndex gi = group_index(p);
  const float* h = p.h;
  const ExpertRef* table = p.table;
  float *act = p.act, *pair_out = p.pair_out;
  if (grouped_mma_usable(shape)) {
    switch (shape.wtype) {
      case WType::bf16: launch_grouped_mma<WType::bf16>(h, gi.order, gi.offsets, gi.tiles, table, act, pair_out, shape, p.group, st); break;
      case WType::q8: launch_grouped_mma<WType::q8>(h, gi.order, gi.offsets, gi.tiles, table, act, pair_out, shape, p.group, st); break;
      default: launch_grouped_mma<WType::q4>(h, gi.order, gi.offsets, gi.tiles, table, act, pair_out, shape, p.group, st); break;
    }
    return;
  }
  switch (shape.wtype) {
    case WType::f32: launch_grouped_t<WType::f32>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    case WType::f16: launch_grouped_t<WType::f16>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    case WType::bf16: launch_grouped_t<WType::bf16>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    case WType::q8: launch_grouped_t<WType::q8>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    case WType::q4: launch_grouped_t<WType::q4>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    case WType::q2: launch_grouped_t<WType::q2>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    case WType::mxfp4: launch_grouped_t<WType::mxfp4>(h, gi.order, gi.offsets, table, act, pair_out, shape, st); break;
    default: fail(Status::internal, "cuda moe grouped: weight type ", static_cast<int>(shape.wtype));
  }
}

void launch_moe_grouped_combine(const MoeGroupedParams& p, Stream s) {
  if (p.shape.n_rows * p.shape.k == 0) return;
  launch_moe_combine(p.pair_out, p.weights, p.out, p.shape.n_rows, p.shape.k, p.shape.n_embd, s);
}

void launch_moe_experts_grouped(const MoeGroupedParams& p, Stream s) {
  launch_moe_grouped_prepare(p, s);
  launch_moe_grouped_experts(p, s);
  launch_moe_grouped_combine(p, s);
}

void launch_router_topk_sigmoid(const float* logits, int64_t n, int64_t n_expert, int64_t k, int32_t* ids,
                                float* weights, Stream s, RoutingCopy copy) {
  SLUICE_CHECK(k > 0 && k <= n_expert && k <= 32, Status::internal, "cuda router_topk_sigmoid: k ", k, " of ", n_expert,
               " experts");
  SLUICE_CHECK(n_expert <= 512, Status::unsupported, "cuda router_topk_sigmoid: ", n_expert,
               " experts (at most 512 on the device)");
  if (n == 0) return;
  const dim3 grid(blocks_for(n, kRouterWarps)), block(kRouterWarps * 32);
  const auto st = static_cast<cudaStream_t>(s);
  if (n_expert <= 64)
    launch_chained(router_topk_sigmoid_kernel<2>, grid, block, 0, st, logits, n, n_expert, k, ids, weights, copy);
  else if (n_expert <= 128)
    launch_chained(router_topk_sigmoid_kernel<4>, grid, block, 0, st, logits, n, n_expert, k, ids, weights, copy);
  else
    launch_chained(router_topk_sigmoid_kernel<16>, grid, block, 0, st, logits, n, n_expert, k, ids, weights, copy);
  CUDA_CHECK(cudaGetLastError());
}

void launch_scale_pair_inputs(const float* h, const float* weights, float* x, int64_t n_rows, int64_t k,
                              int64_t n_embd, Stream s) {
  const int64_t total = n_rows * k * n_embd;
  if (total == 0) return;
  scale_pair_inputs_kernel<<<blocks_for(total, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(h, weights, x, n_rows * k,
                                                                                            k, n_embd);
  CUDA_CHECK(cudaGetLastError());
}

void launch_router_topk(const float* logits, int64_t n, int64_t n_expert, int64_t k, bool norm_topk, int32_t* ids,
                        float* weights, Stream s, const float* expert_scale, RoutingCopy copy) {
  SLUICE_CHECK(k > 0 && k <= n_expert, Status::internal, "cuda router_topk: k ", k, " of ", n_expert, " experts");
  const size_t smem = static_cast<size_t>(kRouterWarps) * n_expert * sizeof(float);
  SLUICE_CHECK(smem <= 48 * 1024, Status::unsupported, "cuda router_topk: ", n_expert,
               " experts exceed the shared-memory softmax (at most ", 48 * 1024 / (4 * kRouterWarps), ")");
  if (n == 0) return;
  const dim3 grid(blocks_for(n, kRouterWarps)), block(kRouterWarps * 32);
  const auto st = static_cast<cudaStream_t>(s);
  if (k > 32 || n_expert > 512)
    launch_chained(router_topk_kernel, grid, block, smem, st, logits, n, n_expert, k, norm_topk, ids, weights, expert_scale,
                   copy);
  else
    SLUICE_WITH_TOPK_NV(n_expert, launch_chained(router_topk_regs_kernel<NV>, grid, block, 0, st, logits, n, n_expert,
                                                 k, norm_topk, ids, weights, expert_scale, copy))
  CUDA_CHECK(cudaGetLastError());
}

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
  if (launch_moe_decode_down_combine(ids, weights, table, act, out, shape, st, early_down_enabled())) return;
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
