// QSA ops on CUDA (qwen4_exp's sparse attention): mean_rows (token keys pooled into block
// keys), qsa_select (the indexer's block top-k plus the uncompressed tail, as token indices)
// and attention_indexed (attention over those tokens only). CPU reference: cpu/qsa.cpp.
//
// qsa_select must choose exactly the CPU's blocks, so it computes exactly the CPU's scores:
// every q.K dot product in cpu::dot's order (eight fma lanes over the zero-padded row, then
// simd.h's fixed horizontal sum), relu as std::max(0, x), the head sum in head order and one
// correctly rounded division, all with explicit-rounding intrinsics so that nvcc contracts
// nothing. Scores are >= +0 (never NaN: relu maps NaN to 0), so their bit patterns order as
// the scores do; the block_topk-th largest pattern is found by a 4-pass radix select (8 bits
// a pass) and the kept blocks are those above it plus those equal to it. When more blocks
// equal it than places are left (a tie across the k-th place: exact zeros from relu), one
// thread replays torch's CPU topk on the row (core/torch_topk.h), the CPU's tie rule. One
// block per query row; the scores live in a scratch row of device memory, so the number of
// blocks is unbounded.
#include "backends/cuda/common.cuh"
#include "backends/cuda/hybrid_kernels.h"
#include "core/torch_topk.h"

namespace sluice::cuda {
namespace {

// dst[i, col] = (src[i g, col] + ... + src[i g + g - 1, col]) / g, rows in order.
__global__ void mean_rows_kernel(const float* __restrict__ src, float* dst, int64_t m, int64_t group, int64_t c) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= m * c) return;
  const int64_t i = t / c, col = t % c;
  float acc = src[(i * group) * c + col];
  for (int64_t j = 1; j < group; ++j) acc = __fadd_rn(acc, src[(i * group + j) * c + col]);
  dst[t] = __fdiv_rn(acc, static_cast<float>(group));
}

// cpu::dot<f32>(a, b, d) bit for bit (backends/cpu/simd.h).
__device__ float dot_cpu_order(const float* a, const float* b, int64_t d) {
  float acc[8];
#pragma unroll
  for (int l = 0; l < 8; ++l) acc[l] = 0.0f;
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
  }
  if (i < d) {
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      const bool in = i + l < d;
      acc[l] = fmaf(in ? a[i + l] : 0.0f, in ? b[i + l] : 0.0f, acc[l]);
    }
  }
  // hsum8: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
  return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[2], acc[6])),
                   __fadd_rn(__fadd_rn(acc[1], acc[5]), __fadd_rn(acc[3], acc[7])));
}

constexpr int kSelectThreads = 256;

__global__ void __launch_bounds__(kSelectThreads) qsa_select_kernel(QsaSelectParams p) {
  __shared__ unsigned hist[256];
  __shared__ uint32_t sh_prefix, sh_need;
  __shared__ long long sh_kept;
  const int tid = threadIdx.x;
  const int64_t i = blockIdx.x, pos = p.n_past + i, c = p.c, k = p.block_topk;
  const int64_t m = (pos + 1) / c;  // complete blocks
  int32_t* row = p.idx + i * p.width;
  if (m <= k) {  // every block is kept: the tokens [0, pos], then -1
    for (int64_t j = tid; j < p.width; j += kSelectThreads) row[j] = j <= pos ? static_cast<int32_t>(j) : -1;
    return;
  }
  uint32_t* keys = p.scratch + i * p.scratch_stride;
  const float* qi = p.q + i * p.n_head * p.d;
  for (int64_t b = tid; b < m; b += kSelectThreads) {
    float s = 0.0f;
    for (int64_t h = 0; h < p.n_head; ++h) {
      const float dt = dot_cpu_order(qi + h * p.d, p.block_keys + b * p.d, p.d);
      s = __fadd_rn(s, 0.0f < dt ? dt : 0.0f);  // std::max(0.0f, dt)
    }
    keys[b] = __float_as_uint(__fdiv_rn(s, p.sqrt_d));
  }
  __syncthreads();

  // Radix select of the k-th largest key: prefix holds its high bits found so far, need its
  // rank among the keys that share them.
  uint32_t prefix = 0, mask = 0, need = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int j = tid; j < 256; j += kSelectThreads) hist[j] = 0;
    __syncthreads();
    for (int64_t b = tid; b < m; b += kSelectThreads) {
      const uint32_t key = keys[b];
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t above = 0;
      int digit = 255;
      for (; digit > 0; --digit) {
        if (above + hist[digit] >= need) break;
        above += hist[digit];
      }
      sh_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
      sh_need = need - above;
    }
    __syncthreads();
    prefix = sh_prefix;
    need = sh_need;
    mask |= 255u << shift;
    __syncthreads();
  }
  const uint32_t T = prefix;  // the k-th largest key; keep every key above it and `need` equal ones

  // More keys equal to T than `need`: which of them are kept is torch's tie rule.
  __shared__ unsigned long long sh_equal;
  if (tid == 0) sh_equal = 0;
  __syncthreads();
  unsigned long long equal = 0;
  for (int64_t b = tid; b < m; b += kSelectThreads) equal += keys[b] == T;
  atomicAdd(&sh_equal, equal);
  __syncthreads();
  if (sh_equal > need) {
    if (tid == 0) {
      int32_t* order = p.order + i * p.scratch_stride;
      for (int64_t b = 0; b < m; ++b) order[b] = static_cast<int32_t>(b);
      torch_topk::select(order, m, k, [keys](int32_t a, int32_t b) {
        return torch_topk::greater_nan_first(__uint_as_float(keys[a]), __uint_as_float(keys[b]));
      });
      for (int64_t j = 1; j < k; ++j)  // the kept blocks in ascending order
        for (int64_t h = j; h > 0 && order[h - 1] > order[h]; --h) {
          const int32_t t = order[h];
          order[h] = order[h - 1];
          order[h - 1] = t;
        }
      for (int64_t j = 0; j < k; ++j)
        for (int64_t t = 0; t < c; ++t) row[j * c + t] = static_cast<int32_t>(order[j] * c + t);
      sh_kept = k;
    }
  } else if (tid < 32) {  // kept blocks in ascending order, one warp, 32 blocks a step
    const unsigned lt = (1u << tid) - 1u;
    long long kept = 0, eq_seen = 0;
    for (int64_t base = 0; base < m; base += 32) {
      const int64_t b = base + tid;
      const bool valid = b < m;
      const uint32_t key = valid ? keys[b] : 0u;
      const bool eq = valid && key == T;
      const unsigned eq_mask = __ballot_sync(0xffffffffu, eq);
      const bool take = (valid && key > T) || (eq && eq_seen + __popc(eq_mask & lt) < static_cast<long long>(need));
      const unsigned take_mask = __ballot_sync(0xffffffffu, take);
      if (take) {
        const long long slot = kept + __popc(take_mask & lt);
        for (int64_t j = 0; j < c; ++j) row[slot * c + j] = static_cast<int32_t>(b * c + j);
      }
      kept += __popc(take_mask);
      eq_seen += __popc(eq_mask);
    }
    if (tid == 0) sh_kept = kept;
  }
  __syncthreads();
  // Then the tail [m c, pos] and -1 to the end of the row.
  const int64_t first = sh_kept * c;
  for (int64_t j = first + tid; j < p.width; j += kSelectThreads) {
    const int64_t t = m * c + (j - first);
    row[j] = t <= pos ? static_cast<int32_t>(t) : -1;
  }
}

// One warp per (query row, head) with an online softmax over the listed keys, as
// attention.cu; a lane owns head dimensions lane, lane + 32, ... Entries outside [0, n_ctx)
// are skipped (qsa_select writes -1 as padding; the CPU also rejects indices >= n_ctx, which
// would need a host read of idx here).
constexpr int kMaxDimsPerLane = 16;  // head_dim up to 512
constexpr int kWarps = 4;

__global__ void attention_indexed_kernel(AttentionIndexedParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (task >= p.n * p.n_head) return;
  const int64_t i = task / p.n_head, h = task % p.n_head, g = h / (p.n_head / p.n_kv), d = p.d;
  const float* qr = p.q + task * d;
  const int32_t* idx = p.idx + i * p.width;
  float qv[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    qv[t] = c < d ? qr[c] : 0.0f;
    acc[t] = 0.0f;
  }
  float mx = -INFINITY, denom = 0.0f;
  for (int64_t j = 0; j < p.width; ++j) {
    const int64_t pos = idx[j];
    if (pos < 0 || pos >= p.n_ctx) continue;
    const float* kr = p.k + (pos * p.n_kv + g) * d;
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) s = fmaf(qv[t], kr[c], s);
    }
    s = warp_sum(s) * p.scale;
    const float mx_new = fmaxf(mx, s);
    const float corr = expf(mx - mx_new), pj = expf(s - mx_new);
    denom = denom * corr + pj;
    const float* vr = p.v + (pos * p.n_kv + g) * d;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < d) acc[t] = acc[t] * corr + pj * vr[c];
    }
    mx = mx_new;
  }
  float* o = p.out + task * d;
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < d) o[c] = acc[t] / denom;
  }
}

}  // namespace

void launch_mean_rows(const float* src, float* dst, int64_t m, int64_t group, int64_t c, Stream s) {
  if (m * c == 0) return;
  mean_rows_kernel<<<blocks_for(m * c, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(src, dst, m, group, c);
  CUDA_CHECK(cudaGetLastError());
}

void launch_qsa_select(const QsaSelectParams& p, Stream s) {
  if (p.n == 0) return;
  qsa_select_kernel<<<static_cast<unsigned>(p.n), kSelectThreads, 0, static_cast<cudaStream_t>(s)>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void launch_attention_indexed(const AttentionIndexedParams& p, Stream s) {
  SLUICE_CHECK(p.d <= 32 * kMaxDimsPerLane, Status::unsupported, "cuda attention_indexed: head_dim ", p.d,
               " exceeds ", 32 * kMaxDimsPerLane);
  if (p.n * p.n_head == 0) return;
  attention_indexed_kernel<<<blocks_for(p.n * p.n_head, kWarps), kWarps * 32, 0, static_cast<cudaStream_t>(s)>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
