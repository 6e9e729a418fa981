// The persistent decode MoE step (moe_persistent.h). One launch of kPersistWarps-warp blocks,
// as many as are resident at once (the gate/up kernel's shape and register budget: 3 an SM),
// cooperative so that the grid barrier cannot wait for a block that never runs:
//
//   1. every block: each batch row's softmax top-k (router_topk.cuh) into shared memory;
//      block 0 also writes them out;
//   2. gate/up: the blocks walk the virtual blocks (pair, 16 ff rows) of
//      moe_decode_gate_up_kernel, gate_up_block's exact work;
//   3. each block asks L2 for its first down + combine tile's weight rows (prefetch, no
//      registers held), then waits at the grid barrier for every pair's act; the next
//      kernel may launch;
//   4. down + combine: tiles (batch row, kTileRows embd rows), warp w taking the ranks w,
//      w + kPersistWarps, ... (down_item), the ranks' sums combined in rank order
//      (combine_ranks), as moe_decode_down_combine_kernel.
//
// Why (docs/persistent-decode.md): the chained launches already hide launch latency, but
// each kernel boundary is a dependent round trip (a grid drains, the next one's first loads
// start); here the top-k costs no boundary and the down weights stream into L2 while the
// gate/up tail and the barrier run. (Holding them in registers across the barrier, as the
// down kernels hold their first chunks, spilled 1 KB a thread at 168 registers.)
#include "backends/cuda/moe_persistent.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/grid_barrier.cuh"
#include "backends/cuda/moe_decode_rows.cuh"
#include "backends/cuda/router_topk.cuh"

namespace sluice::cuda {
namespace {

using namespace decode;

constexpr int kPersistWarps = kGateUpWarps;  // a block's warps: gate_up_block's shape
constexpr int kTileRows = kRowsPerWarp;      // embd rows a down + combine tile: one warp item a rank
// Batch rows the step takes: every block routes every row before its first expert load, so
// larger batches (up to the grouped kernels' threshold) keep the chained launches until a
// measurement says otherwise (bench_cuda --moe measures 1 to 8).
constexpr int64_t kPersistentMaxRows = 8;

struct PersistentParams {
  DecodeParams d;                       // h, table, act (act_in the same), out, k, n_embd, n_ff
  const float* logits = nullptr;        // [n_rows, n_expert]
  const float* expert_scale = nullptr;  // [n_expert] or null
  int32_t* ids = nullptr;               // [n_rows * k] out (block 0)
  float* weights = nullptr;             // [n_rows * k] out (block 0)
  GridBarrierState* barrier = nullptr;
  int64_t n_rows = 0, n_expert = 0;
  bool norm = false;
};

// Shared memory: the routing (ids then weights, n_rows * k of each) rounded up to whole float4
// units, then the staging area (the larger of h's row and a row's k act rows), then the
// tile's rank sums [k][kTileRows].
__host__ __device__ inline int64_t routing_units(int64_t pairs) { return (2 * pairs + 3) / 4; }
inline size_t persistent_smem_bytes(int64_t pairs, int64_t k, int64_t n_embd, int64_t n_ff) {
  const int64_t stage = n_embd > k * n_ff ? n_embd : k * n_ff;
  return static_cast<size_t>(4 * routing_units(pairs) + stage + k * kTileRows) * sizeof(float);
}

// Asks L2 for tile (row, i0)'s down weights, the rows i0 .. i0 + kTileRows - 1 of each of the
// row's k experts (one contiguous range each, and its scales), a line a lane at a time: no
// registers held, so that the loads after the grid barrier find them in L2 while the barrier
// and the gate/up tail run.
__device__ __forceinline__ void prefetch_down_tile(const DecodeParams& d, const int32_t* ids, WType t, int64_t row,
                                                   int64_t i0) {
  constexpr int64_t kLine = 128;
  const int64_t rows = d.n_embd - i0 < kTileRows ? d.n_embd - i0 : kTileRows;
  const int64_t rb = dot_row_bytes(t, d.n_ff), sb = dot_scale_row_bytes(t, d.n_ff);
  for (int64_t rank = threadIdx.x / 32; rank < d.k; rank += kPersistWarps) {
    const ExpertRef& ref = d.table[ids[row * d.k + rank]];
    const uint8_t* w = static_cast<const uint8_t*>(ref.data[2]) + i0 * rb;
    for (int64_t at = (threadIdx.x % 32) * kLine; at < rows * rb; at += 32 * kLine)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + at));
    if (sb > 0 && threadIdx.x % 32 == 0) {
      const uint8_t* sc = static_cast<const uint8_t*>(ref.scales[2]) + i0 * sb;
      for (int64_t at = 0; at < rows * sb; at += kLine) asm volatile("prefetch.global.L2 [%0];" ::"l"(sc + at));
    }
  }
}

// MINB: blocks an SM the registers must allow: 3 (the gate/up kernel's, 168 registers; q4
// spills, docs/persistent-decode.md) or 2 (255 registers, no spills; fewer warps in flight).
template <WType T, int MINB>
__global__ void __launch_bounds__(kPersistWarps * 32, MINB) moe_decode_persistent_kernel(const PersistentParams a) {
  griddep_wait();  // the router product's logits; the next kernel may not launch before the barrier
  extern __shared__ float4 smem[];
  const int64_t n_rows = a.n_rows, k = a.d.k, n_embd = a.d.n_embd, n_ff = a.d.n_ff, pairs = n_rows * k;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t* s_ids = reinterpret_cast<int32_t*>(smem);  // [pairs]
  float* s_weights = reinterpret_cast<float*>(s_ids + pairs);  // [pairs]
  float4* xs = smem + routing_units(pairs);

  // 1. The routing of every row, in every block: the top-k kernel's body at the width it picks
  // for n_expert (a uniform branch), so that the two compile alike and round alike.
  for (int64_t row = warp; row < n_rows; row += kPersistWarps) {
    const float* l = a.logits + row * a.n_expert;
    SLUICE_WITH_TOPK_NV(a.n_expert, router_topk_warp<NV>(l, a.n_expert, k, a.norm, s_ids + row * k,
                                                         s_weights + row * k, a.expert_scale))
  }
  __syncthreads();
  if (blockIdx.x == 0)
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
      a.ids[p] = s_ids[p];
      a.weights[p] = s_weights[p];
    }
  const DecodeParams& d = a.d;  // the kernel parameter: read from the constant bank, no registers

  // 2. gate/up, moe_decode_gate_up_kernel's blocks.
  const int64_t ff_tiles = (n_ff + kGateUpWarps * kGateUpRows - 1) / (kGateUpWarps * kGateUpRows);
  for (int64_t vb = blockIdx.x; vb < pairs * ff_tiles; vb += gridDim.x) {
    __syncthreads();  // the last block's reads of xs are done before it is staged again
    gate_up_block<T>(d, s_ids, vb / ff_tiles, vb % ff_tiles, xs);
  }

  // 3. The first tile's down weights asked for, then every pair's act complete.
  const int64_t row_tiles = (n_embd + kTileRows - 1) / kTileRows, tiles = n_rows * row_tiles;
  if (blockIdx.x < tiles)
    prefetch_down_tile(d, s_ids, T, blockIdx.x / row_tiles, (blockIdx.x % row_tiles) * kTileRows);
  grid_barrier(a.barrier);
  griddep_launch_dependents();  // no barrier is left: the next kernel may take the room blocks free

  // 4. down + combine: moe_decode_down_combine_kernel's items (warp w: ranks w, w + 4, ...)
  // over tiles of kTileRows.
  float* ys = reinterpret_cast<float*>(xs + k * (n_ff / 4));  // [k][kTileRows]
  int64_t staged_row = -1;
  for (int64_t vt = blockIdx.x; vt < tiles; vt += gridDim.x) {
    const int64_t row = vt / row_tiles, i0 = (vt % row_tiles) * kTileRows;
    __syncthreads();  // the last tile's (or the gate/up's) reads of xs and ys are done
    if (row != staged_row) stage_rows<chunk_units<T>()>(xs, d.act_in + row * k * n_ff, k, n_ff);  // the row's pairs
    DownRows<T> rows;
    auto start = [&](int64_t rank) {
      set_down_rows<T>(rows, d.table[s_ids[row * k + rank]], i0, n_embd, n_ff);
      rows.begin(n_ff, lane);
    };
    if (warp < k) start(warp);
    if (row != staged_row) {
      staged_wait();
      staged_row = row;
    }
    __syncthreads();
    for (int64_t rank = warp; rank < k; rank += kPersistWarps) {
      if (rank != warp) start(rank);
      down_item<T>(d, s_ids, rows, row, rank, i0, xs, ys, kTileRows, 0, lane);
    }
    __syncthreads();
    combine_ranks(ys, kTileRows, s_weights, row, k, i0, n_embd, a.d.out);
  }
}


std::atomic<int64_t> g_launches{0};

// n grid barriers back to back (the barrier's own cost, for bench_cuda --moe).
__global__ void __launch_bounds__(kPersistWarps * 32) grid_barriers_kernel(GridBarrierState* state, int n) {
  for (int i = 0; i < n; ++i) grid_barrier(state);
}

// SLUICE_CUDA_PERSISTENT_BLOCKS=2: the variant compiled for 2 blocks an SM (to compare).
bool two_blocks_an_sm() {
  const char* e = std::getenv("SLUICE_CUDA_PERSISTENT_BLOCKS");
  return e && std::strcmp(e, "2") == 0;
}

// The SMs of the first device asked and whether it takes cooperative launches, chained ones
// too (once a process: devices of one host are alike).
struct DeviceFacts {
  int sms = 0;
  bool cooperative = false;          // cooperative launches, into a graph as well: the step can run
  bool chained_cooperative = false;  // and with programmatic stream serialization as well
};

// kernel<<<blocks, kPersistWarps warps, smem, st>>>(args...), cooperative (every block
// resident at once, or the launch fails) or not, chained (programmatic stream serialization:
// it may start under the previous kernel's tail) or not; the launch's own error.
template <typename... Params, typename... Args>
cudaError_t launch_blocks(void (*kernel)(Params...), unsigned blocks, size_t smem, cudaStream_t st, bool cooperative,
                          bool chained, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kPersistWarps * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  if (chained) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(n);
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The probe kernel (no barrier: grid_barriers_kernel with n = 0) of `blocks` blocks on st.
cudaError_t launch_probe(cudaStream_t st, unsigned blocks, bool cooperative, bool chained) {
  GridBarrierState* none = nullptr;
  return launch_blocks(grid_barriers_kernel, blocks, 0, st, cooperative, chained, none, 0);
}

// Whether the step's launch works as the decode graph makes it, on a stream of its own: a
// chained kernel (the router product) then the cooperative one (chained too when `chained`),
// enqueued directly and then captured into a graph that is instantiated and launched, all
// waited for. Outside any other capture (a refused launch could spoil it): CudaBackend's
// constructor asks first. Errors here are configuration errors, which are not sticky.
bool cooperative_launch_works(bool chained) {
  cudaStream_t st = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto pair = [&] {
    cudaError_t e = launch_probe(st, 4, false, true);
    return e == cudaSuccess ? launch_probe(st, 4, true, chained) : e;
  };
  cudaError_t err = pair();
  if (err == cudaSuccess) err = cudaStreamSynchronize(st);
  if (err == cudaSuccess) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    err = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (err == cudaSuccess) {
      const cudaError_t launched = pair();
      err = cudaStreamEndCapture(st, &g);
      if (launched != cudaSuccess) err = launched;
    }
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, g, 0);
    if (err == cudaSuccess) err = cudaGraphLaunch(exec, st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(st);
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (g) (void)cudaGraphDestroy(g);
  }
  if (err != cudaSuccess) (void)cudaGetLastError();
  CUDA_CHECK(cudaStreamDestroy(st));
  return err == cudaSuccess;
}

// The current device's facts, learned once each (a host may hold unlike devices).
const DeviceFacts& device_facts() {
  static std::mutex mu;
  static std::map<int, DeviceFacts> by_device;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lk(mu);
  auto it = by_device.find(dev);
  if (it != by_device.end()) return it->second;
  int sms = 0, coop = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  DeviceFacts f{sms, false, false};
  if (coop != 0) {
    f.chained_cooperative = cooperative_launch_works(true);
    f.cooperative = f.chained_cooperative || cooperative_launch_works(false);
  }
  return by_device.emplace(dev, f).first->second;  // std::map: the reference stays valid
}

template <WType T, int MINB>
void launch_t(const PersistentParams& p, size_t smem, int sms, int64_t work_blocks, cudaStream_t st) {
  auto* kernel = moe_decode_persistent_kernel<T, MINB>;
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kPersistWarps * 32, smem));
  SLUICE_CHECK(per_sm > 0, Status::internal, "cuda persistent moe: no block fits an SM (", smem,
               " bytes of shared memory)");
  const int64_t grid = std::min<int64_t>(int64_t{per_sm} * sms, work_blocks);
  // Chained, so that it may start under the router product's tail, where the driver takes both.
  CUDA_CHECK(launch_blocks(kernel, static_cast<unsigned>(grid), smem, st, true,
                           chained_launches_enabled() && device_facts().chained_cooperative, p));
}

}  // namespace

bool moe_persistent_requested() { return env_is("SLUICE_CUDA_PERSISTENT", "1"); }

void persistent_step_probe() { (void)device_facts(); }

bool launch_moe_decode_persistent(const PersistentMoeArgs& a, Stream s) {
  const DeviceFacts& facts = device_facts();
  const MoeShape& shape = a.shape;
  const int64_t pairs = shape.n_rows * shape.k;
  if (!facts.cooperative || pairs == 0 || shape.n_rows > kPersistentMaxRows || shape.k > 32 ||
      shape.k > shape.n_expert || shape.n_expert > 512 ||
      !decode_product_ok(shape, shape.n_embd, a.h) || !decode_product_ok(shape, shape.n_ff, a.act))
    return false;
  const size_t smem = persistent_smem_bytes(pairs, shape.k, shape.n_embd, shape.n_ff);
  if (smem > kMaxStagedBytes) return false;
  SLUICE_CHECK(a.barrier != nullptr, Status::internal, "cuda persistent moe: no barrier state");
  const PersistentParams p{.d = {.h = a.h, .table = a.table, .act = a.act, .act_in = a.act, .out = a.out,
                                 .k = shape.k, .n_embd = shape.n_embd, .n_ff = shape.n_ff},
                           .logits = a.logits, .expert_scale = a.expert_scale, .ids = a.ids,
                           .weights = a.weights, .barrier = a.barrier, .n_rows = shape.n_rows,
                           .n_expert = shape.n_expert, .norm = a.norm_topk};
  const int64_t ff_tiles = blocks_for(shape.n_ff, kGateUpWarps * kGateUpRows);
  const int64_t tiles = shape.n_rows * blocks_for(shape.n_embd, kTileRows);
  const int64_t work = std::max(pairs * ff_tiles, tiles);
  const auto st = static_cast<cudaStream_t>(s);
  if (two_blocks_an_sm()) SLUICE_WITH_DECODE_WTYPE(shape.wtype, launch_t<T, 2>(p, smem, facts.sms, work, st))
  else SLUICE_WITH_DECODE_WTYPE(shape.wtype, launch_t<T, 3>(p, smem, facts.sms, work, st))
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int64_t moe_persistent_launches() { return g_launches.load(std::memory_order_relaxed); }

void launch_grid_barriers(GridBarrierState* state, int n, int blocks_per_sm, Stream s) {
  const DeviceFacts& facts = device_facts();
  SLUICE_CHECK(facts.cooperative, Status::unsupported, "cuda: this device takes no cooperative launches");
  CUDA_CHECK(launch_blocks(grid_barriers_kernel, static_cast<unsigned>(facts.sms * blocks_per_sm), 0,
                           static_cast<cudaStream_t>(s), true, false, state, n));
}

}  // namespace sluice::cuda
