// Gated DeltaNet block: weights in both checkpoint layouts, state, forward.
#include "models/gated_delta_net.h"

#include <vector>

#include "models/hybrid_weights.h"

namespace sluice {

DeltaNetState new_delta_net_state(Backend& be, const DeltaNetSpec& s) {
  DeltaNetState st{be.alloc(DType::f32, {s.conv_kernel - 1, s.conv_dim()}),
                   be.alloc(DType::f32, {s.n_v_head, s.k_head_dim, s.v_head_dim})};
  clear_delta_net_state(be, st);
  return st;
}

void clear_delta_net_state(Backend& be, DeltaNetState& st) {
  be.fill(st.conv, 0.0f);
  be.fill(st.recurrent, 0.0f);
}

DeltaNetWeights load_delta_net(WeightLoader& wl, const std::string& p, const DeltaNetSpec& s) {
  const int64_t d = s.n_embd, nk = s.n_k_head, nv = s.n_v_head, dk = s.k_head_dim, dv = s.v_head_dim;
  DeltaNetWeights w;
  if (wl.has(p + "in_proj_qkvz.weight")) {
    // qwen3_next: per key head g, rows [q (dk), k (dk), v (r dv), z (r dv)] of in_proj_qkvz and
    // [b (r), a (r)] of in_proj_ba, r = nv / nk value heads per key head (fix_query_key_value_ordering).
    const int64_t r = nv / nk, group = 2 * dk + 2 * r * dv;
    Tensor qkvz = wl.take_host(p + "in_proj_qkvz.weight", {nk * group, d});
    Tensor ba = wl.take_host(p + "in_proj_ba.weight", {nk * 2 * r, d});
    std::vector<int64_t> qkv_rows, z_rows, b_rows, a_rows;
    for (int part = 0; part < 3; ++part)  // all q rows, then all k rows, then all v rows
      for (int64_t g = 0; g < nk; ++g) {
        const int64_t begin = g * group + (part == 0 ? 0 : part == 1 ? dk : 2 * dk);
        const int64_t len = part == 2 ? r * dv : dk;
        for (int64_t i = 0; i < len; ++i) qkv_rows.push_back(begin + i);
      }
    for (int64_t g = 0; g < nk; ++g) {
      for (int64_t i = 0; i < r * dv; ++i) z_rows.push_back(g * group + 2 * dk + r * dv + i);
      for (int64_t i = 0; i < r; ++i) {
        b_rows.push_back(g * 2 * r + i);
        a_rows.push_back(g * 2 * r + r + i);
      }
    }
    w.qkv = upload_rows(wl.backend(), qkvz, qkv_rows);
    w.z = upload_rows(wl.backend(), qkvz, z_rows);
    w.b = upload_rows(wl.backend(), ba, b_rows);
    w.a = upload_rows(wl.backend(), ba, a_rows);
  } else {
    w.qkv = wl.take_matrix(p + "in_proj_qkv.weight", {s.conv_dim(), d});
    w.z = wl.take_matrix(p + "in_proj_z.weight", {s.value_dim(), d});
    w.b = wl.take_matrix(p + "in_proj_b.weight", {nv, d});
    w.a = wl.take_matrix(p + "in_proj_a.weight", {nv, d});
  }
  w.conv = take_f32(wl, p + "conv1d.weight", {s.conv_dim(), 1, s.conv_kernel}).reshape({s.conv_dim(), s.conv_kernel});
  w.A_log = take_f32(wl, p + "A_log", {nv});
  w.dt_bias = take_f32(wl, p + "dt_bias", {nv});
  w.norm = wl.take(p + "norm.weight", {dv});
  w.out = wl.take_matrix(p + "out_proj.weight", {d, s.value_dim()});
  return w;
}

void delta_net_block(Backend& be, const DeltaNetSpec& s, const DeltaNetWeights& w, const Tensor& h,
                     DeltaNetState& st, const Tensor& out) {
  const int64_t n = h.rows(), kd = s.key_dim(), vd = s.value_dim(), nv = s.n_v_head;
  Tensor mixed = be.alloc(DType::f32, {n, s.conv_dim()});  // [n, q | k | v] before the conv
  Tensor conv = be.alloc(DType::f32, {n, s.conv_dim()});
  Tensor z = be.alloc(DType::f32, {n, vd});
  Tensor b = be.alloc(DType::f32, {n, nv});
  Tensor a = be.alloc(DType::f32, {n, nv});
  be.matmul(h, w.qkv, mixed);
  be.matmul(h, w.z, z);
  be.matmul(h, w.b, b);
  be.matmul(h, w.a, a);
  be.causal_conv1d(mixed, w.conv, st.conv, conv, 1, true);
  Tensor q = be.alloc(DType::f32, {n, s.n_k_head, s.k_head_dim});
  Tensor k = be.alloc(DType::f32, {n, s.n_k_head, s.k_head_dim});
  Tensor v = be.alloc(DType::f32, {n, nv, s.v_head_dim});
  be.copy_cols(conv, 0, q.reshape({n, kd}), 0, kd);
  be.copy_cols(conv, kd, k.reshape({n, kd}), 0, kd);
  be.copy_cols(conv, 2 * kd, v.reshape({n, vd}), 0, vd);
  Tensor g = be.alloc(DType::f32, {n, nv});
  Tensor beta = be.alloc(DType::f32, {n, nv});
  be.delta_net_gates(a, b, w.A_log, w.dt_bias, g, beta);
  // transformers runs the chunked form for any multi-token pass and the recurrent one for a
  // single cached token; the two agree to rounding (see cpu/delta_net.cpp).
  Tensor o = be.alloc(DType::f32, {n, nv, s.v_head_dim});
  DeltaRuleParams params;
  params.chunk_size = n > 1 ? s.chunk_size : 0;
  be.gated_delta_rule(q, k, v, g, beta, st.recurrent, o, params);
  // Gated RMSNorm per value head: (rms_norm(o) * w) * act(z).
  Tensor o2 = o.reshape({n * nv, s.v_head_dim});
  be.rms_norm(o2, w.norm, s.norm_eps, o2);
  be.activate(z, s.out_gate);
  be.mul(o2, z.reshape({n * nv, s.v_head_dim}));
  be.matmul(o.reshape({n, vd}), w.out, out);
}

}  // namespace sluice
