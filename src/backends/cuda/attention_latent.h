// Multi-head latent attention's kernels (attention_latent.cu, matmul_heads.cu): the absorbed
// form's attention of every head over the latent cache, and the per-head products around it.
// Plain C++ declarations like kernels.h: pointers are device memory, sizes in elements,
// everything enqueued on `s`.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice::cuda {

// Backend::attention_latent for n_rows query rows: q [rows, H, dk] f32; row b reads the latent
// cache [n_ctx, dk] (f32, or bf16 when bf16) `cache`, or rows->k[b] when rows is set, at
// position n_past + b (one sequence; n_past_dev[0] + b when n_past_dev is set) or, with rows,
// n_past_dev[b]; out [rows, H, dv] = softmax over keys j <= position of scale q . cache[j],
// times cache[j, :dv].
struct LatentAttentionParams {
  const float* q = nullptr;
  const void* cache = nullptr;
  const RowCachePtrs* rows = nullptr;  // a batch step's caches, or null
  bool bf16 = false;
  float* out = nullptr;
  float* partials = nullptr;           // latent_attention_partial_floats(...) floats of scratch
  int64_t n_rows = 1, H = 0, dk = 0, dv = 0;
  int64_t n_ctx = 0;                   // the largest cache's capacity: sets the number of splits
  int64_t n_past = 0;
  const int32_t* n_past_dev = nullptr;  // device positions (captured graphs; required with rows), or null
  float scale = 1.0f;
};

// Whether the kernel serves these shapes: dv <= dk, dv <= 512, dk <= 1024, at most
// kMaxCacheRows rows with caches of their own.
bool latent_attention_supported(int64_t dk, int64_t dv, int64_t n_rows, bool own_caches);
// Splits of the context for a cache of n_ctx positions, and the partial rows' scratch.
int latent_attention_splits(int64_t n_ctx);
int64_t latent_attention_partial_floats(int64_t n_rows, int64_t H, int64_t dv, int64_t n_ctx);
void launch_latent_attention(const LatentAttentionParams& a, Stream s);

// Backend::write_rows: dst rows positions[i] (device i32, or null: row0 + i) = src rows
// [n, c] f32, stored as f32 or (bf16) rounded to nearest even.
void launch_write_rows(const float* src, void* dst, bool bf16, const int32_t* positions, int64_t row0, int64_t n,
                       int64_t c, Stream s);

// Backend::matmul_heads for few rows: y[i, h, r] = x[i, h, :] . w[h m + r, :] for i < n (n <=
// kMatmulHeadsMaxRows), w f32, f16 or bf16 [H m, k].
constexpr int64_t kMatmulHeadsMaxRows = 8;
void launch_matmul_heads(const float* x, const void* w, WType wtype, float* y, int64_t n, int64_t H, int64_t m,
                         int64_t k, Stream s);

}  // namespace sluice::cuda
