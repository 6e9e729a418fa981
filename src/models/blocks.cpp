// Shared blocks: attention, rope tables, fused q/k/v.
#include "models/blocks.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace sluice {

namespace {

// q, k, v of n rows: projected (one product when fused and n == 1), biased, normed unless the
// norm goes into attention_inputs (norms_inside), clipped.
struct Qkv {
  Tensor q, k, v;  // [n, nh * hd], [n, nkv * hd] x2
  bool norms_inside = false;
};

Qkv project_qkv(Backend& be, const AttentionSpec& spec, const AttentionWeights& w, const Tensor& h) {
  const int64_t n = h.rows(), hd = spec.head_dim, nh = spec.n_head, nkv = spec.n_head_kv;
  Qkv r;
  Tensor &q = r.q, &k = r.k, &v = r.v;
  if (!w.qkv.empty() && n == 1) {
    // One product for q, k and v (their weights are rows of one tensor): one row of output
    // holds them one after another, so each is a contiguous view.
    Tensor all = be.alloc(DType::f32, {1, (nh + 2 * nkv) * hd});
    be.matmul(h, w.qkv, all);
    auto part = [&](int64_t col, int64_t cols) {
      return Tensor(DType::f32, {1, cols}, all.ptr<float>() + col, all.storage);
    };
    q = part(0, nh * hd);
    k = part(nh * hd, nkv * hd);
    v = part((nh + nkv) * hd, nkv * hd);
  } else {
    q = be.alloc(DType::f32, {n, nh * hd});
    k = be.alloc(DType::f32, {n, nkv * hd});
    v = be.alloc(DType::f32, {n, nkv * hd});
    be.matmul(h, w.q, q);
    be.matmul(h, w.k, k);
    be.matmul(h, w.v, v);
  }
  if (!w.q_bias.empty()) be.add_bias(q, w.q_bias);
  if (!w.k_bias.empty()) be.add_bias(k, w.k_bias);
  if (!w.v_bias.empty()) be.add_bias(v, w.v_bias);
  // Per-head norms go into attention_inputs (with rotary and the cache append: one kernel on
  // CUDA) unless the values are clipped between the norm and the rotary.
  r.norms_inside = spec.qk_norm == QkNorm::per_head && !spec.clip_qkv;
  if (spec.qk_norm == QkNorm::whole) {
    be.rms_norm(q, w.q_norm, spec.norm_eps, q);
    be.rms_norm(k, w.k_norm, spec.norm_eps, k);
  } else if (spec.qk_norm == QkNorm::per_head && !r.norms_inside) {
    be.rms_norm(q.reshape({n * nh, hd}), w.q_norm, spec.norm_eps, q.reshape({n * nh, hd}));
    be.rms_norm(k.reshape({n * nkv, hd}), w.k_norm, spec.norm_eps, k.reshape({n * nkv, hd}));
  }
  if (spec.clip_qkv) {
    be.clamp(q, -*spec.clip_qkv, *spec.clip_qkv);
    be.clamp(k, -*spec.clip_qkv, *spec.clip_qkv);
    be.clamp(v, -*spec.clip_qkv, *spec.clip_qkv);
  }
  return r;
}

// Attention of m rows of one sequence at positions n_past..: q3 [m, nh, hd], k3 and v3
// [m, nkv, hd] (rotated and appended to kv here), cos/sin [m, rot/2]; att [m, nh, hd].
void attend(Backend& be, const AttentionSpec& spec, const RopeConfig& rope, const AttentionWeights& w, bool norms_inside,
            const Tensor& q3, const Tensor& k3, const Tensor& v3, KvLayer& kv, int64_t n_past, const Tensor& cos,
            const Tensor& sin, const Tensor& att, const Tensor& positions) {
  const int64_t m = q3.shape[0];
  SLUICE_CHECK(n_past + m <= kv.k.shape[0], Status::invalid_argument, "context full: ", n_past + m,
               " tokens exceed the context size ", kv.k.shape[0]);
  be.attention_inputs(q3, k3, v3, norms_inside ? w.q_norm : Tensor{}, norms_inside ? w.k_norm : Tensor{},
                      spec.norm_eps, cos, sin, rope.rot_dim, rope.interleaved, kv.k, kv.v, n_past, positions);
  AttentionParams params;
  params.n_past = n_past;
  params.n_past_at = positions;
  params.scale = spec.scale;
  params.sliding_window = spec.sliding_window;
  params.sinks = w.sinks;
  params.chunk = spec.chunk;
  params.temperature_floor_scale = spec.temperature_floor_scale;
  params.temperature_attn_scale = spec.temperature_attn_scale;
  be.attention(q3, kv.k, kv.v, att, params);
}

void output_projection(Backend& be, const AttentionWeights& w, const Tensor& att, const Tensor& out,
                       const ResidualNorm* then) {
  attention_output(be, w.o, w.o_bias, att, out, then);
}

}  // namespace

void attention_output(Backend& be, const Tensor& o, const Tensor& o_bias, const Tensor& att, const Tensor& out,
                      const ResidualNorm* then) {
  if (then && o_bias.empty()) {
    be.matmul_add_rms_norm(att, o, then->x, then->norm, then->eps, then->h);
    return;
  }
  be.matmul(att, o, out);
  if (!o_bias.empty()) be.add_bias(out, o_bias);
  if (then) be.add_rms_norm(then->x, out, then->norm, then->eps, then->h);
}

void attention_block(Backend& be, const AttentionSpec& spec, const RopeConfig& rope, const AttentionWeights& w,
                     const Tensor& h, KvLayer& kv, int64_t n_past, const Tensor& cos, const Tensor& sin,
                     const Tensor& out, const Tensor& positions, const ResidualNorm* then) {
  const int64_t n = h.rows(), hd = spec.head_dim, nh = spec.n_head, nkv = spec.n_head_kv;
  const Qkv p = project_qkv(be, spec, w, h);
  Tensor att = be.alloc(DType::f32, {n, nh, hd});
  attend(be, spec, rope, w, p.norms_inside, p.q.reshape({n, nh, hd}), p.k.reshape({n, nkv, hd}),
         p.v.reshape({n, nkv, hd}), kv, n_past, cos, sin, att, positions);
  output_projection(be, w, att.reshape({n, nh * hd}), out, then);
}

void attention_block_segments(Backend& be, const AttentionSpec& spec, const RopeConfig& rope,
                              const AttentionWeights& w, const Tensor& h, std::span<const AttentionSegment> segments,
                              const Tensor& cos, const Tensor& sin, const Tensor& out, const Tensor& positions,
                              const ResidualNorm* then) {
  const int64_t n = h.rows(), hd = spec.head_dim, nh = spec.n_head, nkv = spec.n_head_kv;
  const Qkv p = project_qkv(be, spec, w, h);
  const Tensor q3 = p.q.reshape({n, nh, hd}), k3 = p.k.reshape({n, nkv, hd}), v3 = p.v.reshape({n, nkv, hd});
  Tensor att = be.alloc(DType::f32, {n, nh, hd});
  // attention_rows takes the window and sinks; chunks and temperature (Llama 4) go per segment.
  bool one_row_each = static_cast<int64_t>(segments.size()) == n && spec.chunk == 0 && spec.temperature_floor_scale == 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const AttentionSegment& s = segments[i];
    SLUICE_CHECK(s.kv && s.row0 >= 0 && s.n > 0 && s.row0 + s.n <= n, Status::internal, "attention segment [", s.row0,
                 ", ", s.row0 + s.n, ") of ", n, " rows");
    SLUICE_CHECK(s.n_past + s.n <= s.kv->k.shape[0], Status::invalid_argument, "context full: ", s.n_past + s.n,
                 " tokens exceed the context size ", s.kv->k.shape[0]);
    one_row_each = one_row_each && s.n == 1 && s.row0 == static_cast<int64_t>(i);
  }
  if (one_row_each) {  // a decode step: each op once for the batch
    std::vector<Tensor> kc, vc;
    std::vector<int64_t> n_past;
    for (const AttentionSegment& s : segments) {
      kc.push_back(s.kv->k);
      vc.push_back(s.kv->v);
      n_past.push_back(s.n_past);
    }
    const Backend::RowCaches caches{kc, vc, n_past, positions};
    be.attention_inputs_rows(q3, k3, v3, p.norms_inside ? w.q_norm : Tensor{}, p.norms_inside ? w.k_norm : Tensor{},
                             spec.norm_eps, cos, sin, rope.rot_dim, rope.interleaved, caches);
    be.attention_rows(q3, att, caches, spec.scale, spec.sliding_window, w.sinks);
  } else {
    for (const AttentionSegment& s : segments)
      attend(be, spec, rope, w, p.norms_inside, q3.slice_rows(s.row0, s.n), k3.slice_rows(s.row0, s.n),
             v3.slice_rows(s.row0, s.n), *s.kv, s.n_past, cos.slice_rows(s.row0, s.n), sin.slice_rows(s.row0, s.n),
             att.slice_rows(s.row0, s.n), positions.empty() ? Tensor{} : positions.slice_rows(s.row0, s.n));
  }
  output_projection(be, w, att.reshape({n, nh * hd}), out, then);
}

void fuse_qkv(Backend& be, AttentionWeights& w) {
  if (w.q.empty() || w.k.empty() || w.v.empty()) return;
  const Tensor parts[3] = {w.q, w.k, w.v};
  Tensor all = be.concat_rows(parts);
  if (all.empty()) return;
  const int64_t mq = w.q.rows(), mk = w.k.rows(), mv = w.v.rows();
  w.q = all.slice_rows(0, mq);
  w.k = all.slice_rows(mq, mk);
  w.v = all.slice_rows(mq + mk, mv);
  w.qkv = std::move(all);
}

RopeTables rope_tables_for(Backend& be, const RopeConfig& rope, int64_t n_past, int64_t n) {
  std::vector<int64_t> pos(n);
  std::iota(pos.begin(), pos.end(), n_past);
  return rope_tables_at(be, rope, pos);
}

RopeTables rope_tables_at(Backend& be, const RopeConfig& rope, std::span<const int64_t> positions) {
  const int64_t n = static_cast<int64_t>(positions.size());
  std::vector<float> cos_h, sin_h;
  rope_tables(rope, positions, cos_h, sin_h);
  const int64_t half = rope.rot_dim / 2;
  RopeTables t{be.alloc(DType::f32, {n, half}), be.alloc(DType::f32, {n, half})};
  be.from_host(t.cos, cos_h.data());
  be.from_host(t.sin, sin_h.data());
  return t;
}

void copy_rows(Backend& be, const Tensor& src, const Tensor& dst, int64_t from, int64_t n) {
  if (src.empty() || dst.empty() || n <= from || src.data == dst.data) return;
  be.copy(src.slice_rows(from, n - from), dst.slice_rows(from, n - from));
}

void copy_kv_rows(Backend& be, const KvLayer& src, const KvLayer& dst, int64_t from, int64_t n) {
  copy_rows(be, src.k, dst.k, from, n);
  if (!src.v.empty()) copy_rows(be, src.v, dst.v, from, n);  // MLA's latent cache has no v
}

}  // namespace sluice
