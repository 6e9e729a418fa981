// Launchers of the CUDA backend's kernels (defined in the .cu file of each op family). Plain
// C++ declarations: pointers are device memory, sizes in elements, all on `stream`.
#pragma once

#include <cstdint>

#include "backends/cuda/wtype.h"

namespace sluice::cuda {

using Stream = void*;  // cudaStream_t

// Decode matrix-vector product (matvec.cu) for 1 <= n <= kMatvecMaxRows: y[n, m] = x[n, k] .
// w[m, k]^T; dtype: 0 f32, 1 f16, 2 bf16, 10 q8, 11 q4, 12 q2 (scales for the quantized kinds).
constexpr int64_t kMatvecMaxRows = 4;
void launch_matvec(const float* x, const void* w, const void* scales, WType dtype, float* y, int64_t n, int64_t m,
                   int64_t k, Stream s);
// Prefill matmul (matmul_tiled.cu), any n, the same weight codes as launch_matvec.
void launch_matmul_tiled(const float* x, const void* w, const void* scales, WType dtype, float* y, int64_t n, int64_t m,
                         int64_t k, Stream s);
// y[r, :] = x[r, :] * rsqrt(mean(x^2) + eps) * w (w may be null; wtype 0 f32, 1 f16, 2 bf16).
void launch_rms_norm(const float* x, const void* w, WType wtype, float* y, int64_t rows, int64_t cols, float eps, Stream s);
// x[r, :] += add[r, :], then y = rms_norm(x) as launch_rms_norm (bit for bit the two launches).
void launch_add_rms_norm(float* x, const float* add, const void* w, WType wtype, float* y, int64_t rows, int64_t cols,
                         float eps, Stream s);
// Attention inputs (attention_inputs.cu): q [n, nh, d] and k [n, nkv, d] per-head RMSNorm'd
// (q_norm / k_norm null: none; wtypes as launch_rms_norm) and rotated in place (cos/sin
// [n, rot/2]), k and v [n, nkv, d] written to k_cache / v_cache [n_ctx, nkv, d] rows
// positions[i] (device i32; null: n_past + i).
void launch_attention_inputs(float* q, float* k, const float* v, const void* q_norm, WType q_norm_wtype,
                             const void* k_norm, WType k_norm_wtype, float eps, const float* cos, const float* sin,
                             int64_t rot, bool interleaved, float* k_cache, float* v_cache, const int32_t* positions,
                             int64_t n_past, int64_t n, int64_t nh, int64_t nkv, int64_t d, Stream s);
void launch_add_bias(float* y, const void* b, WType wtype, int64_t rows, int64_t cols, Stream s);
// x[n, heads, d] in place; cos/sin [n, rot/2].
void launch_rope(float* x, const float* cos, const float* sin, int64_t n, int64_t heads, int64_t d, int64_t rot,
                 bool interleaved, Stream s);
// q [n, hq, d], k/v [ctx, hkv, d], out [n, hq, d]. n_past_dev: null, or device memory whose
// value replaces n_past when the kernel runs (captured graphs).
void launch_attention_at(const float* q, const float* k, const float* v, float* out, int64_t n, int64_t hq,
                         int64_t hkv, int64_t d, int64_t n_past, const int32_t* n_past_dev, float scale,
                         int64_t window, Stream s);
void launch_swiglu(const float* g, const float* u, float* out, int64_t n, Stream s);
void launch_add(float* x, const float* y, int64_t n, Stream s);
void launch_clamp(float* x, float lo, float hi, int64_t n, Stream s);
void launch_fill(float* x, float v, int64_t n, Stream s);
// out[i, :] = table[ids[i], :] (table any weight type), ids device.
void launch_get_rows(const void* table, WType wtype, const int32_t* ids, float* out, int64_t n, int64_t cols, Stream s);
void launch_gather_rows(const float* src, const int32_t* idx, float* out, int64_t n, int64_t cols, Stream s);
void launch_scatter_rows(const float* src, const int32_t* idx, float* dst, int64_t n, int64_t cols, Stream s);
// out[t, :] = sum_r w[t*k + r] * e[t*k + r, :] in r order; w device.
void launch_moe_combine(const float* e, const float* w, float* out, int64_t n, int64_t k, int64_t cols, Stream s);

}  // namespace sluice::cuda
