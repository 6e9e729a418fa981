// The absorbed form of multi-head latent attention (attention_latent.h; models/mla.h): every
// query head attends over the same latent cache rows (keys of dk values, their first dv the
// values), so a block serves kHeads heads of one row and reads each key chunk of its split
// once for all of them, from memory once and from L2 for the other head groups.
//
//   grid (ceil(H / kHeads), S, rows), block kHeads warps. The block's query rows go to shared
//   memory as f32 [kHeads][dk]; its split's keys [lo_s, hi_s) (positions past the query's
//   skipped) come in chunks of 32 rows, converted to f32 into shared memory [32][dk + 1] (the
//   odd stride: lane t reading row t is conflict-free). Warp w, head h0 + w: lane t scores key
//   t of the chunk (a dk-long dot), the warp's online softmax (base e) is updated once a
//   chunk, and lane t accumulates output dims t, t + 32, ... over the chunk's 32 rows (the
//   score broadcast by shuffles). The splits' partial rows (o, max, denominator) are merged by
//   latent_attention_merge_kernel, launched after. S depends only on the cache's capacity, so
//   a captured graph replays at any position.
//
// All arithmetic f32 (FMA); a bf16 cache's elements are read as their exact f32 values.
#include "backends/cuda/attention_latent.h"

#include "backends/cuda/common.cuh"

namespace sluice::cuda {
namespace {

constexpr int kHeads = 16;      // heads (warps) a block
constexpr int kChunk = 32;      // keys a chunk
constexpr int kMaxSplits = 32;
constexpr int kMaxDk = 1024;

__device__ __forceinline__ float cache_at(const void* c, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(c)[i]) : static_cast<const float*>(c)[i];
}

// The position of row b (LatentAttentionParams).
__device__ __forceinline__ int64_t row_position(const LatentAttentionParams& a, bool own_caches, int64_t b) {
  if (own_caches) return a.n_past_dev[b];
  return (a.n_past_dev != nullptr ? a.n_past_dev[0] : a.n_past) + b;
}

// DVL: output dims a lane holds (dv <= 32 DVL).
template <int DVL>
__global__ void __launch_bounds__(kHeads * 32)
    latent_attention_kernel(const LatentAttentionParams a, const RowCachePtrs rows, bool own_caches) {
  chained_kernel_entry();
  extern __shared__ float smem[];
  const int64_t dk = a.dk, dv = a.dv, ks_stride = dk + 1;
  float* qs = smem;                   // [kHeads][dk]
  float* ks = smem + kHeads * dk;     // [kChunk][dk + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nthreads = blockDim.x;
  const int64_t b = blockIdx.z, h0 = static_cast<int64_t>(blockIdx.x) * kHeads, h = h0 + warp;
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t pos = row_position(a, own_caches, b);
  const void* cache = own_caches ? rows.k[b] : a.cache;
  // This split's keys: [lo, hi) of [0, pos], in whole chunks.
  const int64_t total = pos + 1, chunks = (total + kChunk - 1) / kChunk, per = (chunks + S - 1) / S;
  const int64_t lo = (s * per < chunks ? s * per : chunks) * kChunk;
  const int64_t hi = (s + 1) * per * kChunk < total ? (s + 1) * per * kChunk : total;
  for (int64_t i = threadIdx.x; i < kHeads * dk; i += nthreads) {
    const int64_t hh = h0 + i / dk;
    qs[i] = hh < a.H ? a.q[(b * a.H + hh) * dk + i % dk] : 0.0f;
  }
  float o[DVL];
#pragma unroll
  for (int i = 0; i < DVL; ++i) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t c0 = lo; c0 < hi; c0 += kChunk) {
    __syncthreads();  // the chunk before is used up (and qs written)
    for (int64_t i = threadIdx.x; i < kChunk * dk; i += nthreads) {
      const int64_t j = i / dk, d = i % dk, key = c0 + j;
      ks[j * ks_stride + d] = key < hi ? cache_at(cache, a.bf16, key * dk + d) : 0.0f;
    }
    __syncthreads();
    if (h >= a.H) continue;
    const int64_t key = c0 + lane;
    float sc = -INFINITY;
    if (key < hi) {
      const float* qh = qs + warp * dk;
      const float* kr = ks + lane * ks_stride;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // four chains: the FMA latency overlapped
      int64_t d = 0;
      for (; d + 4 <= dk; d += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[u] = fmaf(qh[d + u], kr[d + u], acc[u]);
      }
      for (; d < dk; ++d) acc[0] = fmaf(qh[d], kr[d], acc[0]);
      sc = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * a.scale;
    }
    const float m_new = fmaxf(m, warp_max(sc));
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < DVL; ++i) o[i] *= corr;
    for (int j = 0; j < kChunk; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const float* vr = ks + j * ks_stride;
#pragma unroll
      for (int i = 0; i < DVL; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < dv) o[i] = fmaf(pj, vr[d], o[i]);
      }
    }
    m = m_new;
  }
  if (h >= a.H) return;
  // Partial row [rows][H][S][dv + 2]: o, max, denominator.
  float* row = a.partials + ((b * a.H + h) * S + s) * (dv + 2);
#pragma unroll
  for (int i = 0; i < DVL; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < dv) row[d] = o[i];
  }
  if (lane == 0) {
    row[dv] = m;
    row[dv + 1] = l;
  }
}

// out[b, h, :] = the S partial rows of (b, h) merged: sum_s o_s e^(m_s - m) / sum_s l_s e^(m_s - m).
// grid (H, rows), block 128 threads, thread c the dims c, c + 128, ...
__global__ void __launch_bounds__(128)
    latent_attention_merge_kernel(const float* __restrict__ part, float* __restrict__ out, int64_t H, int64_t dv,
                                  int S) {
  chained_kernel_entry();
  __shared__ float f[kMaxSplits];
  __shared__ float den;
  const int64_t bh = static_cast<int64_t>(blockIdx.y) * H + blockIdx.x;
  const float* rows = part + bh * S * (dv + 2);
  if (threadIdx.x < 32) {
    const int t = threadIdx.x;
    const float mt = t < S ? rows[t * (dv + 2) + dv] : -INFINITY;
    const float m = warp_max(mt);
    const float ft = mt == -INFINITY ? 0.0f : expf(mt - m);  // a split that saw no key
    if (t < S) f[t] = ft;
    const float lt = t < S ? rows[t * (dv + 2) + dv + 1] * ft : 0.0f;
    const float l = warp_sum(lt);
    if (t == 0) den = l;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
    float acc = 0.0f;
    for (int t = 0; t < S; ++t) acc = fmaf(rows[t * (dv + 2) + c], f[t], acc);
    out[bh * dv + c] = acc / den;
  }
}

template <int DVL>
void launch_dvl(const LatentAttentionParams& a, int S, cudaStream_t st) {
  const size_t smem = (static_cast<size_t>(kHeads) * a.dk + static_cast<size_t>(kChunk) * (a.dk + 1)) * sizeof(float);
  static bool opted = false;  // the largest dynamic shared memory this kernel asks for
  if (!opted) {
    CUDA_CHECK(cudaFuncSetAttribute(latent_attention_kernel<DVL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>((kHeads * kMaxDk + kChunk * (kMaxDk + 1)) * sizeof(float))));
    opted = true;
  }
  const dim3 grid(static_cast<unsigned>((a.H + kHeads - 1) / kHeads), static_cast<unsigned>(S),
                  static_cast<unsigned>(a.n_rows));
  const RowCachePtrs rows = a.rows != nullptr ? *a.rows : RowCachePtrs{};  // by value: the kernel reads its copy
  launch_chained(latent_attention_kernel<DVL>, grid, dim3(kHeads * 32), smem, st, a, rows, a.rows != nullptr);
}

// One thread an element: row i of src into row positions[i] (or row0 + i) of dst.
__global__ void write_rows_kernel(const float* __restrict__ src, void* __restrict__ dst, bool bf16,
                                  const int32_t* __restrict__ positions, int64_t row0, int64_t n, int64_t c) {
  chained_kernel_entry();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * c) return;
  const int64_t i = t / c, col = t % c, row = positions != nullptr ? positions[i] : row0 + i;
  if (bf16) static_cast<__nv_bfloat16*>(dst)[row * c + col] = __float2bfloat16_rn(src[t]);
  else static_cast<float*>(dst)[row * c + col] = src[t];
}

}  // namespace

void launch_write_rows(const float* src, void* dst, bool bf16, const int32_t* positions, int64_t row0, int64_t n,
                       int64_t c, Stream s) {
  if (n * c == 0) return;
  launch_chained(write_rows_kernel, dim3(blocks_for(n * c, 256)), dim3(256), 0, static_cast<cudaStream_t>(s), src, dst,
                 bf16, positions, row0, n, c);
  CUDA_CHECK(cudaGetLastError());
}

bool latent_attention_supported(int64_t dk, int64_t dv, int64_t n_rows, bool own_caches) {
  return dk > 0 && dk <= kMaxDk && dv > 0 && dv <= 512 && dv <= dk && n_rows >= 1 &&
         (!own_caches || n_rows <= kMaxCacheRows) && n_rows <= 65535;
}

int latent_attention_splits(int64_t n_ctx) {
  const int64_t s = (n_ctx + 511) / 512;  // about 512 keys a split
  return static_cast<int>(s < 1 ? 1 : s > kMaxSplits ? kMaxSplits : s);
}

int64_t latent_attention_partial_floats(int64_t n_rows, int64_t H, int64_t dv, int64_t n_ctx) {
  return n_rows * H * latent_attention_splits(n_ctx) * (dv + 2);
}

void launch_latent_attention(const LatentAttentionParams& a, Stream s) {
  SLUICE_CHECK(latent_attention_supported(a.dk, a.dv, a.n_rows, a.rows != nullptr) &&
                   (a.rows == nullptr || a.n_past_dev != nullptr),
               Status::unsupported, "cuda latent attention: keys of ", a.dk, " values, values of ", a.dv, ", ",
               a.n_rows, " rows (at most 1024 and 512)");
  if (a.n_rows == 0 || a.H == 0) return;
  const auto st = static_cast<cudaStream_t>(s);
  const int S = latent_attention_splits(a.n_ctx);
  const int64_t dvl = (a.dv + 31) / 32;
  if (dvl <= 1) launch_dvl<1>(a, S, st);
  else if (dvl <= 2) launch_dvl<2>(a, S, st);
  else if (dvl <= 4) launch_dvl<4>(a, S, st);
  else if (dvl <= 8) launch_dvl<8>(a, S, st);
  else launch_dvl<16>(a, S, st);
  CUDA_CHECK(cudaGetLastError());
  launch_chained(latent_attention_merge_kernel, dim3(static_cast<unsigned>(a.H), static_cast<unsigned>(a.n_rows)),
                 dim3(128), 0, st, static_cast<const float*>(a.partials), a.out, a.H, a.dv, S);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
