// The sampled draw over kSampleBlocks blocks a row (sample.h's rule), after sample.cu's greedy
// kernel wrote row_best (the row's maximum, NaN / +inf seen). The one-block kernel (sample.cu)
// reads a 151936-token row ~10 times from one SM (~140 us a token on an H100 at temperature 1,
// more with top-k and top-p); here each pass is a launch of B = 64 blocks a row, block b owning
// the slice [b per, (b + 1) per), per = ceil(n_valid / B), the same slices in every launch:
//
//   top-k (0 < k < n_valid):  4 radix passes (8 bits of order_key(s) a pass, from the top):
//                             each block histograms its slice into hist, the row's last block
//                             picks the digit (the one-block kernel's walk) and zeroes hist;
//   z (top-p):                the softmax's sum over the tokens top-k keeps, and the count of
//                             tokens at the top-k threshold in each slice and before it (top-k
//                             alone needs no normalization: the draw counts those itself);
//   top-p (top_p < 1):        4 radix passes over order_key(p) of the tokens top-k keeps, each
//                             bin their mass in 2^-40 units (exact, order-free sums);
//   the draw:                 each block sums its slice's kept weights; the row's last block
//                             finds the slice the draw u * (their total) falls in and walks it.
//
// Tokens at a threshold all have one value (equal keys), so which of them a rule keeps
// (lowest ids first, as the one-block kernel and the host) is a count: those of a slice kept
// are need - (those in the slices before), clamped to [0, the slice's]; only the slice the
// draw walks needs them in id order, by a scan over its threads. A temperature alone is the
// draw alone (z = 1: the weights exp(s)), top-k alone its passes and the draw. Scratch:
// SampleSelectRow per row (rule with top-k or top-p), block_sums, and greedy_counters (each
// launch's last block resets its row's).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backends/cuda/common.cuh"
#include "backends/cuda/sample_rule.cuh"

namespace sluice::cuda {
namespace {

constexpr int B = kSampleBlocks, kT = kSampleThreads;
static_assert(kT == 256, "a radix pass's thread t owns bin 255 - t");

struct Range {
  int64_t lo, hi;
};
// Slice b of a row's n_valid ids.
__device__ __forceinline__ Range slice_of(int b, int64_t V) {
  const int64_t per = (V + B - 1) / B;
  const int64_t lo = b * per < V ? b * per : V;
  return {lo, lo + per < V ? lo + per : V};
}
// Thread t's contiguous run of a slice (the walk in id order).
__device__ __forceinline__ Range run_of(Range s, int t) {
  const int64_t each = (s.hi - s.lo + kT - 1) / kT;
  const int64_t lo = s.lo + t * each < s.hi ? s.lo + t * each : s.hi;
  return {lo, lo + each < s.hi ? lo + each : s.hi};
}

// Of `count` tokens at a threshold with `before` such tokens at lower ids, those kept when the
// rule keeps the first `need`.
__device__ __forceinline__ unsigned long long kept_of(unsigned long long need, unsigned long long before,
                                                      unsigned long long count) {
  const unsigned long long left = need > before ? need - before : 0;
  return left < count ? left : count;
}
__device__ __forceinline__ long long left_of(unsigned long long need, unsigned long long before) {
  const unsigned long long left = need > before ? need - before : 0;
  return left > 0x7fffffffffffffffull ? 0x7fffffffffffffffll : static_cast<long long>(left);
}

// A row's rule as the kernels after the thresholds see it: s_i = (l_i - top) / T, p_i =
// exp(s_i) / z; top-k keeps keys of s above k_key and the first k_need at it, top-p keeps keys
// of p above p_key and the first p_need at it (of those top-k keeps).
struct RowRule {
  float top, T, z;
  bool k_on, p_on;
  uint32_t k_key, p_key;
  unsigned long long k_need, p_need;
};

__device__ __forceinline__ bool top_k_on(const SampleParams& p) { return p.top_k > 0 && p.top_k < p.n_valid; }
__device__ __forceinline__ bool top_p_on(const SampleParams& p) { return p.top_p < 1.0f; }

// The rule as far as the kernels before this one have found it: the thresholds only when
// `thresholds` (the draw), z only when `with_z` (after the z kernel).
__device__ RowRule row_rule(const SampleParams& p, const GreedyPartial& best, int64_t r, bool with_z, bool thresholds) {
  RowRule q{best.v, p.temperature, 1.0f, false, false, 0, 0, 0, 0};
  if (!p.select) return q;  // temperature alone
  const SampleSelectRow& st = p.select[r];
  if (with_z) q.z = st.z;
  q.k_on = top_k_on(p);
  if (q.k_on) {
    q.k_key = st.k_key;
    q.k_need = st.k_need;
  }
  q.p_on = thresholds && top_p_on(p) && !st.p_all;
  if (q.p_on) {
    q.p_key = st.p_key;
    q.p_need = st.p_need;
  }
  return q;
}

// One token of a thread's walk in id order: its weight p_i, or -1 when the rule drops it.
// k_left / p_left are the tokens at the top-k / top-p thresholds still kept; a token at a
// threshold takes one (top-p's only when apply_p). at_p: the token is at the top-p threshold
// and top-k keeps it.
__device__ __forceinline__ float walk_token(const RowRule& q, float s, long long& k_left, long long& p_left,
                                            bool apply_p, bool& at_p) {
  at_p = false;
  if (q.k_on) {
    const uint32_t ks = order_key(s);
    if (ks < q.k_key) return -1.0f;
    if (ks == q.k_key && k_left-- <= 0) return -1.0f;
  }
  const float pi = expf(s) / q.z;
  if (q.p_on) {
    const uint32_t kp = order_key(pi);
    if (kp < q.p_key) return -1.0f;
    if (kp == q.p_key) {
      at_p = true;
      if (apply_p && p_left-- <= 0) return -1.0f;
    }
  }
  return pi;
}

// Every block of a row has finished its part (its writes, then this): true in the last one,
// which resets the row's counter for the next launch. Call from every thread.
__device__ bool last_block_of_row(int* counters, int64_t r) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counters + r, 1) == B - 1;
    if (last) counters[r] = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

enum class Pass { top_k, top_p };

// Radix pass `pass` (0..3; digit bits [24 - 8 pass, 32 - 8 pass) of the key) of the top-k
// threshold (keys of s, bins count tokens) or the top-p one (keys of p over the tokens top-k
// keeps, bins sum their masses). The last block picks the digit as the one-block kernel does:
// top-k, the largest digit at which the count from the top reaches the need (digit 0 at the
// latest); top-p, the largest at which the mass from the top reaches top_p (none: every token
// stays).
template <Pass kPass>
__global__ void __launch_bounds__(kT) sample_pass_kernel(SampleParams p, int pass) {
  chained_kernel_entry();
  using ScanU = cub::BlockScan<unsigned long long, kT>;
  __shared__ typename ScanU::TempStorage scan;
  __shared__ unsigned long long hist[256];
  __shared__ int pick;
  const int t = threadIdx.x, b = blockIdx.x;
  const int64_t r = blockIdx.y;
  const GreedyPartial best = p.row_best[r];
  if (best.bad || best.id < 0) return;  // ids[r] is -1 already
  SampleSelectRow& st = p.select[r];
  if (kPass == Pass::top_p && pass > 0 && st.p_all) return;
  const RowRule q = row_rule(p, best, r, kPass == Pass::top_p, false);
  const int shift = 24 - 8 * pass;
  const uint32_t mask = pass == 0 ? 0u : ~0u << (32 - 8 * pass), prefix = pass == 0 ? 0u : st.prefix;
  hist[t] = 0;
  __syncthreads();
  // Consecutive tokens of a thread mostly share a bin (early passes: a handful of bins for the
  // whole row): added up in a register and flushed when the bin changes.
  int cur = -1;
  unsigned long long acc = 0;
  auto add = [&](uint32_t key, unsigned long long v) {
    if ((key & mask) != prefix) return;
    const int d = static_cast<int>((key >> shift) & 255u);
    if (d != cur) {
      if (cur >= 0) atomicAdd(&hist[cur], acc);
      cur = d;
      acc = 0;
    }
    acc += v;
  };
  const float* row = p.logits + r * p.vocab;
  const Range sl = slice_of(b, p.n_valid);
  for (int64_t i = sl.lo + t; i < sl.hi; i += kT) {
    const float s = (row[i] - q.top) / q.T;
    if constexpr (kPass == Pass::top_k) {
      add(order_key(s), 1);
    } else {
      if (q.k_on && order_key(s) <= q.k_key) continue;  // at the threshold: counted below
      const float pi = expf(s) / q.z;
      add(order_key(pi), fixed_mass(pi));
    }
  }
  if constexpr (kPass == Pass::top_p) {
    // The slice's tokens at the top-k threshold that top-k keeps: one value, their mass at once.
    if (q.k_on && t == 0) {
      const unsigned long long kept = kept_of(q.k_need, st.k_before[b], st.k_count[b]);
      if (kept) {
        const float pi = expf(key_value(q.k_key)) / q.z;
        add(order_key(pi), kept * fixed_mass(pi));
      }
    }
  }
  if (cur >= 0) atomicAdd(&hist[cur], acc);
  __syncthreads();
  if (hist[t]) atomicAdd(&st.hist[t], hist[t]);
  if (!last_block_of_row(p.greedy_counters, r)) return;

  // The row's bins from the top: thread t holds digit 255 - t.
  volatile unsigned long long* g = st.hist;
  const unsigned long long h = g[255 - t];
  g[255 - t] = 0;
  unsigned long long excl = 0;
  ScanU(scan).ExclusiveSum(h, excl);
  const unsigned long long want = kPass == Pass::top_k ? (pass == 0 ? static_cast<unsigned long long>(p.top_k) : st.rem)
                                                       : fixed_target(p.top_p);
  const unsigned long long above = kPass == Pass::top_k || pass == 0 ? 0 : st.rem;  // top-p: mass above the prefix
  if (t == 0) pick = 256;
  __syncthreads();
  if (above + excl + h >= want) atomicMin(&pick, t);
  __syncthreads();
  int at = pick;
  if (kPass == Pass::top_k && at == 256) at = 255;  // digit 0
  if (at == 256) {  // top-p: the kept mass never reaches top_p
    if (t == 0) st.p_all = 1;
    return;
  }
  if (t != at) return;
  const uint32_t key = prefix | (static_cast<uint32_t>(255 - t) << shift);
  const unsigned long long rem = kPass == Pass::top_k ? want - excl : above + excl;
  st.prefix = key;
  st.rem = rem;
  if (kPass == Pass::top_p) st.p_all = 0;
  if (pass < 3) return;
  if constexpr (kPass == Pass::top_k) {
    st.k_key = key;
    st.k_need = rem;
  } else {
    // Tokens at the threshold each weigh m: the j-th (from 0, lowest id first) is kept while
    // above + j m < top_p, as the one-block kernel's walk.
    const unsigned long long m = fixed_mass(key_value(key)), target = fixed_target(p.top_p);
    st.p_key = key;
    st.p_need = m == 0 ? ~0ull : (target - rem + m - 1) / m;
  }
}

// z over the tokens top-k keeps (those at its threshold: k_need of one value), and the count
// of tokens at the threshold in each slice (k_count) and before it (k_before).
__global__ void __launch_bounds__(kT) sample_z_kernel(SampleParams p) {
  chained_kernel_entry();
  using ReduceF = cub::BlockReduce<float, kT>;
  using ReduceU = cub::BlockReduce<unsigned long long, kT>;
  __shared__ union {
    typename ReduceF::TempStorage f;
    typename ReduceU::TempStorage u;
  } red;
  const int t = threadIdx.x, b = blockIdx.x;
  const int64_t r = blockIdx.y;
  const GreedyPartial best = p.row_best[r];
  if (best.bad || best.id < 0) return;
  SampleSelectRow& st = p.select[r];
  const RowRule q = row_rule(p, best, r, false, false);
  const float* row = p.logits + r * p.vocab;
  const Range sl = slice_of(b, p.n_valid);
  float z = 0.0f;
  unsigned long long at = 0;
  for (int64_t i = sl.lo + t; i < sl.hi; i += kT) {
    const float s = (row[i] - q.top) / q.T;
    if (q.k_on) {
      const uint32_t ks = order_key(s);
      if (ks < q.k_key) continue;
      if (ks == q.k_key) {
        ++at;
        continue;
      }
    }
    z += expf(s);
  }
  const float zb = ReduceF(red.f).Sum(z);
  __syncthreads();
  const unsigned long long ab = ReduceU(red.u).Sum(at);
  if (t == 0) {
    st.z_part[b] = zb;
    st.k_count[b] = ab;
  }
  if (!last_block_of_row(p.greedy_counters, r) || t != 0) return;
  const volatile SampleSelectRow& v = st;  // other blocks wrote it: not from L1
  float all = 0.0f;
  unsigned long long before = 0;
  for (int i = 0; i < B; ++i) {
    all += v.z_part[i];
    st.k_before[i] = before;
    before += v.k_count[i];
  }
  if (q.k_on) all += static_cast<float>(q.k_need) * expf(key_value(q.k_key));
  st.z = all;
}

// The draw. Every block: its slice's kept weight, the tokens at the top-p threshold apart
// (block_sums[b], p_count[b]). The last block: each slice's kept threshold tokens, the slice
// the draw falls in (the slices' weights in order), then that slice's walk in id order: its
// threads' weights again (a scan), and the one thread's run the draw falls in. Rounding
// fallbacks: the run's last kept token, else the slice's, else the row's maximum (kept by
// every rule).
//
// z_ran: the z kernel ran (always with top-p). Without it (top-k alone) the weights are
// exp(s) (z = 1: the draw needs no normalization) and the draw counts the tokens at the top-k
// threshold a slice itself, as it counts top-p's.
__global__ void __launch_bounds__(kT) sample_draw_kernel(SampleParams p, bool z_ran) {
  chained_kernel_entry();
  using ReduceF = cub::BlockReduce<float, kT>;
  using ReduceU = cub::BlockReduce<unsigned long long, kT>;
  using ScanF = cub::BlockScan<float, kT>;
  using ScanU = cub::BlockScan<unsigned long long, kT>;
  __shared__ union {
    typename ReduceF::TempStorage rf;
    typename ReduceU::TempStorage ru;
    typename ScanF::TempStorage sf;
    typename ScanU::TempStorage su;
  } tmp;
  __shared__ int slice_s;
  __shared__ float base_s, target_s;
  __shared__ unsigned long long p_before_s, k_before_s;
  __shared__ int32_t id_s, claimed_s;
  const int t = threadIdx.x, b = blockIdx.x;
  const int64_t r = blockIdx.y;
  const GreedyPartial best = p.row_best[r];
  if (best.bad || best.id < 0) return;
  SampleSelectRow* st = p.select ? p.select + r : nullptr;
  const RowRule q = row_rule(p, best, r, z_ran, true);
  const bool k_ties_here = q.k_on && !z_ran;  // counted by this kernel (z_ran: by the z kernel)
  const float* row = p.logits + r * p.vocab;
  const int64_t V = p.n_valid;
  // This slice: the kept weight but the threshold tokens whose keeping depends on the slices
  // before (top-p's; top-k's when counted here), and their count.
  {
    const Range sl = slice_of(b, V);
    float w = 0.0f;
    unsigned long long at_p = 0;  // or, with k_ties_here, at the top-k threshold (top-p is off)
    for (int64_t i = sl.lo + t; i < sl.hi; i += kT) {
      const float s = (row[i] - q.top) / q.T;
      if (q.k_on) {
        const uint32_t ks = order_key(s);
        if (ks < q.k_key) continue;
        if (ks == q.k_key) {  // at the threshold: counted (here, or by the z kernel)
          at_p += k_ties_here;
          continue;
        }
      }
      const float pi = expf(s) / q.z;
      if (q.p_on) {
        const uint32_t kp = order_key(pi);
        if (kp < q.p_key) continue;
        if (kp == q.p_key) {
          ++at_p;
          continue;
        }
      }
      w += pi;
    }
    if (q.k_on && z_ran && t == 0) {  // the slice's tokens at the top-k threshold that top-k keeps
      const unsigned long long kept = kept_of(q.k_need, st->k_before[b], st->k_count[b]);
      const float pi = expf(key_value(q.k_key)) / q.z;
      const uint32_t kp = order_key(pi);
      if (kept && (!q.p_on || kp > q.p_key)) w += static_cast<float>(kept) * pi;
      if (kept && q.p_on && kp == q.p_key) at_p += kept;
    }
    const float wb = ReduceF(tmp.rf).Sum(w);
    __syncthreads();
    const unsigned long long ab = ReduceU(tmp.ru).Sum(at_p);
    if (t == 0) {
      p.block_sums[r * B + b] = wb;
      if (k_ties_here) st->k_count[b] = ab;
      else if (st) st->p_count[b] = ab;
    }
  }
  if (!last_block_of_row(p.greedy_counters, r)) return;

  if (t == 0) {  // the slices' weights in order; the draw u * (their total)
    const volatile float* sums = p.block_sums + r * B;
    const volatile SampleSelectRow* v = st;
    const float pv = q.p_on ? key_value(q.p_key) : 0.0f;
    const float kv = k_ties_here ? expf(key_value(q.k_key)) : 0.0f;  // z = 1
    float weights[B];
    unsigned long long p_before[B], k_before[B];
    float all = 0.0f;
    unsigned long long before = 0, k_seen = 0;
    for (int i = 0; i < B; ++i) {
      const unsigned long long c = q.p_on ? v->p_count[i] : 0, ck = k_ties_here ? v->k_count[i] : 0;
      weights[i] = sums[i] + (c ? static_cast<float>(kept_of(q.p_need, before, c)) * pv : 0.0f) +
                   (ck ? static_cast<float>(kept_of(q.k_need, k_seen, ck)) * kv : 0.0f);
      p_before[i] = before;
      k_before[i] = k_seen;
      before += c;
      k_seen += ck;
      all += weights[i];
    }
    const float target = static_cast<float>(static_cast<double>(p.uniform[r]) * 0x1p-53 * static_cast<double>(all));
    float acc = 0.0f, last_base = 0.0f;
    int slice = -1, last_positive = 0;
    for (int i = 0; i < B; ++i) {
      const float w = weights[i];
      if (w > 0.0f) {
        last_positive = i;
        last_base = acc;
      }
      if (slice < 0 && w > 0.0f && target < acc + w) {
        slice = i;
        base_s = acc;
      }
      acc += w;
    }
    if (slice < 0) {  // the target at the very end (rounding): the last slice with mass
      slice = last_positive;
      base_s = last_base;
    }
    slice_s = slice;
    p_before_s = p_before[slice];
    k_before_s = !q.k_on ? 0 : k_ties_here ? k_before[slice] : st->k_before[slice];
    target_s = target;
    id_s = INT32_MAX;
    claimed_s = -1;
  }
  __syncthreads();
  const int slice = slice_s;
  const Range run = run_of(slice_of(slice, V), t);
  auto scaled = [&](int64_t i) { return (row[i] - q.top) / q.T; };
  // The threshold tokens before this thread's run: top-k's, then top-p's (of those top-k keeps).
  long long k_left = 0, p_left = 0;
  if (q.k_on) {
    unsigned long long c = 0, excl = 0;
    for (int64_t i = run.lo; i < run.hi; ++i) c += order_key(scaled(i)) == q.k_key;
    ScanU(tmp.su).ExclusiveSum(c, excl);
    __syncthreads();
    k_left = left_of(q.k_need, k_before_s + excl);
  }
  if (q.p_on) {
    unsigned long long c = 0, excl = 0;
    long long kl = k_left, pl = 0;
    bool at_p;
    for (int64_t i = run.lo; i < run.hi; ++i)
      if (walk_token(q, scaled(i), kl, pl, false, at_p) >= 0.0f && at_p) ++c;
    ScanU(tmp.su).ExclusiveSum(c, excl);
    __syncthreads();
    p_left = left_of(q.p_need, p_before_s + excl);
  }
  float w = 0.0f;
  int32_t last_kept = -1;
  {
    long long kl = k_left, pl = p_left;
    bool at_p;
    for (int64_t i = run.lo; i < run.hi; ++i) {
      const float pi = walk_token(q, scaled(i), kl, pl, true, at_p);
      if (pi > 0.0f) {
        w += pi;
        last_kept = static_cast<int32_t>(i);
      }
    }
  }
  float excl = 0.0f, total = 0.0f;
  ScanF(tmp.sf).ExclusiveSum(w, excl, total);
  const float base = base_s + excl, target = target_s;
  if (w > 0.0f && base <= target && target < base + w) {
    long long kl = k_left, pl = p_left;
    bool at_p, found = false;
    float acc = base;
    for (int64_t i = run.lo; i < run.hi && !found; ++i) {
      const float pi = walk_token(q, scaled(i), kl, pl, true, at_p);
      if (pi <= 0.0f) continue;
      acc += pi;
      if (target < acc) {
        atomicMin(&id_s, static_cast<int32_t>(i));
        found = true;
      }
    }
    // The run's own adds ended below the target its scan put in it (rounding): its last token.
    if (!found) atomicMax(&claimed_s, last_kept);
  }
  __syncthreads();
  // No run claimed the target (between two runs' rounded sums): the slice's last kept token.
  const bool unclaimed = id_s == INT32_MAX && claimed_s < 0;  // every thread, before any writes
  __syncthreads();
  if (unclaimed && last_kept >= 0) atomicMax(&claimed_s, last_kept);
  __syncthreads();
  if (t == 0) p.ids[r] = id_s != INT32_MAX ? id_s : claimed_s >= 0 ? claimed_s : best.id;
}

}  // namespace

void launch_sample_draw_blocks(const SampleParams& p, Stream s) {
  const dim3 grid(B, static_cast<unsigned>(p.n));
  const auto st = static_cast<cudaStream_t>(s);
  const bool k_on = p.top_k > 0 && p.top_k < p.n_valid, p_on = p.top_p < 1.0f;
  SLUICE_CHECK(!(k_on || p_on) || p.select, Status::internal, "cuda sample: a top-k / top-p draw without its scratch");
  if (k_on)
    for (int pass = 0; pass < 4; ++pass) {
      launch_chained(sample_pass_kernel<Pass::top_k>, grid, dim3(kT), 0, st, p, pass);
      CUDA_CHECK(cudaGetLastError());
    }
  // z: with top-p (its probabilities need it); top-k alone draws by exp(s) without it.
  const bool z_ran = p_on;
  if (z_ran) {
    launch_chained(sample_z_kernel, grid, dim3(kT), 0, st, p);
    CUDA_CHECK(cudaGetLastError());
  }
  if (p_on)
    for (int pass = 0; pass < 4; ++pass) {
      launch_chained(sample_pass_kernel<Pass::top_p>, grid, dim3(kT), 0, st, p, pass);
      CUDA_CHECK(cudaGetLastError());
    }
  launch_chained(sample_draw_kernel, grid, dim3(kT), 0, st, p, z_ran);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
