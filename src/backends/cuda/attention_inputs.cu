// Attention inputs in one launch (Backend::attention_inputs): per-head RMSNorm of q and k,
// rotary embedding of both, and the append of k and v to the caches; a decode token's six
// small launches (two norms, two ropes, two scatters) become one.
//
// A (token, head) item takes a q head, a k head, or a v head (a copy into the value cache); in
// a batch decode step each token (row) has caches of its own. The head (d <= kMaxDim floats)
// is loaded into shared memory, its sum of squares reduced, normed, rotated pair by pair, and
// stored (q and k as f32, the caches as KV: f32, or bf16 rounded to nearest even). Decode
// (up to kBlockItemRows rows): a block of kThreads per item, one element a thread. Prefill:
// a warp per item, kWarps items a block (a block an item made a prefill of 8192 tokens
// 327,680 blocks of two barriers each: 480 us a layer, 218 us a warp an item; the warp form at
// decode cost 0.5 us a layer more).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace sluice::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int64_t kMaxDim = 1024;
constexpr int64_t kBlockItemRows = 64;

__device__ __forceinline__ float load_any(const void* w, WType wtype, int64_t i) {
  switch (wtype) {
    case WType::f32: return load_w<WType::f32>(w, i);
    case WType::f16: return load_w<WType::f16>(w, i);
    default: return load_w<WType::bf16>(w, i);
  }
}

// kWarpItems: an item a warp (else an item a block); items run (row, head) row-major.
template <bool kPerRow, bool kWarpItems, typename KV>
__global__ void __launch_bounds__(kThreads) attention_inputs_kernel(
    float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v, const void* __restrict__ q_norm,
    WType q_wtype, const void* __restrict__ k_norm, WType k_wtype, float eps, const float* __restrict__ cos,
    const float* __restrict__ sin, int64_t rot, bool interleaved, KV* __restrict__ k_cache, KV* __restrict__ v_cache,
    const int32_t* __restrict__ positions, int64_t n_past, int64_t n, int64_t nh, int64_t nkv, int64_t d,
    const RowCachePtrs rows) {
  chained_kernel_entry();
  constexpr int kGroups = kWarpItems ? kWarps : 1, kLanes = kThreads / kGroups;
  __shared__ float xs_group[kGroups][kMaxDim];
  __shared__ float partial[kWarps];
  const int group = kWarpItems ? threadIdx.x / 32 : 0, lane = threadIdx.x % kLanes;
  const int64_t heads = nh + 2 * nkv, item = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  if (item >= n * heads) return;  // a whole group leaves: its barriers (below) are its own
  const int64_t row = item / heads, head = item % heads;
  float* xs = xs_group[group];
  auto sync = [] {
    if constexpr (kWarpItems) __syncwarp();
    else __syncthreads();
  };
  if constexpr (kPerRow) {  // this row's sequence has caches of its own
    k_cache = static_cast<KV*>(rows.k[row]);
    v_cache = static_cast<KV*>(rows.v[row]);
  }
  const int64_t pos = positions ? positions[row] : n_past + row;
  if (head >= nh + nkv) {  // a value head: into the cache as it is
    const int64_t hv = head - nh - nkv;
    const float* src = v + (row * nkv + hv) * d;
    KV* dst = v_cache + (pos * nkv + hv) * d;
    for (int64_t c = lane; c < d; c += kLanes) dst[c] = kv_from_f32<KV>(src[c]);
    return;
  }
  const bool is_q = head < nh;
  const int64_t hh = is_q ? head : head - nh;
  float* x = is_q ? q + (row * nh + hh) * d : k + (row * nkv + hh) * d;
  const void* w = is_q ? q_norm : k_norm;
  const WType wtype = is_q ? q_wtype : k_wtype;
  float ss = 0.0f;
  for (int64_t c = lane; c < d; c += kLanes) {
    const float val = x[c];
    xs[c] = val;
    ss = fmaf(val, val, ss);
  }
  if (w) {
    float total = warp_sum(ss);
    if constexpr (!kWarpItems) {
      if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = total;
      __syncthreads();
      total = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) total += partial[i];
    }
    const float inv = rsqrtf(total / static_cast<float>(d) + eps);
    for (int64_t c = lane; c < d; c += kLanes) xs[c] = xs[c] * inv * load_any(w, wtype, c);
  }
  sync();
  // Rotary over the first rot dims (pairs as launch_rope), the rest unchanged.
  const int64_t half = rot / 2;
  KV* cache = is_q ? nullptr : k_cache + (pos * nkv + hh) * d;
  for (int64_t c = lane; c < d; c += kLanes) {
    float out = xs[c];
    if (c < rot) {
      const int64_t p = interleaved ? c / 2 : c % half;
      const bool first = interleaved ? c % 2 == 0 : c < half;
      const int64_t a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
      const float cs = cos[row * half + p], sn = sin[row * half + p];
      const float x1 = xs[a], x2 = xs[b];
      out = first ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
    }
    x[c] = out;
    if (cache) cache[c] = kv_from_f32<KV>(out);
  }
}

template <typename KV, bool kWarpItems>
void launch(const AttentionInputsParams& p, cudaStream_t st) {
  const RowCachePtrs none{};
  const dim3 grid(blocks_for(p.n * (p.nh + 2 * p.nkv), kWarpItems ? kWarps : 1));
  launch_chained(p.rows ? attention_inputs_kernel<true, kWarpItems, KV> : attention_inputs_kernel<false, kWarpItems, KV>,
                 grid, dim3(kThreads), 0, st, p.q, p.k, p.v, p.q_norm, p.q_norm_wtype, p.k_norm, p.k_norm_wtype, p.eps,
                 p.cos, p.sin, p.rot, p.interleaved, static_cast<KV*>(p.k_cache), static_cast<KV*>(p.v_cache),
                 p.positions, p.n_past, p.n, p.nh, p.nkv, p.d, p.rows ? *p.rows : none);
}

template <typename KV>
void launch(const AttentionInputsParams& p, cudaStream_t st) {
  if (p.n > kBlockItemRows) launch<KV, true>(p, st);
  else launch<KV, false>(p, st);
}

}  // namespace

void launch_attention_inputs(const AttentionInputsParams& p, Stream s) {
  SLUICE_CHECK(p.d <= kMaxDim && p.rot <= p.d && p.rot % 2 == 0, Status::internal, "cuda attention_inputs: head_dim ",
               p.d, ", rot ", p.rot);
  if (p.n == 0) return;
  SLUICE_CHECK(!p.rows || (p.n <= kMaxCacheRows && p.positions), Status::internal,
               "cuda attention_inputs: ", p.n, " rows with caches of their own");
  if (p.kv_bf16) launch<__nv_bfloat16>(p, static_cast<cudaStream_t>(s));
  else launch<float>(p, static_cast<cudaStream_t>(s));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
