// Common header of the CUDA backend's kernels: the CUDA runtime, the error check, dtype
// loads to f32, and warp reductions. Kernels include only this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/error.h"

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/wtype.h"

namespace sluice::cuda {


template <WType T> __device__ __forceinline__ float load_w(const void* p, int64_t i);
template <> __device__ __forceinline__ float load_w<WType::f32>(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
template <> __device__ __forceinline__ float load_w<WType::f16>(const void* p, int64_t i) {
  return __half2float(static_cast<const __half*>(p)[i]);
}
template <> __device__ __forceinline__ float load_w<WType::bf16>(const void* p, int64_t i) {
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// KV cache elements (Backend::kv_dtype): KV = float, or __nv_bfloat16 read as its exact f32
// value (a bf16 is the high half of an f32: element 2i of a 32-bit word is its low half).
// kv_load<N> reads p[0 .. N) (N = 2, 4 or 8) in one or two vector loads: 4 N bytes for f32,
// 2 N for bf16, p aligned to that (16 at most); kLdg: global memory through the read-only
// cache, else any address (shared memory).
__device__ __forceinline__ void bf16_word_to_f32(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
template <int N, bool kLdg, typename KV>
__device__ __forceinline__ void kv_load(const KV* __restrict__ p, float (&x)[N]) {
  static_assert(N == 2 || N == 4 || N == 8, "kv_load: 2, 4 or 8 elements");
  if constexpr (std::is_same_v<KV, float>) {
    if constexpr (N == 2) {
      const float2 a = kLdg ? __ldg(reinterpret_cast<const float2*>(p)) : *reinterpret_cast<const float2*>(p);
      x[0] = a.x;
      x[1] = a.y;
    } else {
#pragma unroll
      for (int h = 0; h < N; h += 4) {
        const float4* q = reinterpret_cast<const float4*>(p + h);
        const float4 a = kLdg ? __ldg(q) : *q;
        x[h] = a.x;
        x[h + 1] = a.y;
        x[h + 2] = a.z;
        x[h + 3] = a.w;
      }
    }
  } else {
    static_assert(std::is_same_v<KV, __nv_bfloat16>, "kv_load: float or __nv_bfloat16");
    uint32_t w[N / 2];
    if constexpr (N == 2) {
      const auto* q = reinterpret_cast<const unsigned int*>(p);
      w[0] = kLdg ? __ldg(q) : *q;
    } else if constexpr (N == 4) {
      const auto* q = reinterpret_cast<const uint2*>(p);
      const uint2 a = kLdg ? __ldg(q) : *q;
      w[0] = a.x;
      w[1] = a.y;
    } else {
      const auto* q = reinterpret_cast<const uint4*>(p);
      const uint4 a = kLdg ? __ldg(q) : *q;
      w[0] = a.x;
      w[1] = a.y;
      w[2] = a.z;
      w[3] = a.w;
    }
#pragma unroll
    for (int i = 0; i < N / 2; ++i) bf16_word_to_f32(w[i], x[2 * i], x[2 * i + 1]);
  }
}
// Element i (kLdg as kv_load).
template <bool kLdg, typename KV>
__device__ __forceinline__ float kv_at(const KV* __restrict__ p, int64_t i) {
  if constexpr (std::is_same_v<KV, float>) {
    return kLdg ? __ldg(p + i) : p[i];
  } else {
    const auto* h = reinterpret_cast<const unsigned short*>(p) + i;
    return __uint_as_float(static_cast<uint32_t>(kLdg ? __ldg(h) : *h) << 16);
  }
}
// An f32 value as a cache element (bf16: rounded to nearest even, as the CPU's f32_to_bf16).
template <typename KV>
__device__ __forceinline__ KV kv_from_f32(float x) {
  if constexpr (std::is_same_v<KV, float>) return x;
  else return __float2bfloat16_rn(x);
}

// The end of a softmax row: o / l, where the output o and the denominator l are relative to
// the row's max m (o = sum e^(s - m) v, l = sum e^(s - m)), with gpt-oss's attention sink (a
// logit of its own in the denominator, no value) when `sinks` is set: o / (l + e^(sink - m)),
// computed against max(m, sink) as the CPU reference takes its max over both. Without sinks
// exactly o / l. m = -inf (no key seen) with a sink gives 0.
__device__ __forceinline__ float softmax_finish(float o, float l, float m, const float* __restrict__ sinks,
                                                int64_t head) {
  if (sinks == nullptr) return o / l;
  const float sink = sinks[head], mm = fmaxf(m, sink), f = expf(m - mm);
  return (o * f) / (l * f + expf(sink - mm));
}

// The first key a query at `pos` sees (AttentionSpan: a window's bound, a chunk's start).
__device__ __forceinline__ int64_t attention_lo(int64_t pos, const AttentionSpan& sp) {
  int64_t lo = sp.window > 0 && pos - sp.window + 1 > 0 ? pos - sp.window + 1 : 0;
  if (sp.chunk > 0 && pos - pos % sp.chunk > lo) lo = pos - pos % sp.chunk;
  return lo;
}
// The score scale of a query at `pos`: scale, times its temperature where that is tuned (as the
// CPU's attention computes it in f32).
__device__ __forceinline__ float attention_scale_at(float scale, int64_t pos, const AttentionSpan& sp) {
  if (sp.floor_scale <= 0) return scale;
  return scale * (log1pf(floorf((static_cast<float>(pos) + 1.0f) / static_cast<float>(sp.floor_scale))) * sp.attn_scale +
                  1.0f);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Programmatic dependent launch (sm_90): a kernel launched with launch_chained may start
// while the kernel before it on the stream is still running, so that its launch latency
// (a few us, against decode kernels of a few us) overlaps the previous kernel instead of
// following it. Such a kernel calls chained_kernel_entry() first, before it touches memory:
// it waits there until the previous kernel finished and its writes are visible, then lets
// the next kernel launch. In a kernel launched otherwise both are no-ops.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
__device__ __forceinline__ void chained_kernel_entry() {
  griddep_wait();
  griddep_launch_dependents();
}

// kernel<<<grid, block, smem, stream>>>(args...) allowed to overlap the previous kernel's
// tail (the kernel must begin with chained_kernel_entry()).
template <typename... Params, typename... Args>
void launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                    Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// 16 bytes global -> shared memory without a register round trip (cp.async, sm_80+); when
// !valid the 16 shared bytes are zero-filled and gmem is not read (it must still be a valid
// address: pass any in-bounds pointer). Waited for with cp_async_wait_all().
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight (then
// __syncthreads() before other threads read what this one copied).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Commits this thread's cp.async copies and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// The current device's streaming multiprocessors (132 on an H100 or H200; 132 when the driver
// cannot say), read once.
inline int device_sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return sms > 0 ? sms : 132;
  }();
  return n;
}

}  // namespace sluice::cuda
