// Launchers of the CUDA backend's kernels (defined in the .cu file of each op family). Plain
// C++ declarations: pointers are device memory, sizes in elements, all on `stream`.
#pragma once

#include <cstdint>

#include "backends/cuda/wtype.h"

namespace sluice::cuda {

using Stream = void*;  // cudaStream_t

// y[n, m] = x[n, k] . w[m, k]^T.
struct MatmulParams {
  const float* x = nullptr;       // [n, k] f32
  const void* w = nullptr;        // [m, k] of type wtype
  const void* scales = nullptr;   // the quantized kinds' scales (core/quant.h), else null
  WType wtype = WType::f32;       // any but unavailable
  float* y = nullptr;             // [n, m] f32
  int64_t n = 0, m = 0, k = 0;
};
// Decode matrix-vector product (matvec.cu) for 1 <= n <= kMatvecMaxRows.
constexpr int64_t kMatvecMaxRows = 8;
// Batch decode (up to kMatvecBatchRows rows) of a weight with fewer than kMatvecPassMaxCols
// rows: matvec passes of kMatvecMaxRows rows each, since the tensor-core tiles would run on
// fewer blocks than the GPU has SMs, one 64-column tile each, latency-bound (a batch of 8 to
// 64 sequences through q/k/v/o and the router). The weight is read once a pass.
constexpr int64_t kMatvecBatchRows = 64;
constexpr int64_t kMatvecPassMaxCols = 16384;
void launch_matvec(const MatmulParams& p, Stream s);
// The output projection of a decode token with the residual add and the next norm after it
// (matvec.cu): p.y [1, m] is the residual stream x; x += p.x . w^T, then h = rms_norm(x) *
// norm_w, as launch_matvec into a temporary followed by launch_add_rms_norm.
struct MatvecResidualNorm {
  const void* norm_w = nullptr;    // [m] of norm_type (f32, f16 or bf16), or null
  WType norm_type = WType::f32;
  float* h = nullptr;              // [1, m] out
  float eps = 0.0f;
  int* counter = nullptr;          // one int, zero (each launch leaves it zero)
};
bool matvec_add_rms_norm_supported(int64_t n, int64_t m, const void* y, const void* h);
void launch_matvec_add_rms_norm(const MatmulParams& p, const MatvecResidualNorm& rn, Stream s);
// Prefill matmul (matmul_tiled.cu), any n.
void launch_matmul_tiled(const MatmulParams& p, Stream s);
// parts [3][rows][k] bf16 = x [rows, k] f32 split into hi, mid, lo (mma_tile.cuh's split: x =
// hi + mid + lo in all 24 bits), for gemm_bf16.h's cuBLAS products. x and parts 16-byte
// aligned, rows * k a multiple of 4.
void launch_split_bf16_parts(const float* x, int64_t rows, int64_t k, void* parts, Stream s);
// y[r, :] = x[r, :] * rsqrt(mean(x^2) + eps) * w (w may be null; wtype 0 f32, 1 f16, 2 bf16).
void launch_rms_norm(const float* x, const void* w, WType wtype, float* y, int64_t rows, int64_t cols, float eps, Stream s);
// x[r, :] += add[r, :], then y = rms_norm(x) as launch_rms_norm (bit for bit the two launches).
void launch_add_rms_norm(float* x, const float* add, const void* w, WType wtype, float* y, int64_t rows, int64_t cols,
                         float eps, Stream s);
// The caches of a batch decode step's rows (Backend::RowCaches), passed to the kernels by
// value: row b's K and V caches [n_ctx_b, nkv, d], f32 or bf16 (every row the same: the
// params' kv_bf16).
constexpr int64_t kMaxCacheRows = 64;
struct RowCachePtrs {
  void* k[kMaxCacheRows];
  void* v[kMaxCacheRows];
};

// Attention inputs (attention_inputs.cu): q and k per-head RMSNorm'd and rotated in place, k
// and v written to the caches.
struct AttentionInputsParams {
  float* q = nullptr;                   // [n, nh, d], in place
  float* k = nullptr;                   // [n, nkv, d], in place
  const float* v = nullptr;             // [n, nkv, d]
  const void* q_norm = nullptr;         // [d] weights, or null: no norm
  WType q_norm_wtype = WType::f32;      // f32, f16 or bf16
  const void* k_norm = nullptr;         // [d] weights, or null: no norm
  WType k_norm_wtype = WType::f32;
  float eps = 1e-6f;
  const float* cos = nullptr;           // [n, rot / 2]
  const float* sin = nullptr;           // [n, rot / 2]
  int64_t rot = 0;                      // rotated dims of each head (even, <= d)
  bool interleaved = false;             // GPT-J pairs (2i, 2i+1); else neox (i, i + rot/2)
  void* k_cache = nullptr;              // [n_ctx, nkv, d] f32, or bf16 when kv_bf16 (rounded when
  void* v_cache = nullptr;              // [n_ctx, nkv, d]   written, to nearest even)
  bool kv_bf16 = false;
  const int32_t* positions = nullptr;   // device i32 [n]: the cache rows; null: n_past + i
  int64_t n_past = 0;
  int64_t n = 0, nh = 0, nkv = 0, d = 0;
  // Set (n <= kMaxCacheRows, positions set): row i is a sequence of its own, into the caches
  // rows->k[i] / rows->v[i] instead of k_cache / v_cache.
  const RowCachePtrs* rows = nullptr;
};
void launch_attention_inputs(const AttentionInputsParams& p, Stream s);
void launch_add_bias(float* y, const void* b, WType wtype, int64_t rows, int64_t cols, Stream s);
// x[n, heads, d] in place; cos/sin [n, rot/2].
void launch_rope(float* x, const float* cos, const float* sin, int64_t n, int64_t heads, int64_t d, int64_t rot,
                 bool interleaved, Stream s);
// Which keys a query at position p sees, and what scales its scores beyond `scale`: keys
// [lo(p), p] with lo the larger of a sliding window's bound and its attention chunk's start
// (Llama 4's rope layers); the scale times log1p(floor((p + 1) / floor_scale)) * attn_scale + 1
// where the temperature is tuned (Llama 4's NoPE layers). common.cuh's attention_lo and
// attention_scale_at compute them.
struct AttentionSpan {
  int64_t window = 0;       // 0: full causal; w: keys in (p - w, p]
  int64_t chunk = 0;        // 0: no chunks; c: keys in [p - p % c, p]
  int64_t floor_scale = 0;  // temperature tuning: 0 off
  float attn_scale = 0.0f;
};

// Causal grouped-query attention (attention.cu) for n query rows at positions n_past + i.
struct AttentionParams {
  const float* q = nullptr;             // [n, hq, d]
  const void* k = nullptr;              // [ctx, hkv, d] f32, or bf16 when kv_bf16
  const void* v = nullptr;              // [ctx, hkv, d]
  bool kv_bf16 = false;
  float* out = nullptr;                 // [n, hq, d]
  int64_t n = 0, hq = 0, hkv = 0, d = 0;
  int64_t n_past = 0;
  const int32_t* n_past_dev = nullptr;  // null, or device memory whose value replaces n_past when
                                        // the kernel runs (captured graphs)
  float scale = 1.0f;                   // on q.k
  int64_t window = 0;                   // 0: full causal; w: keys in (p - w, p]
  const float* sinks = nullptr;         // [hq] f32 attention sinks (gpt-oss; softmax_finish), or null
  int64_t chunk = 0;                    // attention chunks (AttentionSpan); 0: none
  int64_t temperature_floor_scale = 0;  // temperature tuning (AttentionSpan); 0: off
  float temperature_attn_scale = 0.0f;
  AttentionSpan span() const { return {window, chunk, temperature_floor_scale, temperature_attn_scale}; }
};
// Any n: launch_attention_flash when attention_flash_supported(p) and n >= kAttentionFlashMinRows,
// else launch_attention_rows.
void launch_attention_at(const AttentionParams& p, Stream s);
// One block per (query row, head), f32 FMA (attention.cu): any head_dim up to 512.
void launch_attention_rows(const AttentionParams& p, Stream s);
// Tensor cores, 64 query rows a block (attention_flash.cu): head_dim 64, 128 or 256, q, k, v
// and out 16-byte aligned. Below kAttentionFlashMinRows rows its 64-row tiles are mostly idle.
constexpr int64_t kAttentionFlashMinRows = 64;
bool attention_flash_supported(const AttentionParams& p);
void launch_attention_flash(const AttentionParams& p, Stream s);
void launch_swiglu(const float* g, const float* u, float* out, int64_t n, Stream s);
// gpt-oss's clamped SwiGLU (Backend::swiglu_clamped), one thread an element.
void launch_swiglu_clamped(const float* g, const float* u, float* out, int64_t n, float alpha, float limit, Stream s);
void launch_add(float* x, const float* y, int64_t n, Stream s);
void launch_clamp(float* x, float lo, float hi, int64_t n, Stream s);
void launch_fill(float* x, float v, int64_t n, Stream s);
// out[i, :] = table[ids[i], :] as f32 for a table of n_table rows; table any WType but
// unavailable (scales: the quantized kinds' per-row scales, core/quant.h; null otherwise). An
// id outside [0, n_table) reads row 0 instead of memory past the table: ids made on the device
// may be -1 (a decode step enqueued before the host saw that the draw it reads failed).
void launch_get_rows(const void* table, const void* scales, WType wtype, const int32_t* ids, float* out, int64_t n,
                     int64_t cols, int64_t n_table, Stream s);
void launch_gather_rows(const float* src, const int32_t* idx, float* out, int64_t n, int64_t cols, Stream s);
void launch_scatter_rows(const float* src, const int32_t* idx, float* dst, int64_t n, int64_t cols, Stream s);
// out[t, :] = sum_r w[t*k + r] * e[t*k + r, :] in r order; w device, or null: weights of 1
// (the unweighted sum of inputs-scaled experts, ExpertMath::scale_input).
void launch_moe_combine(const float* e, const float* w, float* out, int64_t n, int64_t k, int64_t cols, Stream s);

}  // namespace sluice::cuda
