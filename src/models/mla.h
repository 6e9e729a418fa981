// Multi-head latent attention (DeepSeek-V3, Kimi K2; DESIGN.md "Multi-head latent attention").
// With H heads, R = kv_lora_rank, dn / dr = the non-rotary / rotary query-key dims, dv = the
// value dims, for rows x [n, n_embd]:
//   q   = (q_lora_rank ? rms_norm(x W_qa^T) W_qb^T : x W_q^T)     [n, H, dn + dr] (nope, then rope)
//   kv  = x W_kva^T                                                [n, R + dr]
//   c   = rms_norm(kv[:, :R]);  k_r = rope(kv[:, R:])             one latent and one rotary key
//   k_h = [c W_UK_h^T, k_r],  v_h = c W_UV_h^T                    (kv_b_proj's rows of head h)
//   out = concat_h softmax(scale q_h k_h^T) v_h  W_o^T
// The KV cache holds, per token and layer, only c then k_r (R + dr values: 576 for DeepSeek-V3,
// not 128 heads x 320). The absorbed form, which the decode step and the CPU always take,
// never expands it: q_lat_h = W_UK_h^T q_nope_h (so q_lat_h . c = q_nope_h . k_nope_h), one
// attention of every head over the cache's rows as keys (Backend::attention_latent), then
// W_UV_h after the weighted sum of c. The expanded form (a prompt on a backend whose
// attention runs faster per head, Backend::latent_attention_expands_prompts) forms k_h and v_h
// for every cached row and runs the ordinary attention; both compute the same sums in another
// order. The rotary part is rotated in the checkpoint's layout: DeepSeek's interleaved pairs
// (2i, 2i + 1) where rope_interleave is set (the same dot products as transformers'
// de-interleaved copy), else neox halves.
#pragma once

#include <cstdint>
#include <span>

#include "backends/backend.h"
#include "models/blocks.h"
#include "models/weight_loader.h"

namespace sluice {

struct MlaSpec {
  int64_t n_embd = 0, n_head = 0;
  int64_t q_lora_rank = 0;  // 0: a plain q projection
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  float norm_eps = 1e-6f;   // of the q_a and kv_a norms (transformers: RMSNorm's default, not rms_norm_eps)
  float scale = 0;          // q.k scale: qk_head_dim^-1/2, times YaRN's mscale^2 where the config asks
  bool attention_bias = false;  // q_a_proj, kv_a_proj_with_mqa and o_proj carry biases
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // a cache row
};

struct MlaWeights {
  Tensor q;                   // [H (dn + dr), n_embd] without a q-LoRA, else empty
  Tensor q_a, q_a_norm, q_b;  // [qr, n_embd], [qr], [H (dn + dr), qr] with a q-LoRA
  Tensor kv_a, kv_a_norm;     // [R + dr, n_embd], [R]
  Tensor o;                   // [n_embd, H dv]
  Tensor q_a_bias, kv_a_bias, o_bias;  // attention_bias: [qr], [R + dr], [n_embd]
  // From kv_b_proj [H (dn + dv), R]:
  Tensor w_uk;    // [H dn, R] the key up-projection, head h's rows at h dn (expanded form)
  Tensor w_uk_t;  // [H R, dn] each head's W_UK transposed, head h's rows at h R (absorbed query)
  Tensor w_uv;    // [H dv, R] the value up-projection, head h's rows at h dv
};

// The weights under prefix ("model.layers.3.self_attn."): q_proj or q_a_proj + q_a_layernorm +
// q_b_proj, kv_a_proj_with_mqa + kv_a_layernorm, kv_b_proj (taken on the host and split into
// w_uk, w_uk_t and w_uv in its stored dtype), o_proj.
MlaWeights load_mla(WeightLoader& wl, const std::string& prefix, const MlaSpec& spec);

// Which form computes the attention (mla_attention_block): the backend's choice (absorbed for
// one row, a captured step or the CPU), or one of the two forms (tests).
enum class MlaForm { automatic, absorbed, expanded };

// out[n, n_embd] = MLA of h[n, n_embd] at positions n_past.., appending the rows' latents to
// cache ([n_ctx, 1, R + dr] of the backend's KV dtype). cos/sin [n, dr / 2]; positions and
// then as attention_block (blocks.h).
void mla_attention_block(Backend& be, const MlaSpec& spec, const RopeConfig& rope, const MlaWeights& w,
                         const Tensor& h, const Tensor& cache, int64_t n_past, const Tensor& cos, const Tensor& sin,
                         const Tensor& out, const Tensor& positions = {}, const ResidualNorm* then = nullptr,
                         MlaForm form = MlaForm::automatic);

// mla_attention_block for the rows of several sequences (a batched decode step): segment s's
// rows against its own latent cache (s.kv->k), always in the absorbed form. Every row's result
// is what mla_attention_block gives for its sequence alone (bit for bit on the CPU).
void mla_attention_block_segments(Backend& be, const MlaSpec& spec, const RopeConfig& rope, const MlaWeights& w,
                                  const Tensor& h, std::span<const AttentionSegment> segments, const Tensor& cos,
                                  const Tensor& sin, const Tensor& out, const Tensor& positions,
                                  const ResidualNorm* then = nullptr);

}  // namespace sluice
