// Decode MoE expert kernels (moe_decode.h): a batch of one to a few rows reads each routed
// expert's weights once, so these kernels are bound by how fast they stream weight bytes.
//
// What held the generic kernels (moe_kernels.cu) near 1 TB/s: each lane reads the activations
// of its own 16-byte weight chunk straight from global memory, a q4 chunk's 32 floats at a
// stride of 128 bytes between lanes, so every activation load of a warp touched 32 cache lines
// (8 times a coalesced load's) and the L1 pipeline, not DRAM, set the pace. Here a block first
// puts its rows' weight chunks in flight (registers), then stages the activation row(s) in
// shared memory with coalesced loads, swizzled so that the lanes' chunk reads are free of bank
// conflicts, and only then computes.
//
// The sums are the generic kernels' exactly: lane l of the warp on a weight row takes the
// row's 16-byte chunks l, l + 32, ... in that order (chunk_dot of row_dot.cuh), and warp_sum
// adds the lanes; how many rows a warp holds and when the loads are issued do not change a
// row's sums. Rows whose weights are not 16-byte aligned take row_dot.cuh's scalar path, as
// there.
//
//   gate/up:       block (pair, 16 ff rows), 4 warps of 4 ff rows (8 weight rows with up)
//   down:          block (pair, 64 embd rows), 8 warps of 8 rows
//   down+combine:  block (batch row, 16 embd rows), 16 warps over (rank, 8 rows), the ranks'
//                  sums combined in rank order as moe_combine_done_kernel does
#include "backends/cuda/moe_decode.h"

#include "backends/cuda/copy_listed.cuh"
#include "backends/cuda/moe_decode_rows.cuh"
#include "core/switches.h"

namespace sluice::cuda {
namespace {

using namespace decode;

// grid (n_pairs, ceil(n_ff / (kGateUpWarps * kGateUpRows))); dynamic shared memory: n_embd floats.
// 3 blocks an SM (a decode token's 384 blocks in one wave on 132 SMs).
template <WType T>
__global__ void __launch_bounds__(kGateUpWarps * 32, 3) moe_decode_gate_up_kernel(const DecodeParams a) {
  chained_kernel_entry();
  extern __shared__ float4 xs[];  // h[p / k], staged
  gate_up_block<T>(a, a.ids, blockIdx.x, blockIdx.y, xs);
}

// Blocks that copy beside the gate/up product (CopyList): so few that they and a decode
// token's 384 product blocks fill one wave of 132 SMs at 3 blocks an SM, each thread holding
// kCopyLoads 16-byte loads from host memory in flight (12 x 128 x 8 x 16 B = 192 KiB).
constexpr int32_t kCopyBlocks = 12;

// moe_decode_gate_up_kernel with copies: grid (copy_blocks + n_pairs * tiles); blocks
// [0, copy_blocks) copy a.copies (first, so that they start at once), block copy_blocks + i
// is the plain kernel's block (i % n_pairs, i / n_pairs), in the plain grid's order.
template <WType T>
__global__ void __launch_bounds__(kGateUpWarps * 32, 3) moe_decode_gate_up_copies_kernel(const DecodeParams a,
                                                                                          const int32_t n_pairs) {
  chained_kernel_entry();
  extern __shared__ float4 xs[];  // h[p / k], staged
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  if (b < a.copy_blocks) {
    copy_listed(a.copies, b, a.copy_blocks);
    return;
  }
  const int32_t i = b - a.copy_blocks;
  gate_up_block<T>(a, a.ids, i % n_pairs, i / n_pairs, xs);
}

// grid (n_pairs, ceil(n_embd / (kDownWarps * kRowsPerWarp))); dynamic shared memory: n_ff floats.
template <WType T>
__global__ void __launch_bounds__(kDownWarps * 32, 2) moe_decode_down_kernel(const DecodeParams a) {
  chained_kernel_entry();
  extern __shared__ float4 xs[];  // act[p], staged
  const int64_t n_embd = a.n_embd, n_ff = a.n_ff, p = blockIdx.x;
  const float* x = a.act_in + p * n_ff;
  const ExpertRef* expert = stage_for_pair<T>(xs, x, n_ff, a.ids, a.table, a.done, p);
  if (expert == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i0 = (static_cast<int64_t>(blockIdx.y) * kDownWarps + warp) * kRowsPerWarp;
  DownRows<T> rows;
  set_down_rows<T>(rows, *expert, i0, n_embd, n_ff);
  const bool live = i0 < n_embd;
  if (live) rows.begin(n_ff, lane);
  staged_wait();
  __syncthreads();
  if (!live) return;
  float y[kRowsPerWarp];
  rows.dots(xs, x, n_ff, lane, y);
  if (lane == 0) {
    const ExpertRef& eref = a.table[a.ids[p]];  // read again, as in gate/up
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      if (i0 + r < n_embd) a.pair_out[p * n_embd + i0 + r] = expert_down(eref, i0 + r, y[r]);
  }
}

// grid (n_rows, ceil(n_embd / kCombineTile)). Warp w takes the items w, w + kCombineWarps, ...
// of the 2 k items (rank it / 2, the tile's rows (it % 2) * kRowsPerWarp ..); dynamic shared
// memory: the row's k act rows (k * n_ff floats, staged) and their sums [k][kCombineTile].
// A pair whose expert's entry is unavailable (the CUDA streamer's cut misses) sums to zero,
// as moe_combine_done_kernel counts it; the fully resident launch has none.
// EARLY: the block reads its pairs' experts and puts its first weight rows in flight before
// its griddepcontrol.wait, the act rows after it. Only where the kernel before it (the
// gate/up product) writes nothing but act that this one reads: the ids, weights and table
// were written before that kernel passed its own wait (which it does before this one can
// launch), and it carries no expert copies (launch_moe_decode_down_combine's caller says).
template <WType T, bool EARLY>
__global__ void __launch_bounds__(kCombineWarps * 32, 1) moe_decode_down_combine_kernel(const DecodeParams a) {
  if constexpr (!EARLY) chained_kernel_entry();
  extern __shared__ float4 xs[];
  const int64_t k = a.k, n_embd = a.n_embd, n_ff = a.n_ff;
  float* ys = reinterpret_cast<float*>(xs + k * (n_ff / 4));  // [k][kCombineTile]
  const int64_t row = blockIdx.x, tile0 = static_cast<int64_t>(blockIdx.y) * kCombineTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t items = 2 * k;
  const float* x = a.act_in + row * k * n_ff;  // the row's pairs are consecutive
  if constexpr (!EARLY) stage_rows<chunk_units<T>()>(xs, x, k, n_ff);
  DownRows<T> rows;
  // Item it's expert. Early, from L2 (ld.global.cg): the ids were written by a kernel that is
  // not this one's predecessor, so no wait of this kernel orders them; L1 may not keep a line
  // of them from before.
  auto expert = [&](int64_t it) -> const ExpertRef& {
    const int32_t* id = a.ids + row * k + it / 2;
    return a.table[EARLY ? __ldcg(id) : *id];
  };
  auto available = [&](int64_t it) { return expert(it).wtype != WType::unavailable; };
  auto start = [&](int64_t it) {
    if (!available(it)) return;
    set_down_rows<T>(rows, expert(it), tile0 + (it % 2) * kRowsPerWarp, n_embd, n_ff);
    rows.begin(n_ff, lane);
  };
  if (warp < items) start(warp);
  if constexpr (EARLY) {
    chained_kernel_entry();  // the wait for act, then the next kernel's launch, as the plain entry
    stage_rows<chunk_units<T>()>(xs, x, k, n_ff);
  }
  staged_wait();
  __syncthreads();
  for (int64_t it = warp; it < items; it += kCombineWarps) {
    if (it != warp) start(it);
    const int t0 = static_cast<int>(it % 2) * kRowsPerWarp;
    if (available(it)) {
      down_item<T>(a, a.ids, rows, row, it / 2, tile0 + t0, xs, ys, kCombineTile, t0, lane);
    } else if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) ys[(it / 2) * kCombineTile + t0 + r] = 0.0f;
    }
  }
  __syncthreads();
  combine_ranks(ys, kCombineTile, a.weights, row, k, tile0, n_embd, a.out);
}

}  // namespace

bool moe_decode_enabled() { return switches::on(Switch::cuda_moe_decode); }

bool launch_moe_decode_gate_up(const float* h, const int32_t* ids, const ExpertRef* table, const uint8_t* done,
                               float* act, const MoeShape& shape, Stream s, const CopyList& copies) {
  const size_t smem = static_cast<size_t>(shape.n_embd) * sizeof(float);
  if (!decode_product_ok(shape, shape.n_embd, h) || smem > kMaxStagedBytes) return false;
  const dim3 grid(static_cast<unsigned>(shape.n_rows * shape.k), blocks_for(shape.n_ff, kGateUpWarps * kGateUpRows));
  DecodeParams a{.h = h, .ids = ids, .table = table, .done = done, .act = act,
                 .k = shape.k, .n_embd = shape.n_embd, .n_ff = shape.n_ff};
  const auto st = static_cast<cudaStream_t>(s);
  if (copies.descs != nullptr) {
    a.copies = copies;
    a.copy_blocks = kCopyBlocks;
    const dim3 flat(static_cast<unsigned>(kCopyBlocks) + grid.x * grid.y);
    SLUICE_WITH_DECODE_WTYPE(shape.wtype, launch_chained(moe_decode_gate_up_copies_kernel<T>, flat,
                                                         dim3(kGateUpWarps * 32), smem, st, a,
                                                         static_cast<int32_t>(grid.x)))
  } else {
    SLUICE_WITH_DECODE_WTYPE(shape.wtype,
                             launch_chained(moe_decode_gate_up_kernel<T>, grid, dim3(kGateUpWarps * 32), smem, st, a))
  }
  CUDA_CHECK(cudaGetLastError());
  return true;
}

bool launch_moe_decode_down(const int32_t* ids, const ExpertRef* table, const uint8_t* done, const float* act,
                            float* pair_out, const MoeShape& shape, Stream s) {
  const size_t smem = static_cast<size_t>(shape.n_ff) * sizeof(float);
  if (!decode_product_ok(shape, shape.n_ff, act) || smem > kMaxStagedBytes) return false;
  const dim3 grid(static_cast<unsigned>(shape.n_rows * shape.k), blocks_for(shape.n_embd, kDownWarps * kRowsPerWarp));
  const DecodeParams a{.ids = ids, .table = table, .done = done, .act_in = act,
                       .pair_out = pair_out, .k = shape.k, .n_embd = shape.n_embd, .n_ff = shape.n_ff};
  SLUICE_WITH_DECODE_WTYPE(shape.wtype, launch_chained(moe_decode_down_kernel<T>, grid, dim3(kDownWarps * 32), smem,
                                                       static_cast<cudaStream_t>(s), a))
  CUDA_CHECK(cudaGetLastError());
  return true;
}

bool launch_moe_decode_down_combine(const int32_t* ids, const float* weights, const ExpertRef* table,
                                    const float* act, float* out, const MoeShape& shape, Stream s, bool early) {
  const size_t smem = static_cast<size_t>(shape.k) * (shape.n_ff + kCombineTile) * sizeof(float);
  if (!decode_product_ok(shape, shape.n_ff, act) || smem > kMaxStagedBytes) return false;
  const dim3 grid(static_cast<unsigned>(shape.n_rows), blocks_for(shape.n_embd, kCombineTile));
  const DecodeParams a{.ids = ids, .weights = weights, .table = table, .act_in = act, .out = out,
                       .k = shape.k, .n_embd = shape.n_embd, .n_ff = shape.n_ff};
  SLUICE_WITH_DECODE_WTYPE(shape.wtype,
                           launch_chained(early ? moe_decode_down_combine_kernel<T, true>
                                                : moe_decode_down_combine_kernel<T, false>,
                                          grid, dim3(kCombineWarps * 32), smem, static_cast<cudaStream_t>(s), a))
  CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace sluice::cuda
