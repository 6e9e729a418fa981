// Shared building blocks of the decoder families: grouped-query attention (optional q/k
// norm, biases, partial rotary, sliding window, qkv clipping) and its rope tables. The router
// and the expert math (also the dense SwiGLU MLP) live in the experts layer
// (experts/routing.h, experts/expert_math.h). Families compose these; none of them switches
// on the family.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "core/expert_weights.h"
#include "experts/expert_math.h"
#include "experts/routing.h"
#include "models/rope.h"

namespace sluice {

// ---- attention ----
enum class QkNorm { none, per_head, whole };  // per_head: RMSNorm over head_dim (Qwen3);
                                              // whole: over all heads at once (OLMoE)
struct AttentionSpec {
  int64_t n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  QkNorm qk_norm = QkNorm::none;
  float norm_eps = 1e-6f;
  float scale = 0;              // q.k scale, 1/sqrt(head_dim) unless a family says otherwise
  int64_t sliding_window = 0;   // 0: full causal
  std::optional<float> clip_qkv;
  int64_t chunk = 0;            // chunked attention (AttentionParams::chunk); 0: none
  int64_t temperature_floor_scale = 0;  // attention temperature tuning (AttentionParams); 0: off
  float temperature_attn_scale = 0.0f;
};

struct AttentionWeights {
  Tensor q, k, v, o;                  // [n_head*hd, n_embd], [n_kv*hd, n_embd] x2, [n_embd, n_head*hd]
  Tensor q_bias, k_bias, v_bias, o_bias;  // optional
  Tensor q_norm, k_norm;              // [hd] (per_head) or [n_head*hd] / [n_kv*hd] (whole)
  Tensor sinks;                       // [n_head] attention sinks (gpt-oss; AttentionParams), optional
  Tensor qkv;  // [(n_head + 2 n_kv) hd, n_embd] when fused (fuse_qkv): q, k, v are its row slices
};

// Puts q, k and v in one weight when the backend gains from it (Backend::concat_rows), so a
// decode token's projections are one product; q, k and v stay usable as before.
void fuse_qkv(Backend& be, AttentionWeights& w);

struct KvLayer {
  Tensor k, v;  // [n_ctx, n_head_kv, head_dim] of Backend::kv_dtype (f32 or bf16)
};

// Rows [from, n) of src into the same rows of dst (tensors of per-token rows, [n_ctx, ...]:
// prompt caching's copies of a state's prefix, Model::copy_prefix). Nothing for an empty
// tensor or range.
void copy_rows(Backend& be, const Tensor& src, const Tensor& dst, int64_t from, int64_t n);
void copy_kv_rows(Backend& be, const KvLayer& src, const KvLayer& dst, int64_t from, int64_t n);

// What an attention block's output projection goes into: out (then = null), or the residual
// stream with the next norm (x += out; h = rms_norm(x, norm, eps): Backend::matmul_add_rms_norm,
// one launch for a decode row on CUDA; out is then scratch).
struct ResidualNorm {
  Tensor x;     // [n, n_embd] the residual stream
  Tensor norm;  // [n_embd] the next norm's weight
  float eps = 0;
  Tensor h;     // [n, n_embd] out: the normed row
};

// out = att . o^T (+ o_bias): an attention block's output projection; with then, the residual
// add and the next norm after it (one fused op where there is no bias).
void attention_output(Backend& be, const Tensor& o, const Tensor& o_bias, const Tensor& att, const Tensor& out,
                      const ResidualNorm* then);

// out[n, n_embd] = attention(h[n, n_embd]) for tokens at positions n_past.., appending their
// keys and values to kv. cos/sin: [n, rot_dim/2] for these positions. positions: empty, or
// the same positions as an i32 [n] tensor on the backend, which the KV append and the
// attention then read on the device (a captured decode graph replays at any position).
// then: see ResidualNorm (h may be then->h: it is read before it is written).
void attention_block(Backend& be, const AttentionSpec& spec, const RopeConfig& rope, const AttentionWeights& w,
                     const Tensor& h, KvLayer& kv, int64_t n_past, const Tensor& cos, const Tensor& sin,
                     const Tensor& out, const Tensor& positions = {}, const ResidualNorm* then = nullptr);

// One sequence's rows of a batch: rows [row0, row0 + n) of h sit at positions n_past.. of the
// sequence whose keys and values are kv.
struct AttentionSegment {
  int64_t row0 = 0, n = 0;
  KvLayer* kv = nullptr;
  int64_t n_past = 0;
};

// attention_block for the rows of several sequences at once (a batched decode step): the
// projections run over all rows, attention per segment against its own cache (one row a
// segment, the decode step: Backend::attention_inputs_rows and attention_rows, one launch
// each on CUDA). cos/sin: [n, rot_dim/2], each row's own position; positions: optional i32
// [n] on the backend holding every row's position (read when the ops run: a captured batch
// step replays at other positions). Every row's result is what attention_block gives for its
// sequence alone (bit for bit on the CPU, whose products do not depend on the batch).
void attention_block_segments(Backend& be, const AttentionSpec& spec, const RopeConfig& rope,
                              const AttentionWeights& w, const Tensor& h, std::span<const AttentionSegment> segments,
                              const Tensor& cos, const Tensor& sin, const Tensor& out, const Tensor& positions,
                              const ResidualNorm* then = nullptr);

// cos and sin tables [n, rot_dim / 2] on the backend for positions n_past .. n_past + n - 1.
struct RopeTables {
  Tensor cos, sin;
};
RopeTables rope_tables_for(Backend& be, const RopeConfig& rope, int64_t n_past, int64_t n);
// The same for any positions (one row each).
RopeTables rope_tables_at(Backend& be, const RopeConfig& rope, std::span<const int64_t> positions);

}  // namespace sluice
