// QSA indexer: token keys, block keys, block selection.
#include "models/qsa.h"

#include <vector>

#include "models/hybrid_weights.h"

namespace sluice {

QsaState new_qsa_state(Backend& be, const QsaSpec& s, int64_t n_ctx) {
  QsaState st;
  st.keys = be.alloc(DType::f32, {n_ctx, s.head_dim});
  st.block_keys = be.alloc(DType::f32, {n_ctx / s.compress_ratio, s.head_dim});
  return st;
}

QsaWeights load_qsa(WeightLoader& wl, const std::string& p, const QsaSpec& s) {
  QsaWeights w;
  w.qk = wl.take_matrix(p + "index_qk_proj.weight", {(s.n_head + 1) * s.head_dim, s.n_embd});
  w.q_norm = take_norm_plus_one(wl, p + "q_layernorm.weight", {s.head_dim});
  w.k_norm = take_norm_plus_one(wl, p + "k_layernorm.weight", {s.head_dim});
  return w;
}

Tensor qsa_select_tokens(Backend& be, const QsaSpec& s, const RopeConfig& rope, const QsaWeights& w,
                         const Tensor& h, QsaState& st, int64_t n_past, const Tensor& cos, const Tensor& sin) {
  const int64_t n = h.rows(), hd = s.head_dim, c = s.compress_ratio, qd = s.n_head * hd;
  Tensor qk = be.alloc(DType::f32, {n, qd + hd});
  be.matmul(h, w.qk, qk);
  Tensor q = be.alloc(DType::f32, {n, s.n_head, hd});
  be.copy_cols(qk, 0, q.reshape({n, qd}), 0, qd);
  be.copy_cols(qk, qd, st.keys.slice_rows(n_past, n), 0, hd);
  be.rms_norm(q.reshape({n * s.n_head, hd}), w.q_norm, s.norm_eps, q.reshape({n * s.n_head, hd}));
  be.rope(q, cos, sin, rope.rot_dim, rope.interleaved);

  // Blocks completed by these tokens: mean of their raw keys, normalized, rotated at the
  // block's first position.
  const int64_t done = (n_past + n) / c;
  if (done > st.n_blocks) {
    const int64_t m = done - st.n_blocks;
    Tensor bk = st.block_keys.slice_rows(st.n_blocks, m);
    be.mean_rows(st.keys.slice_rows(st.n_blocks * c, m * c), c, bk);
    be.rms_norm(bk, w.k_norm, s.norm_eps, bk);
    std::vector<int64_t> pos(m);
    for (int64_t b = 0; b < m; ++b) pos[b] = (st.n_blocks + b) * c;
    std::vector<float> cos_h, sin_h;
    rope_tables(rope, pos, cos_h, sin_h);
    Tensor bcos = be.alloc(DType::f32, {m, rope.rot_dim / 2}), bsin = be.alloc(DType::f32, {m, rope.rot_dim / 2});
    be.from_host(bcos, cos_h.data());
    be.from_host(bsin, sin_h.data());
    be.rope(bk.reshape({m, 1, hd}), bcos, bsin, rope.rot_dim, rope.interleaved);
    st.n_blocks = done;
  }
  Tensor idx = be.alloc(DType::i32, {n, s.max_tokens()});
  QsaParams params;
  params.n_past = n_past;
  params.compress_ratio = c;
  params.block_topk = s.block_topk();
  be.qsa_select(q, st.block_keys, idx, params);
  return idx;
}

}  // namespace sluice
