// Multi-head latent attention (mla.h): the weights, the latent cache's rows, and the two
// forms of the attention.
#include "models/mla.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "models/hybrid_weights.h"

namespace sluice {
namespace {

// Rows [row0, row0 + rows) of a stored [*, cols] matrix, in its dtype, as a new host tensor
// (a row slice copied, or rows of the transposed matrix).
Tensor host_rows(const Tensor& src, int64_t row0, int64_t rows) {
  const size_t esz = dtype_size(src.dtype), row_bytes = static_cast<size_t>(src.cols()) * esz;
  Tensor t = host_tensor(src.dtype, {rows, src.cols()});
  std::copy_n(static_cast<const uint8_t*>(src.data) + static_cast<size_t>(row0) * row_bytes,
              static_cast<size_t>(rows) * row_bytes, static_cast<uint8_t*>(t.data));
  return t;
}

// kv_b_proj [H (dn + dv), R] split by head: w_uk [H dn, R], w_uv [H dv, R] and w_uk_t [H R, dn]
// (each head's W_UK transposed), element copies in the stored dtype.
void split_kv_b(WeightLoader& wl, const MlaSpec& s, const Tensor& kv_b, MlaWeights& w) {
  const int64_t H = s.n_head, dn = s.qk_nope_head_dim, dv = s.v_head_dim, R = s.kv_lora_rank;
  Backend& be = wl.backend();
  if (!wl.source().values_needed()) {  // a dry run: views of the right shapes
    w.w_uk = Tensor(kv_b.dtype, {H * dn, R}, kv_b.data, kv_b.storage);
    w.w_uv = Tensor(kv_b.dtype, {H * dv, R}, kv_b.data, kv_b.storage);
    w.w_uk_t = Tensor(kv_b.dtype, {H * R, dn}, kv_b.data, kv_b.storage);
    return;
  }
  const size_t esz = dtype_size(kv_b.dtype);
  Tensor uk = host_tensor(kv_b.dtype, {H * dn, R}), uv = host_tensor(kv_b.dtype, {H * dv, R});
  Tensor uk_t = host_tensor(kv_b.dtype, {H * R, dn});
  const auto* src = static_cast<const uint8_t*>(kv_b.data);
  for (int64_t h = 0; h < H; ++h) {
    const Tensor k_rows = host_rows(kv_b, h * (dn + dv), dn), v_rows = host_rows(kv_b, h * (dn + dv) + dn, dv);
    std::copy_n(static_cast<const uint8_t*>(k_rows.data), k_rows.nbytes(), static_cast<uint8_t*>(uk.data) + h * dn * R * esz);
    std::copy_n(static_cast<const uint8_t*>(v_rows.data), v_rows.nbytes(), static_cast<uint8_t*>(uv.data) + h * dv * R * esz);
    // W_UK_h^T [R, dn]: element (r, j) = kv_b[h (dn + dv) + j, r].
    auto* dst = static_cast<uint8_t*>(uk_t.data) + h * R * dn * esz;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < dn; ++j)
        std::copy_n(src + ((h * (dn + dv) + j) * R + r) * esz, esz, dst + (r * dn + j) * esz);
  }
  w.w_uk = be.upload(uk);
  w.w_uv = be.upload(uv);
  w.w_uk_t = be.upload(uk_t);
}

// What every form starts from, for n rows: the query's parts q_nope [n H, dn] and q_rope
// [n H, dr] (rotated), and the latent rows [n, R + dr] (c normed, then k_r rotated), f32.
struct MlaInputs {
  Tensor q_nope, q_rope, latent;
};

MlaInputs project(Backend& be, const MlaSpec& s, const RopeConfig& rope, const MlaWeights& w, const Tensor& h,
                  const Tensor& cos, const Tensor& sin) {
  const int64_t n = h.rows(), H = s.n_head, dn = s.qk_nope_head_dim, dr = s.qk_rope_head_dim, R = s.kv_lora_rank;
  Tensor q = be.alloc(DType::f32, {n, H * s.qk_head_dim()});
  if (s.q_lora_rank == 0) {
    be.matmul(h, w.q, q);
  } else {
    Tensor qa = be.alloc(DType::f32, {n, s.q_lora_rank});
    be.matmul(h, w.q_a, qa);
    if (!w.q_a_bias.empty()) be.add_bias(qa, w.q_a_bias);
    be.rms_norm(qa, w.q_a_norm, s.norm_eps, qa);
    be.matmul(qa, w.q_b, q);
  }
  Tensor kv = be.alloc(DType::f32, {n, s.latent_dim()});
  be.matmul(h, w.kv_a, kv);
  if (!w.kv_a_bias.empty()) be.add_bias(kv, w.kv_a_bias);
  MlaInputs in{be.alloc(DType::f32, {n * H, dn}), be.alloc(DType::f32, {n * H, dr}), be.alloc(DType::f32, {n, s.latent_dim()})};
  const Tensor q2 = q.reshape({n * H, s.qk_head_dim()});
  be.copy_cols(q2, 0, in.q_nope, 0, dn);
  be.copy_cols(q2, dn, in.q_rope, 0, dr);
  be.rope(in.q_rope.reshape({n, H, dr}), cos, sin, dr, rope.interleaved);
  Tensor c = be.alloc(DType::f32, {n, R}), kr = be.alloc(DType::f32, {n, dr});
  be.copy_cols(kv, 0, c, 0, R);
  be.rms_norm(c, w.kv_a_norm, s.norm_eps, c);
  be.copy_cols(kv, R, kr, 0, dr);
  be.rope(kr.reshape({n, 1, dr}), cos, sin, dr, rope.interleaved);
  be.copy_cols(c, 0, in.latent, 0, R);
  be.copy_cols(kr, 0, in.latent, R, dr);
  return in;
}

// The latent rows [n, R + dr] into cache [n_ctx, 1, R + dr] at rows positions[i] (i32 [n] on
// the backend) or, positions empty, n_past + i; a bf16 cache rounds each value once.
void append_latent(Backend& be, const Tensor& latent, const Tensor& cache, int64_t n_past, const Tensor& positions) {
  const int64_t n = latent.rows(), n_ctx = cache.shape[0], dk = latent.cols();
  SLUICE_CHECK(n_past + n <= n_ctx, Status::invalid_argument, "context full: ", n_past + n,
               " tokens exceed the context size ", n_ctx);
  be.write_rows(latent, cache.reshape({n_ctx, dk}), n_past, positions);
}

// The absorbed query [n, H, R + dr]: q_lat_h = W_UK_h^T q_nope_h, then q_rope_h.
Tensor absorbed_query(Backend& be, const MlaSpec& s, const MlaWeights& w, const MlaInputs& in, int64_t n) {
  const int64_t H = s.n_head, R = s.kv_lora_rank, dr = s.qk_rope_head_dim;
  Tensor q_lat = be.alloc(DType::f32, {n, H, R});
  be.matmul_heads(in.q_nope.reshape({n, H, s.qk_nope_head_dim}), w.w_uk_t, q_lat);
  Tensor q = be.alloc(DType::f32, {n * H, s.latent_dim()});
  be.copy_cols(q_lat.reshape({n * H, R}), 0, q, 0, R);
  be.copy_cols(in.q_rope, 0, q, R, dr);
  return q.reshape({n, H, s.latent_dim()});
}

// Heads the expanded form runs at once: about kExpandedBytes of f32 keys and values, so that a
// long context's expansion stays bounded.
constexpr int64_t kExpandedBytes = int64_t{256} << 20;

// The expanded form for the n rows at positions n_past.. (already appended to the cache):
// every head's keys [c W_UK_h^T, k_r] and values c W_UV_h^T for the m = n_past + n cached rows,
// zero-padded to the backend's head size, then attention() in groups of heads. o [n, H dv].
void attend_expanded(Backend& be, const MlaSpec& s, const MlaWeights& w, const MlaInputs& in, const Tensor& cache,
                     int64_t n_past, const Tensor& o) {
  const int64_t n = o.rows(), H = s.n_head, dn = s.qk_nope_head_dim, dr = s.qk_rope_head_dim, dv = s.v_head_dim;
  const int64_t R = s.kv_lora_rank, dk = s.latent_dim(), m = n_past + n;
  std::vector<int32_t> ids(static_cast<size_t>(m));
  std::iota(ids.begin(), ids.end(), 0);
  Tensor rows = be.alloc(DType::f32, {m, dk});  // the cached latents as f32
  be.get_rows(cache.reshape({cache.shape[0], dk}), ids, rows);
  Tensor c = be.alloc(DType::f32, {m, R}), kr = be.alloc(DType::f32, {m, dr});
  be.copy_cols(rows, 0, c, 0, R);
  be.copy_cols(rows, R, kr, 0, dr);
  Tensor k_nope = be.alloc(DType::f32, {m, H * dn}), v = be.alloc(DType::f32, {m, H * dv});
  be.matmul(c, w.w_uk, k_nope);
  be.matmul(c, w.w_uv, v);
  const int64_t D = be.attention_padded_dim(std::max(dn + dr, dv));
  const int64_t group = std::clamp<int64_t>(kExpandedBytes / std::max<int64_t>(1, 2 * m * D * 4), 1, H);
  const Tensor q_nope = in.q_nope.reshape({n, H * dn}), q_rope = in.q_rope.reshape({n, H * dr});
  for (int64_t h0 = 0; h0 < H; h0 += group) {
    const int64_t g = std::min(group, H - h0);
    Tensor q = be.alloc(DType::f32, {n, g, D}), k = be.alloc(DType::f32, {m, g, D}), vv = be.alloc(DType::f32, {m, g, D});
    Tensor att = be.alloc(DType::f32, {n, g, D});
    const Tensor q2 = q.reshape({n, g * D}), k2 = k.reshape({m, g * D}), v2 = vv.reshape({m, g * D});
    if (D > dn + dr) {
      be.fill(q, 0.0f);
      be.fill(k, 0.0f);
    }
    if (D > dv) be.fill(vv, 0.0f);
    for (int64_t j = 0; j < g; ++j) {
      const int64_t hh = h0 + j;
      be.copy_cols(q_nope, hh * dn, q2, j * D, dn);
      be.copy_cols(q_rope, hh * dr, q2, j * D + dn, dr);
      be.copy_cols(k_nope, hh * dn, k2, j * D, dn);
      be.copy_cols(kr, 0, k2, j * D + dn, dr);
      be.copy_cols(v, hh * dv, v2, j * D, dv);
    }
    AttentionParams params;
    params.n_past = n_past;
    params.scale = s.scale;
    be.attention(q, k, vv, att, params);
    const Tensor att2 = att.reshape({n, g * D});
    for (int64_t j = 0; j < g; ++j) be.copy_cols(att2, j * D, o, (h0 + j) * dv, dv);
  }
}

}  // namespace

MlaWeights load_mla(WeightLoader& wl, const std::string& p, const MlaSpec& s) {
  const int64_t d = s.n_embd, H = s.n_head, qk = s.qk_head_dim();
  MlaWeights w;
  if (s.q_lora_rank == 0) {
    w.q = wl.take_matrix(p + "q_proj.weight", {H * qk, d});
  } else {
    w.q_a = wl.take_matrix(p + "q_a_proj.weight", {s.q_lora_rank, d});
    if (s.attention_bias) w.q_a_bias = wl.take(p + "q_a_proj.bias", {s.q_lora_rank});
    w.q_a_norm = wl.take(p + "q_a_layernorm.weight", {s.q_lora_rank});
    w.q_b = wl.take_matrix(p + "q_b_proj.weight", {H * qk, s.q_lora_rank});
  }
  w.kv_a = wl.take_matrix(p + "kv_a_proj_with_mqa.weight", {s.latent_dim(), d});
  if (s.attention_bias) w.kv_a_bias = wl.take(p + "kv_a_proj_with_mqa.bias", {s.latent_dim()});
  w.kv_a_norm = wl.take(p + "kv_a_layernorm.weight", {s.kv_lora_rank});
  split_kv_b(wl, s, wl.take_host(p + "kv_b_proj.weight", {H * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank}), w);
  w.o = wl.take_matrix(p + "o_proj.weight", {d, H * s.v_head_dim});
  if (s.attention_bias) w.o_bias = wl.take(p + "o_proj.bias", {d});
  return w;
}

void mla_attention_block(Backend& be, const MlaSpec& s, const RopeConfig& rope, const MlaWeights& w, const Tensor& h,
                         const Tensor& cache, int64_t n_past, const Tensor& cos, const Tensor& sin, const Tensor& out,
                         const Tensor& positions, const ResidualNorm* then, MlaForm form) {
  const int64_t n = h.rows(), H = s.n_head, dv = s.v_head_dim;
  const MlaInputs in = project(be, s, rope, w, h, cos, sin);
  append_latent(be, in.latent, cache, n_past, positions);
  const bool expanded = form == MlaForm::expanded ||
                        (form == MlaForm::automatic && n > 1 && positions.empty() && be.latent_attention_expands_prompts());
  SLUICE_CHECK(!(expanded && !positions.empty()), Status::internal, "mla: the expanded form reads positions on the host");
  Tensor o = be.alloc(DType::f32, {n, H * dv});
  if (expanded) {
    attend_expanded(be, s, w, in, cache, n_past, o);
  } else {
    const Tensor q = absorbed_query(be, s, w, in, n);
    Tensor o_lat = be.alloc(DType::f32, {n, H, s.kv_lora_rank});
    AttentionParams params;
    params.n_past = n_past;
    params.n_past_at = positions;
    params.scale = s.scale;
    be.attention_latent(q, cache, o_lat, params);
    be.matmul_heads(o_lat, w.w_uv, o.reshape({n, H, dv}));
  }
  attention_output(be, w.o, w.o_bias, o, out, then);
}

void mla_attention_block_segments(Backend& be, const MlaSpec& s, const RopeConfig& rope, const MlaWeights& w,
                                  const Tensor& h, std::span<const AttentionSegment> segments, const Tensor& cos,
                                  const Tensor& sin, const Tensor& out, const Tensor& positions,
                                  const ResidualNorm* then) {
  const int64_t n = h.rows(), H = s.n_head, dv = s.v_head_dim;
  const MlaInputs in = project(be, s, rope, w, h, cos, sin);
  bool one_row_each = static_cast<int64_t>(segments.size()) == n;
  for (size_t i = 0; i < segments.size(); ++i) {
    const AttentionSegment& seg = segments[i];
    SLUICE_CHECK(seg.kv && seg.row0 >= 0 && seg.n > 0 && seg.row0 + seg.n <= n, Status::internal, "mla segment [",
                 seg.row0, ", ", seg.row0 + seg.n, ") of ", n, " rows");
    append_latent(be, in.latent.slice_rows(seg.row0, seg.n), seg.kv->k, seg.n_past,
                  positions.empty() ? Tensor{} : positions.slice_rows(seg.row0, seg.n));
    one_row_each = one_row_each && seg.n == 1 && seg.row0 == static_cast<int64_t>(i);
  }
  const Tensor q = absorbed_query(be, s, w, in, n);
  Tensor o_lat = be.alloc(DType::f32, {n, H, s.kv_lora_rank});
  if (one_row_each) {  // a decode step: one op for the batch
    std::vector<Tensor> caches;
    std::vector<int64_t> n_past;
    for (const AttentionSegment& seg : segments) {
      caches.push_back(seg.kv->k);
      n_past.push_back(seg.n_past);
    }
    be.attention_latent_rows(q, o_lat, Backend::RowCaches{caches, caches, n_past, positions}, s.scale);
  } else {
    for (const AttentionSegment& seg : segments) {
      AttentionParams params;
      params.n_past = seg.n_past;
      params.n_past_at = positions.empty() ? Tensor{} : positions.slice_rows(seg.row0, seg.n);
      params.scale = s.scale;
      be.attention_latent(q.slice_rows(seg.row0, seg.n), seg.kv->k, o_lat.slice_rows(seg.row0, seg.n), params);
    }
  }
  Tensor o = be.alloc(DType::f32, {n, H * dv});
  be.matmul_heads(o_lat, w.w_uv, o.reshape({n, H, dv}));
  attention_output(be, w.o, w.o_bias, o, out, then);
}

}  // namespace sluice
