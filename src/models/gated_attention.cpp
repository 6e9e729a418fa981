// Gated attention block (with optional QSA).
#include "models/gated_attention.h"

#include "models/hybrid_weights.h"

namespace sluice {

GatedAttentionState new_gated_attention_state(Backend& be, const GatedAttentionSpec& s, int64_t n_ctx) {
  GatedAttentionState st;
  st.kv = KvLayer{be.alloc(DType::f32, {n_ctx, s.attn.n_head_kv, s.attn.head_dim}),
                  be.alloc(DType::f32, {n_ctx, s.attn.n_head_kv, s.attn.head_dim})};
  if (s.qsa) st.qsa = new_qsa_state(be, *s.qsa, n_ctx);
  return st;
}

GatedAttentionWeights load_gated_attention(WeightLoader& wl, const std::string& p, const GatedAttentionSpec& s) {
  const AttentionSpec& a = s.attn;
  const int64_t q_dim = a.n_head * a.head_dim, kv_dim = a.n_head_kv * a.head_dim;
  GatedAttentionWeights w;
  w.q = wl.take_matrix(p + "q_proj.weight", {2 * q_dim, a.n_embd});
  w.k = wl.take_matrix(p + "k_proj.weight", {kv_dim, a.n_embd});
  w.v = wl.take_matrix(p + "v_proj.weight", {kv_dim, a.n_embd});
  w.o = wl.take_matrix(p + "o_proj.weight", {a.n_embd, q_dim});
  if (s.bias) {
    w.q_bias = wl.take(p + "q_proj.bias", {2 * q_dim});
    w.k_bias = wl.take(p + "k_proj.bias", {kv_dim});
    w.v_bias = wl.take(p + "v_proj.bias", {kv_dim});
    w.o_bias = wl.take(p + "o_proj.bias", {a.n_embd});
  }
  w.q_norm = take_norm_plus_one(wl, p + "q_norm.weight", {a.head_dim});
  w.k_norm = take_norm_plus_one(wl, p + "k_norm.weight", {a.head_dim});
  if (s.qsa) w.qsa = load_qsa(wl, p + "indexer.", *s.qsa);
  return w;
}

void gated_attention_block(Backend& be, const GatedAttentionSpec& s, const RopeConfig& rope,
                           const GatedAttentionWeights& w, const Tensor& h, GatedAttentionState& st, int64_t n_past,
                           const Tensor& cos, const Tensor& sin, const Tensor& out) {
  const AttentionSpec& a = s.attn;
  const int64_t n = h.rows(), hd = a.head_dim, nh = a.n_head, nkv = a.n_head_kv;
  SLUICE_CHECK(n_past + n <= st.kv.k.shape[0], Status::invalid_argument, "context full: ", n_past + n,
               " tokens exceed the context size ", st.kv.k.shape[0]);
  // The indexer reads the block input, not the attention's projections: run it first.
  Tensor idx;
  if (s.qsa) idx = qsa_select_tokens(be, *s.qsa, rope, w.qsa, h, st.qsa, n_past, cos, sin);

  Tensor qg = be.alloc(DType::f32, {n, nh, 2 * hd});  // per head: query, then gate
  be.matmul(h, w.q, qg.reshape({n, 2 * nh * hd}));
  if (!w.q_bias.empty()) be.add_bias(qg.reshape({n, 2 * nh * hd}), w.q_bias);
  Tensor q = be.alloc(DType::f32, {n, nh, hd});
  Tensor gate = be.alloc(DType::f32, {n, nh * hd});
  be.copy_cols(qg.reshape({n * nh, 2 * hd}), 0, q.reshape({n * nh, hd}), 0, hd);
  be.copy_cols(qg.reshape({n * nh, 2 * hd}), hd, gate.reshape({n * nh, hd}), 0, hd);
  Tensor k = be.alloc(DType::f32, {n, nkv, hd});
  Tensor v = be.alloc(DType::f32, {n, nkv, hd});
  be.matmul(h, w.k, k.reshape({n, nkv * hd}));
  be.matmul(h, w.v, v.reshape({n, nkv * hd}));
  if (!w.k_bias.empty()) be.add_bias(k.reshape({n, nkv * hd}), w.k_bias);
  if (!w.v_bias.empty()) be.add_bias(v.reshape({n, nkv * hd}), w.v_bias);
  be.rms_norm(q.reshape({n * nh, hd}), w.q_norm, a.norm_eps, q.reshape({n * nh, hd}));
  be.rms_norm(k.reshape({n * nkv, hd}), w.k_norm, a.norm_eps, k.reshape({n * nkv, hd}));
  be.rope(q, cos, sin, rope.rot_dim, rope.interleaved);
  be.rope(k, cos, sin, rope.rot_dim, rope.interleaved);
  be.copy(k, st.kv.k.slice_rows(n_past, n));
  be.copy(v, st.kv.v.slice_rows(n_past, n));

  Tensor att = be.alloc(DType::f32, {n, nh, hd});
  if (s.qsa) {
    be.attention_indexed(q, st.kv.k, st.kv.v, idx, att, a.scale);
  } else {
    AttentionParams params;
    params.n_past = n_past;
    params.scale = a.scale;
    be.attention(q, st.kv.k, st.kv.v, att, params);
  }
  be.activate(gate, Activation::sigmoid);
  be.mul(att.reshape({n, nh * hd}), gate);
  be.matmul(att.reshape({n, nh * hd}), w.o, out);
  if (!w.o_bias.empty()) be.add_bias(out, w.o_bias);
}

}  // namespace sluice
