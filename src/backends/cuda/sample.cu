// Sampling on the device: see sample.h for the rules. One block of kThreads per row; thread t
// owns the contiguous ids [t c, (t + 1) c), c = ceil(n_valid / kThreads), so "lowest id first"
// orders are a block-wide exclusive scan of per-thread counts plus an in-order walk of the
// thread's own ids. The kept sets are found without sorting:
//   top-k: a 4-pass radix select (8 bits a pass) of the k-th largest scaled logit, as an
//          order-preserving 32-bit key; equal keys are kept lowest id first until k;
//   top-p: the same radix walk over the probabilities, but each digit's bin holds the mass of
//          its tokens, so the walk stops at the value v* where the mass above v* is below top_p
//          and the mass down to v* reaches it; tokens equal to v* are kept lowest id first
//          while the mass before them is below top_p (the host's sorted walk).
// Masses are summed as 2^-40 fixed point in 64-bit integers, so every sum is exact and the
// result does not depend on the order atomics land in (a seed reproduces a run). Per pass the
// row is read again (n_valid floats, from L2 after the first pass): ~10 passes of 600 KB for a
// 151936-token vocabulary from one SM, ~140 us a token at temperature 1 on an H100 (against
// ~0.5 ms for the copy to the host and a host pass).
//
// Greedy rows take sample_greedy_kernel instead: the one block above reads the whole row in
// 149 serial loads a thread (39 us on the H200 for 151936 logits, 4% of a 12-layer decode
// token). There kGreedyBlocks blocks a row each reduce a slice in 16-byte loads to (max,
// lowest id, NaN/inf seen), and the last block of the row to finish reduces those partials.
// Sampled rows take the greedy kernel for the maximum too, then sample_blocks.cu's kernels
// over many blocks a row (the one-block kernel below stays for more than kSampleMaxRows
// rows).
#include "backends/cuda/sample.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backends/cuda/common.cuh"
#include "backends/cuda/sample_rule.cuh"

namespace sluice::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kGreedyBlocks = kSampleBlocks, kGreedyThreads = kSampleThreads;

struct Best {
  float v;
  int32_t id;
};
struct BestOp {  // the larger value; among equal values the lower id
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (b.id < 0) return a;
    if (a.id < 0) return b;
    return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
  }
};

// The kept-set rule of one pass over a thread's ids, in id order: call keep(key) for each
// token in order; it answers whether the token is kept, counting the tokens equal to the
// threshold that came before (within this thread: `seen`, before it: `before`).
struct TopkRule {
  bool on = false;
  uint32_t key = 0;           // the k-th largest key
  unsigned long long need = 0;  // tokens equal to it that are kept
  unsigned long long before = 0;  // tokens equal to it with a lower id, in earlier threads
  unsigned long long seen = 0;
  __device__ bool keep(uint32_t k) {
    if (!on || k > key) return true;
    if (k < key) return false;
    return before + seen++ < need;
  }
};

struct ToppRule {
  bool on = false;
  uint32_t key = 0;                  // key of the last value v* the nucleus reaches
  unsigned long long above = 0;      // mass of the kept tokens above v*
  unsigned long long target = 0;     // top_p in fixed point
  unsigned long long before = 0;     // mass of tokens equal to v* in earlier threads
  unsigned long long seen = 0;
  __device__ bool keep(uint32_t k, unsigned long long mass) {
    if (!on || k > key) return true;
    if (k < key) return false;
    const bool in = above + before + seen < target;
    seen += mass;
    return in;
  }
};

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  chained_kernel_entry();
  using ReduceF = cub::BlockReduce<float, kThreads>;
  using ReduceBest = cub::BlockReduce<Best, kThreads>;
  using ScanU = cub::BlockScan<unsigned long long, kThreads>;
  using ScanF = cub::BlockScan<float, kThreads>;
  __shared__ union {
    typename ReduceF::TempStorage rf;
    typename ReduceBest::TempStorage rb;
    typename ScanU::TempStorage su;
    typename ScanF::TempStorage sf;
  } tmp;
  __shared__ unsigned long long hist[256];
  __shared__ uint32_t sh_key;
  __shared__ unsigned long long sh_u;
  __shared__ int sh_flag;
  __shared__ float sh_f;
  __shared__ int32_t sh_id;

  const int t = threadIdx.x;
  const int64_t r = blockIdx.x;
  const float* row = p.logits + r * p.vocab;
  const int64_t V = p.n_valid, chunk = (V + kThreads - 1) / kThreads;
  const int64_t lo = t * chunk < V ? t * chunk : V, hi = lo + chunk < V ? lo + chunk : V;

  // Greedy choice and the check for NaN / +inf.
  Best best{-INFINITY, -1};
  int bad = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const float x = row[i];
    bad |= isnan(x) || x == INFINITY;
    if (best.id < 0 || x > best.v) best = {x, static_cast<int32_t>(i)};
  }
  const int any_bad = __syncthreads_or(bad);
  const Best b = ReduceBest(tmp.rb).Reduce(best, BestOp());
  if (t == 0) sh_id = b.id;
  __syncthreads();
  if (any_bad || V <= 0 || sh_id < 0) {
    if (t == 0) p.ids[r] = -1;
    return;
  }
  if (p.temperature < kSampleKernelGreedyTemperature) {
    if (t == 0) p.ids[r] = sh_id;
    return;
  }
  // s = (l - max l) / T <= 0: no temperature makes it overflow; the largest s is 0.
  const float T = p.temperature, top = row[sh_id], mx = 0.0f;

  // Top-k: radix select of the k-th largest key of s.
  TopkRule topk;
  if (p.top_k > 0 && p.top_k < V) {
    uint32_t prefix = 0, mask = 0;
    unsigned long long need = static_cast<unsigned long long>(p.top_k);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int j = t; j < 256; j += kThreads) hist[j] = 0;
      __syncthreads();
      for (int64_t i = lo; i < hi; ++i) {
        const uint32_t key = order_key((row[i] - top) / T);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1ull);
      }
      __syncthreads();
      if (t == 0) {
        unsigned long long above = 0;
        int digit = 255;
        for (; digit > 0; --digit) {
          if (above + hist[digit] >= need) break;
          above += hist[digit];
        }
        sh_key = prefix | (static_cast<uint32_t>(digit) << shift);
        sh_u = need - above;
      }
      __syncthreads();
      prefix = sh_key;
      need = sh_u;
      mask |= 255u << shift;
      __syncthreads();
    }
    unsigned long long equal = 0;
    for (int64_t i = lo; i < hi; ++i) equal += order_key((row[i] - top) / T) == prefix;
    unsigned long long before = 0;
    ScanU(tmp.su).ExclusiveSum(equal, before);
    __syncthreads();
    topk = {true, prefix, need, before, 0};
  }

  // Softmax over the kept tokens: p_i = exp(s_i) / z.
  float zt = 0.0f;
  {
    TopkRule k = topk;
    for (int64_t i = lo; i < hi; ++i) {
      const float s = (row[i] - top) / T;
      if (k.keep(order_key(s))) zt += expf(s - mx);
    }
  }
  const float z_all = ReduceF(tmp.rf).Sum(zt);
  if (t == 0) sh_f = z_all;
  __syncthreads();
  const float z = sh_f;

  // Top-p: radix walk over the probabilities' keys with mass bins.
  ToppRule topp;
  if (p.top_p < 1.0f) {
    // At least one 2^-40 unit: a top_p below it keeps the most likely token (as the host).
    unsigned long long target = static_cast<unsigned long long>(static_cast<double>(p.top_p) * kMassOne);
    if (target == 0) target = 1;
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = 0;
    bool all = false;
    for (int shift = 24; shift >= 0 && !all; shift -= 8) {
      for (int j = t; j < 256; j += kThreads) hist[j] = 0;
      __syncthreads();
      TopkRule k = topk;
      for (int64_t i = lo; i < hi; ++i) {
        const float s = (row[i] - top) / T;
        if (!k.keep(order_key(s))) continue;
        const float pi = expf(s - mx) / z;
        const uint32_t key = order_key(pi);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], fixed_mass(pi));
      }
      __syncthreads();
      if (t == 0) {
        int digit = 255;
        for (; digit >= 0; --digit) {
          if (above + hist[digit] >= target) break;
          above += hist[digit];
        }
        sh_flag = digit < 0;  // the kept mass never reaches top_p (rounding): keep them all
        sh_key = prefix | (static_cast<uint32_t>(digit < 0 ? 0 : digit) << shift);
        sh_u = above;
      }
      __syncthreads();
      all = sh_flag;
      prefix = sh_key;
      above = sh_u;
      mask |= 255u << shift;
      __syncthreads();
    }
    if (!all) {
      unsigned long long equal_mass = 0;
      TopkRule k = topk;
      for (int64_t i = lo; i < hi; ++i) {
        const float s = (row[i] - top) / T;
        if (!k.keep(order_key(s))) continue;
        const float pi = expf(s - mx) / z;
        if (order_key(pi) == prefix) equal_mass += fixed_mass(pi);
      }
      unsigned long long before = 0;
      ScanU(tmp.su).ExclusiveSum(equal_mass, before);
      __syncthreads();
      topp = {true, prefix, above, target, before, 0};
    }
  }

  // The draw: the first kept token, in id order, whose cumulative probability exceeds u * total.
  float w = 0.0f;
  int32_t last_kept = -1;
  {
    TopkRule k = topk;
    ToppRule q = topp;
    for (int64_t i = lo; i < hi; ++i) {
      const float s = (row[i] - top) / T;
      if (!k.keep(order_key(s))) continue;
      const float pi = expf(s - mx) / z;
      if (!q.keep(order_key(pi), fixed_mass(pi))) continue;
      w += pi;
      last_kept = static_cast<int32_t>(i);
    }
  }
  float excl = 0.0f, total = 0.0f;
  ScanF(tmp.sf).ExclusiveSum(w, excl, total);
  if (t == 0) sh_id = INT32_MAX;
  __syncthreads();
  const float u = static_cast<float>(static_cast<double>(p.uniform[r]) * 0x1p-53 * static_cast<double>(total));
  if (w > 0.0f && excl <= u && u < excl + w) {
    TopkRule k = topk;
    ToppRule q = topp;
    float acc = excl;
    for (int64_t i = lo; i < hi; ++i) {
      const float s = (row[i] - top) / T;
      if (!k.keep(order_key(s))) continue;
      const float pi = expf(s - mx) / z;
      if (!q.keep(order_key(pi), fixed_mass(pi))) continue;
      acc += pi;
      if (u < acc) {
        atomicMin(&sh_id, static_cast<int32_t>(i));
        break;
      }
    }
  }
  __syncthreads();
  const bool none = sh_id == INT32_MAX;
  __syncthreads();
  if (none) {  // u at the very end (rounding of the scan): the last kept token
    if (t == 0) sh_id = -1;
    __syncthreads();
    if (last_kept >= 0) atomicMax(&sh_id, last_kept);
    __syncthreads();
  }
  if (t == 0) p.ids[r] = sh_id;
}

// Greedy: grid (kGreedyBlocks, n). Partials [n][kGreedyBlocks] of (value, id, bad) in `part`;
// counters[row] is zero before and after (the last block resets it).
__global__ void __launch_bounds__(kGreedyThreads)
    sample_greedy_kernel(SampleParams p, GreedyPartial* __restrict__ part, int* __restrict__ counters) {
  chained_kernel_entry();
  using ReduceBest = cub::BlockReduce<Best, kGreedyThreads>;
  __shared__ typename ReduceBest::TempStorage rb;
  __shared__ bool last;
  const int t = threadIdx.x, B = gridDim.x, b = blockIdx.x;
  const int64_t r = blockIdx.y;
  const float* row = p.logits + r * p.vocab;
  const int64_t V = p.n_valid;
  // Slice [lo, hi) of the row, whole float4s when the row is 16-byte aligned.
  const int64_t per = ((V + B - 1) / B + 3) / 4 * 4;
  const int64_t lo = b * per < V ? b * per : V, hi = lo + per < V ? lo + per : V;
  Best best{-INFINITY, -1};
  int bad = 0;
  auto consider = [&](float x, int64_t i) {  // ids rise within a thread: a tie keeps the first
    bad |= isnan(x) || x == INFINITY;
    if (best.id < 0 || x > best.v) best = {x, static_cast<int32_t>(i)};
  };
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const int64_t n4 = (hi - lo) / 4;
    const float4* row4 = reinterpret_cast<const float4*>(row + lo);
#pragma unroll 4
    for (int64_t i = t; i < n4; i += kGreedyThreads) {
      const float4 x = __ldg(row4 + i);
      const int64_t at = lo + 4 * i;
      consider(x.x, at);
      consider(x.y, at + 1);
      consider(x.z, at + 2);
      consider(x.w, at + 3);
    }
    for (int64_t i = lo + 4 * n4 + t; i < hi; i += kGreedyThreads) consider(row[i], i);
  } else {
    for (int64_t i = lo + t; i < hi; i += kGreedyThreads) consider(row[i], i);
  }
  const int any_bad = __syncthreads_or(bad);
  const Best bb = ReduceBest(rb).Reduce(best, BestOp());
  if (t == 0) {
    part[r * B + b] = {bb.v, bb.id, any_bad};
    __threadfence();
    last = atomicAdd(counters + r, 1) == B - 1;
    if (last) counters[r] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Best all{-INFINITY, -1};
  int all_bad = 0;
  for (int i = t; i < B; i += kGreedyThreads) {
    const volatile GreedyPartial* q = part + r * B + i;  // other blocks wrote it: not from L1
    all_bad |= q->bad;
    all = BestOp()(all, Best{q->v, q->id});
  }
  const int rows_bad = __syncthreads_or(all_bad);
  const Best w = ReduceBest(rb).Reduce(all, BestOp());
  if (t == 0) {
    p.ids[r] = (rows_bad || w.id < 0) ? -1 : w.id;
    if (p.row_best) p.row_best[r] = {w.v, w.id, rows_bad};  // the sampled draw's maximum (sample_blocks.cu)
  }
  if (p.select) p.select[r].hist[t] = 0;  // the radix passes' bins start at zero (kGreedyThreads = 256)
}

}  // namespace

int64_t sample_greedy_partials(int64_t n) { return n * kGreedyBlocks; }

bool sample_by_temperature_alone(float temperature, int64_t top_k, float top_p, int64_t n_valid) {
  return temperature >= kSampleKernelGreedyTemperature && (top_k <= 0 || top_k >= n_valid) && top_p >= 1.0f;
}

void launch_sample(const SampleParams& p, Stream s) {
  SLUICE_CHECK(p.n >= 0 && p.vocab > 0 && p.n_valid > 0 && p.n_valid <= p.vocab && p.n_valid <= INT32_MAX &&
                   p.temperature >= 0.0f && p.top_k >= 0 && p.top_p > 0.0f && p.top_p <= 1.0f,
               Status::internal, "cuda sample: vocab ", p.vocab, ", n_valid ", p.n_valid, ", temperature ",
               p.temperature, ", top_k ", p.top_k, ", top_p ", p.top_p);
  if (p.n == 0) return;
  const bool greedy = p.temperature < kSampleKernelGreedyTemperature;
  const bool sampled_blocks =
      !greedy && p.row_best && p.block_sums &&
      (p.select || sample_by_temperature_alone(p.temperature, p.top_k, p.top_p, p.n_valid));
  if ((greedy || sampled_blocks) && p.greedy_partials && p.greedy_counters && p.n <= kSampleMaxRows) {
    const dim3 grid(kGreedyBlocks, static_cast<unsigned>(p.n));
    SampleParams g = p;
    if (greedy) {
      g.row_best = nullptr;
      g.select = nullptr;
    }
    launch_chained(sample_greedy_kernel, grid, dim3(kGreedyThreads), 0, static_cast<cudaStream_t>(s), g,
                   p.greedy_partials, p.greedy_counters);
    CUDA_CHECK(cudaGetLastError());
    if (!greedy) launch_sample_draw_blocks(p, s);
    return;
  }
  launch_chained(sample_kernel, dim3(static_cast<unsigned>(p.n)), dim3(kThreads), 0, static_cast<cudaStream_t>(s), p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
