// Decode attention split over the context (attention_decode.cu): one query row (or one row of
// each sequence of a batch step), grouped-query, causal, sliding window; the splits' partial
// rows merged by a second kernel.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice::cuda {

constexpr int64_t kAttentionDecodeMaxHeads = 1024;  // query heads (times batch rows) a launch serves

struct AttentionDecodeParams {
  const float* q = nullptr;  // [1, hq, d]
  const void* k = nullptr;   // [n_ctx, hkv, d] f32, or bf16 when kv_bf16
  const void* v = nullptr;   // [n_ctx, hkv, d]
  bool kv_bf16 = false;      // k, v (or every row's caches) bf16
  float* out = nullptr;      // [1, hq, d]
  float* partials = nullptr; // attention_decode_partial_floats(...) floats of scratch
  int64_t hq = 0, hkv = 0, d = 0;
  int64_t n_ctx = 0;         // the cache's capacity: sets the number of splits
  int64_t n_past = 0;        // the query's position, unless n_past_dev (device) is set
  const int32_t* n_past_dev = nullptr;
  float scale = 1.0f;
  int64_t window = 0;        // 0: full causal
  const float* sinks = nullptr;  // [hq] f32 attention sinks (gpt-oss), or null
  int64_t chunk = 0;             // attention chunks (AttentionSpan); 0: none
  int64_t temperature_floor_scale = 0;  // temperature tuning (AttentionSpan); 0: off
  float temperature_attn_scale = 0.0f;
  AttentionSpan span() const { return {window, chunk, temperature_floor_scale, temperature_attn_scale}; }
  // A batch decode step: n_rows rows of q and out, row b a sequence of its own with the
  // caches rows->k[b] / rows->v[b] (k, v unused) at position n_past_dev[b]; n_ctx the largest
  // capacity; partials n_rows times as many.
  int64_t n_rows = 1;
  const RowCachePtrs* rows = nullptr;
};

// Whether the split kernel serves these heads (head_dim 64, 128 or 256; up to
// kAttentionDecodeMaxHeads query heads) and pointers (16-byte aligned).
bool attention_decode_supported(int64_t hq, int64_t hkv, int64_t d, const void* q, const void* k, const void* v);
// Whether the split kernel serves a batch step of n_rows rows with caches of their own in one
// launch (the grouped-query kernel: 2 to 32 query heads a kv head; n_rows <= kMaxCacheRows).
bool attention_decode_rows_supported(int64_t hq, int64_t hkv, int64_t d, int64_t n_rows);
// Splits of the context for a cache of n_ctx positions: 1..64 a query head (about one chunk
// of 32 keys a warp) or, for grouped-query heads, 1..64 a kv head (attention_decode.cu).
int attention_decode_splits(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx);
// The splits launch_attention_decode(a) uses: the kernel it takes for a, that kernel's count
// (for benchmarks' tables).
int attention_decode_launch_splits(const AttentionDecodeParams& a);
int64_t attention_decode_partial_floats(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx);
void launch_attention_decode(const AttentionDecodeParams& a, Stream s);

// The tensor-core kernel (attention_decode_mma.cu), which launch_attention_decode takes (one
// sequence or a batch step's rows) when it applies: a bf16 cache, 2 to 16 query heads a kv head, 64 or 128 dims
// (SLUICE_CUDA_ATTENTION_MMA=0: never, to compare; captured graphs take it at capture). Its
// splits for a cache of n_ctx positions (64 keys a stage: never more than the FMA kernel's,
// whose partial rows the scratch is sized for; one split for caches of at most 4 stages), and
// the launch writing S partial rows a head (S > 1: the merge follows) or the output.
bool attention_decode_mma_applies(int64_t hq, int64_t hkv, int64_t d, bool kv_bf16);
int attention_decode_mma_splits(int64_t hkv, int64_t n_ctx, int max_splits);
void launch_attention_decode_mma(const AttentionDecodeParams& a, int S, cudaStream_t st);

}  // namespace sluice::cuda
