// Shared blocks: attention, top-k routing, SwiGLU MLPs.
#include "models/blocks.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sluice {

void attention_block(Backend& be, const AttentionSpec& spec, const RopeConfig& rope, const AttentionWeights& w,
                     const Tensor& h, KvLayer& kv, int64_t n_past, const Tensor& cos, const Tensor& sin,
                     const Tensor& out, const Tensor& positions) {
  const int64_t n = h.rows(), hd = spec.head_dim, nh = spec.n_head, nkv = spec.n_head_kv;
  Tensor q = be.alloc(DType::f32, {n, nh * hd});
  Tensor k = be.alloc(DType::f32, {n, nkv * hd});
  Tensor v = be.alloc(DType::f32, {n, nkv * hd});
  be.matmul(h, w.q, q);
  be.matmul(h, w.k, k);
  be.matmul(h, w.v, v);
  if (!w.q_bias.empty()) be.add_bias(q, w.q_bias);
  if (!w.k_bias.empty()) be.add_bias(k, w.k_bias);
  if (!w.v_bias.empty()) be.add_bias(v, w.v_bias);
  if (spec.qk_norm == QkNorm::per_head) {
    be.rms_norm(q.reshape({n * nh, hd}), w.q_norm, spec.norm_eps, q.reshape({n * nh, hd}));
    be.rms_norm(k.reshape({n * nkv, hd}), w.k_norm, spec.norm_eps, k.reshape({n * nkv, hd}));
  } else if (spec.qk_norm == QkNorm::whole) {
    be.rms_norm(q, w.q_norm, spec.norm_eps, q);
    be.rms_norm(k, w.k_norm, spec.norm_eps, k);
  }
  if (spec.clip_qkv) {
    be.clamp(q, -*spec.clip_qkv, *spec.clip_qkv);
    be.clamp(k, -*spec.clip_qkv, *spec.clip_qkv);
    be.clamp(v, -*spec.clip_qkv, *spec.clip_qkv);
  }
  Tensor q3 = q.reshape({n, nh, hd}), k3 = k.reshape({n, nkv, hd});
  be.rope(q3, cos, sin, rope.rot_dim, rope.interleaved);
  be.rope(k3, cos, sin, rope.rot_dim, rope.interleaved);
  SLUICE_CHECK(n_past + n <= kv.k.shape[0], Status::invalid_argument, "context full: ", n_past + n,
               " tokens exceed the context size ", kv.k.shape[0]);
  if (positions.empty()) {
    be.copy(k3, kv.k.slice_rows(n_past, n));
    be.copy(v.reshape({n, nkv, hd}), kv.v.slice_rows(n_past, n));
  } else {
    const int64_t n_ctx = kv.k.shape[0];
    be.scatter_rows_at(k, positions, kv.k.reshape({n_ctx, nkv * hd}));
    be.scatter_rows_at(v, positions, kv.v.reshape({n_ctx, nkv * hd}));
  }
  Tensor att = be.alloc(DType::f32, {n, nh, hd});
  AttentionParams params;
  params.n_past = n_past;
  params.n_past_at = positions;
  params.scale = spec.scale;
  params.sliding_window = spec.sliding_window;
  be.attention(q3, kv.k, kv.v, att, params);
  be.matmul(att.reshape({n, nh * hd}), w.o, out);
  if (!w.o_bias.empty()) be.add_bias(out, w.o_bias);
}

RopeTables rope_tables_for(Backend& be, const RopeConfig& rope, int64_t n_past, int64_t n) {
  std::vector<int64_t> pos(n);
  std::iota(pos.begin(), pos.end(), n_past);
  std::vector<float> cos_h, sin_h;
  rope_tables(rope, pos, cos_h, sin_h);
  const int64_t half = rope.rot_dim / 2;
  RopeTables t{be.alloc(DType::f32, {n, half}), be.alloc(DType::f32, {n, half})};
  be.from_host(t.cos, cos_h.data());
  be.from_host(t.sin, sin_h.data());
  return t;
}

Routing route_topk(const RouterSpec& spec, std::span<const float> logits, int64_t n_rows) {
  const int64_t E = spec.n_expert, k = spec.n_expert_used;
  SLUICE_ASSERT(static_cast<int64_t>(logits.size()) == n_rows * E);
  Routing r;
  r.n_rows = n_rows;
  r.k = k;
  r.ids.resize(n_rows * k);
  r.weights.resize(n_rows * k);
  std::vector<float> p(E);
  std::vector<int32_t> idx(E);
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* l = logits.data() + row * E;
    float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float top_sum = 0;
    for (int64_t j = 0; j < k; ++j) top_sum += p[idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.ids[row * k + j] = idx[j];
      r.weights[row * k + j] = spec.norm_topk_prob ? p[idx[j]] / top_sum : p[idx[j]];
    }
  }
  return r;
}

void swiglu_mlp(Backend& be, const ExpertWeights& w, const Tensor& h, const Tensor& out) {
  const int64_t n = h.rows(), ff = w.gate.shape[0];
  Tensor g = be.alloc(DType::f32, {n, ff});
  Tensor u = be.alloc(DType::f32, {n, ff});
  be.matmul(h, w.gate, g);
  be.matmul(h, w.up, u);
  be.swiglu(g, u, g);
  be.matmul(g, w.down, out);
}

void group_pairs_by_expert(const Routing& routing, std::vector<int32_t>& order,
                           std::vector<std::vector<int32_t>>& pairs_of) {
  std::unordered_map<int32_t, size_t> slot;
  order.clear();
  pairs_of.clear();
  for (size_t p = 0; p < routing.ids.size(); ++p) {
    int32_t e = routing.ids[p];
    auto [it, inserted] = slot.try_emplace(e, order.size());
    if (inserted) {
      order.push_back(e);
      pairs_of.emplace_back();
    }
    pairs_of[it->second].push_back(static_cast<int32_t>(p));
  }
}

}  // namespace sluice
