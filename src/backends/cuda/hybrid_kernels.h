// Launchers of the CUDA kernels of the hybrid Qwen families (Gated DeltaNet, hyper-connections,
// PLE, QSA), defined one op family per .cu file beside their CPU references in backends/cpu:
// columns.cu, activation.cu, norm_groups.cu, conv1d.cu, delta_net.cu, hyper.cu, qsa.cu.
// Plain C++ declarations (the host side is C++20, the kernels C++17): pointers are device
// memory, sizes and strides in elements, everything enqueued on `s` (cudaStream_t). Kernels
// with many arguments take a POD params struct.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice::cuda {

// dst[r, dst_col + j] = src[r, src_col + j], j < n_cols, every row r < rows.
void launch_copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                      int64_t n_cols, Stream s);

// x[i] = out_mul * act(x[i] / in_div); act 0 sigmoid, 1 silu (Activation's order).
constexpr int kActSigmoid = 0, kActSilu = 1, kActGeluTanh = 2, kActTanh = 3;  // launch_activate's act
void launch_activate(float* x, int64_t n, int act, float in_div, float out_mul, Stream s);
// x[i] *= y[i] (cols == 0), or x[r, :] *= y[r] (per row, cols = x.cols()).
void launch_mul(float* x, const float* y, int64_t n, int64_t per_row_cols, Stream s);

// y[r, g*group + i] = x[...] / sqrt(mean over the group of x^2 + eps) * w[g*group + i]
// (w f32 [cols] or null); y may alias x.
void launch_rms_norm_groups(const float* x, const float* w, float* y, int64_t rows, int64_t cols, int64_t group,
                            float eps, Stream s);

struct Conv1dParams {
  const float* x;    // [n, c], the new inputs
  const float* w;    // [c, K], taps oldest first
  float* state;      // [(K - 1) * dilation, c], the latest earlier inputs, oldest first; updated
  float* out;        // [n, c]
  int64_t n;         // tokens
  int64_t c;         // channels
  int64_t K;         // taps
  int64_t dilation;  // tokens between taps
  bool silu;         // out = silu(conv) instead of conv
};
void launch_causal_conv1d(const Conv1dParams& p, Stream s);

// g[i] = -exp(A_log[h]) softplus(a[i] + dt_bias[h]), beta[i] = sigmoid(b[i]); h = i % H.
void launch_delta_net_gates(const float* a, const float* b, const float* A_log, const float* dt_bias, float* g,
                            float* beta, int64_t n, int64_t H, Stream s);

struct DeltaRuleKernelParams {
  const float* q;     // [n, hk, dk]
  const float* k;     // [n, hk, dk]
  const float* v;     // [n, hv, dv]
  const float* g;     // [n, hv], log decay per token and value head
  const float* beta;  // [n, hv]
  float* state;       // [hv, dk, dv], read and updated in place
  float* out;         // [n, hv, dv]
  int64_t n, hk, hv, dk, dv;
};
// The recurrent form, token by token (delta_net.cu says why chunked calls use it too).
// dk <= kDeltaMaxDk.
constexpr int64_t kDeltaMaxDk = 256;
void launch_gated_delta_rule(const DeltaRuleKernelParams& p, Stream s);

// out[r, :] = (sum over s of sigmoid(logits[r, s, :]) xn[r, s, :]) / n_stream.
void launch_hyper_mix(const float* xn, const float* logits, float* out, int64_t n, int64_t n_stream, int64_t c,
                      Stream s);
// x[r, s, :] += y[r, :] w[r, s].
void launch_hyper_inject(float* x, const float* y, const float* w, int64_t n, int64_t n_stream, int64_t c, Stream s);
// out[r, s, :] = sigmoid(signed_sqrt(key[r, s, :] . query[r, s, :] / sqrt(c))) value[r, :].
void launch_ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
                     int64_t n_stream, int64_t c, Stream s);

// dst[i, :] = mean of src rows [i * group, (i + 1) * group), in row order.
void launch_mean_rows(const float* src, float* dst, int64_t m, int64_t group, int64_t c, Stream s);

struct QsaSelectParams {
  const float* q;           // [n, n_head, d]
  const float* block_keys;  // [>= (n_past + n) / c, d]
  int32_t* idx;             // [n, width], width = block_topk * c + c - 1
  uint32_t* scratch;        // [n, scratch_stride]: the bits of each row's block scores
  int32_t* order;           // [n, scratch_stride]: block indices, for rows whose ties torch breaks
  int64_t scratch_stride;   // >= (n_past + n) / c
  int64_t n, n_head, d;
  int64_t n_past;           // position of query row 0
  int64_t c;                // tokens per block (compress_ratio)
  int64_t block_topk;       // complete blocks kept per query
  int64_t width;
  float sqrt_d;             // sqrt(d) rounded to f32, the scores' divisor (as the CPU's)
};
void launch_qsa_select(const QsaSelectParams& p, Stream s);

struct AttentionIndexedParams {
  const float* q;    // [n, n_head, d]
  const float* k;    // [n_ctx, n_kv, d]
  const float* v;    // [n_ctx, n_kv, d]
  const int32_t* idx;  // [n, width]: key positions, -1 entries ignored
  float* out;        // [n, n_head, d]
  int64_t n, n_head, n_kv, d, n_ctx, width;
  float scale;       // applied to q.k
};
void launch_attention_indexed(const AttentionIndexedParams& p, Stream s);

}  // namespace sluice::cuda
