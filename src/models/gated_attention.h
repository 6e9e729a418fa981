// Gated full attention of the hybrid families: q_proj yields, per head, the query and an
// output gate ([n, n_head, 2 head_dim]: query dims first); per-head q/k RMSNorm with (1 + w)
// weights; partial rotary embedding; attention output times sigmoid(gate) before o_proj.
// With QSA (qwen4_exp) each query attends only to the tokens its indexer keeps.
#pragma once

#include <optional>
#include <string>

#include "models/blocks.h"
#include "models/qsa.h"

namespace sluice {

struct GatedAttentionSpec {
  AttentionSpec attn;         // heads, head_dim, norm eps, scale (q/k norm per head)
  bool bias = false;          // attention_bias
  std::optional<QsaSpec> qsa;
};

struct GatedAttentionWeights {
  Tensor q;                       // [n_head * 2 * head_dim, n_embd]
  Tensor k, v;                    // [n_kv_head * head_dim, n_embd]
  Tensor o;                       // [n_embd, n_head * head_dim]
  Tensor q_bias, k_bias, v_bias, o_bias;  // optional
  Tensor q_norm, k_norm;          // f32 [head_dim], 1 + w
  QsaWeights qsa;
};

// Per sequence and layer.
struct GatedAttentionState {
  KvLayer kv;
  QsaState qsa;
};

GatedAttentionState new_gated_attention_state(Backend& be, const GatedAttentionSpec& spec, int64_t n_ctx);

// prefix ends with '.', e.g. "model.layers.3.self_attn.".
GatedAttentionWeights load_gated_attention(WeightLoader& wl, const std::string& prefix, const GatedAttentionSpec& spec);

// out[n, n_embd] for h[n, n_embd] at positions n_past..; cos/sin [n, rot_dim / 2].
void gated_attention_block(Backend& be, const GatedAttentionSpec& spec, const RopeConfig& rope,
                           const GatedAttentionWeights& w, const Tensor& h, GatedAttentionState& st, int64_t n_past,
                           const Tensor& cos, const Tensor& sin, const Tensor& out);

}  // namespace sluice
