// Decode attention split over the context (attention_decode.cu): one query row, grouped-query,
// causal, sliding window; the kv heads' splits merged by the last block to finish.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice::cuda {

constexpr int64_t kAttentionDecodeMaxHeads = 1024;  // counters the backend keeps

struct AttentionDecodeArgs {
  const float* q = nullptr;  // [1, hq, d]
  const float* k = nullptr;  // [n_ctx, hkv, d]
  const float* v = nullptr;  // [n_ctx, hkv, d]
  float* out = nullptr;      // [1, hq, d]
  float* partials = nullptr; // attention_decode_partial_floats(...) floats of scratch
  int* counters = nullptr;   // [kAttentionDecodeMaxHeads] zero (each launch leaves them zero)
  int64_t hq = 0, hkv = 0, d = 0;
  int64_t n_ctx = 0;         // the cache's capacity: sets the number of splits
  int64_t n_past = 0;        // the query's position, unless n_past_dev (device) is set
  const int32_t* n_past_dev = nullptr;
  float scale = 1.0f;
  int64_t window = 0;        // 0: full causal
};

// Whether the split kernel serves these heads (head_dim 64, 128 or 256; up to
// kAttentionDecodeMaxHeads query heads) and pointers (16-byte aligned).
bool attention_decode_supported(int64_t hq, int64_t hkv, int64_t d, const void* q, const void* k, const void* v);
// Splits of the context for a cache of n_ctx positions: 1..64 a query head (about one chunk
// of 32 keys a warp) or, for grouped-query heads, 1..64 a kv head (attention_decode.cu).
int attention_decode_splits(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx);
int64_t attention_decode_partial_floats(int64_t hq, int64_t hkv, int64_t d, int64_t n_ctx);
void launch_attention_decode(const AttentionDecodeArgs& a, Stream s);

}  // namespace sluice::cuda
