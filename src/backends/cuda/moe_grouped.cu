// The grouped MoE expert kernels of a prefill (moe_kernels.h, launch_moe_experts_grouped and
// its three steps): the pairs grouped by expert on the device (moe_group_kernel), each expert's
// weights read once a tile of pairs, on the tensor cores (mma_tile.cuh: the activations split
// into their bf16 parts beforehand) or on the f32 FMA tiles for the other types and shapes.
#include "backends/cuda/moe_kernels.h"

#include "backends/cuda/kernels.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/mma_tile.cuh"
#include "backends/cuda/moe_common.cuh"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda {
namespace {

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

// The tensor-core form of moe_grouped_kernel (mma_tile.cuh's block_product_split, two
// stages), tiles of BM pairs x 64 columns, 128 threads; grid (ceil(cols / 64), max_tiles):
// block y takes tile y of moe_group_kernel's list (none past its count). Every expert's rows
// are 16-byte aligned (the launcher checks the shapes; tables hold 64-byte aligned blocks).
// The activations are split into their bf16 parts beforehand: gate/up (NMAT = 2) reads h's
// parts (part i of row r at x + i * xpart + r * kdim) and writes act = silu(g) * u as its three
// parts (y + i * ypart + pair * cols), which down (NMAT = 1) reads, writing f32 pair_out.
// dynamic shared memory: sizeof(PipeSmem<BM, NMAT>).
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

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The two tensor-core launches over the split activations (h's parts: launch_moe_grouped_prepare).
template <WType T, int BM>
void launch_grouped_mma_t(const int32_t* order, const int32_t* offsets, const int32_t* tiles, const ExpertRef* table,
                          float* pair_out, const MoeShape& shape, void* group, cudaStream_t st) {
  const int64_t pairs = shape.n_rows * shape.k;
  const auto bound = static_cast<unsigned>(max_tiles(pairs, shape.n_expert, BM));
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
}

template <WType T>
void launch_grouped_mma(const int32_t* order, const int32_t* offsets, const int32_t* tiles, const ExpertRef* table,
                        float* pair_out, const MoeShape& shape, void* group, cudaStream_t st) {
  if (grouped_mma_bm(shape) == 32) launch_grouped_mma_t<T, 32>(order, offsets, tiles, table, pair_out, shape, group, st);
  else launch_grouped_mma_t<T, 64>(order, offsets, tiles, table, pair_out, shape, group, st);
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
  if (tensor_cores)
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
      case WType::bf16: launch_grouped_mma<WType::bf16>(gi.order, gi.offsets, gi.tiles, table, pair_out, shape, p.group, st); break;
      case WType::q8: launch_grouped_mma<WType::q8>(gi.order, gi.offsets, gi.tiles, table, pair_out, shape, p.group, st); break;
      default: launch_grouped_mma<WType::q4>(gi.order, gi.offsets, gi.tiles, table, pair_out, shape, p.group, st); break;
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

}  // namespace sluice::cuda
