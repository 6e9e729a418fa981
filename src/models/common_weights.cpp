// Shared weight declarations for attention, experts and dense MLPs.
#include "models/common_weights.h"

#include "models/hybrid_weights.h"

namespace sluice {

AttentionWeights load_attention(WeightLoader& wl, const std::string& p, const AttentionSpec& s, bool bias,
                                const std::string& q_norm, const std::string& k_norm) {
  AttentionWeights w;
  const int64_t q_dim = s.n_head * s.head_dim, kv_dim = s.n_head_kv * s.head_dim;
  w.q = wl.take_matrix(p + "q_proj.weight", {q_dim, s.n_embd});
  w.k = wl.take_matrix(p + "k_proj.weight", {kv_dim, s.n_embd});
  w.v = wl.take_matrix(p + "v_proj.weight", {kv_dim, s.n_embd});
  w.o = wl.take_matrix(p + "o_proj.weight", {s.n_embd, q_dim});
  if (bias) {
    w.q_bias = wl.take(p + "q_proj.bias", {q_dim});
    w.k_bias = wl.take(p + "k_proj.bias", {kv_dim});
    w.v_bias = wl.take(p + "v_proj.bias", {kv_dim});
    if (auto ob = wl.take_optional(p + "o_proj.bias", {s.n_embd})) w.o_bias = *ob;
  }
  if (s.qk_norm == QkNorm::per_head) {
    w.q_norm = wl.take(p + q_norm + ".weight", {s.head_dim});
    w.k_norm = wl.take(p + k_norm + ".weight", {s.head_dim});
  } else if (s.qk_norm == QkNorm::whole) {
    w.q_norm = wl.take(p + q_norm + ".weight", {q_dim});
    w.k_norm = wl.take(p + k_norm + ".weight", {kv_dim});
  }
  return w;
}

std::vector<ExpertWeights> load_experts(WeightLoader& wl, const std::string& p, int64_t n_expert, int64_t n_embd,
                                        int64_t n_ff, const ExpertNames& names) {
  std::vector<ExpertWeights> experts(n_expert);
  if (const Pack* pack = wl.source().pack()) {
    // A pack: views of the chosen kind over the mapped records (fully resident run).
    const PackManifest& m = pack->manifest();
    const int64_t layer = pack->moe_layer_of_prefix(p);
    SLUICE_CHECK(layer >= 0, Status::corrupt, wl.family(), ": pack ", pack->dir().string(), " has no experts under ", p);
    SLUICE_CHECK(m.n_expert == n_expert && m.n_embd == n_embd && m.n_ff == n_ff, Status::corrupt, wl.family(), ": pack ",
                 pack->dir().string(), " holds ", m.n_expert, " experts of [", m.n_ff, ", ", m.n_embd, "], config.json says ",
                 n_expert, " of [", n_ff, ", ", n_embd, "]");
    const DType kind = wl.source().expert_kind();
    const PackKindInfo& info = pack->kind(kind);
    wl.source().consume(p);
    wl.count_params(n_expert * 3 * n_ff * n_embd);
    if (wl.source().streams_experts()) return {};  // the streamer reads the records on demand
    for (int64_t e = 0; e < n_expert; ++e) {
      std::span<const uint8_t> rec = pack->mapped_record(kind, pack->record_id(layer, e));
      // The views keep the mapping alive; the CPU backend uses them as they are, a device
      // backend would copy.
      ExpertWeights w = expert_view(info, rec.data(), pack->mapping_owner(kind));
      Backend& be = wl.backend();
      auto up = [&](const Tensor& t) { return t.empty() ? Tensor{} : be.upload(t); };
      experts[e] = {be.upload(w.gate), be.upload(w.up),    be.upload(w.down),
                    up(w.gate_bias),   up(w.up_bias),      up(w.down_bias)};
    }
    return experts;
  }
  if (wl.has(p + "gate_up_proj")) {
    // Fused layout: gate rows [0, n_ff) then up rows [n_ff, 2 n_ff) of each expert.
    Tensor gate_up = wl.take(p + "gate_up_proj", {n_expert, 2 * n_ff, n_embd}).reshape({n_expert * 2 * n_ff, n_embd});
    Tensor down = wl.take(p + "down_proj", {n_expert, n_embd, n_ff}).reshape({n_expert * n_embd, n_ff});
    for (int64_t e = 0; e < n_expert; ++e) {
      experts[e].gate = gate_up.slice_rows(e * 2 * n_ff, n_ff);
      experts[e].up = gate_up.slice_rows(e * 2 * n_ff + n_ff, n_ff);
      experts[e].down = down.slice_rows(e * n_embd, n_embd);
    }
    return experts;
  }
  for (int64_t e = 0; e < n_expert; ++e) {
    const std::string ep = p + std::to_string(e) + ".";
    experts[e].gate = wl.take(ep + names.gate + ".weight", {n_ff, n_embd});
    experts[e].up = wl.take(ep + names.up + ".weight", {n_ff, n_embd});
    experts[e].down = wl.take(ep + names.down + ".weight", {n_embd, n_ff});
  }
  return experts;
}

std::vector<ExpertWeights> load_experts_inputs_first(WeightLoader& wl, const std::string& p, int64_t E, int64_t d,
                                                     int64_t ff, bool interleaved) {
  Backend& be = wl.backend();
  const Tensor gu = wl.take_host(p + "gate_up_proj", {E, d, 2 * ff});
  const Tensor dn = wl.take_host(p + "down_proj", {E, ff, d});
  // Columns col0, col0 + step, ... (rows of them) of expert e's [in, out_cols] matrix, as a
  // new [rows, in] tensor: a transpose, element by element in the stored type.
  auto columns = [&](const Tensor& src, int64_t e, int64_t in, int64_t out_cols, int64_t col0, int64_t step,
                     int64_t rows) {
    Tensor t = host_tensor(src.dtype, {rows, in});
    auto transpose = [&](auto* dst, const auto* base) {
      base += e * in * out_cols + col0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < in; ++i) dst[r * in + i] = base[i * out_cols + step * r];
    };
    if (dtype_size(src.dtype) == 4) transpose(t.ptr<uint32_t>(), src.ptr<uint32_t>());
    else transpose(t.ptr<uint16_t>(), src.ptr<uint16_t>());
    return be.upload(t);
  };
  std::vector<ExpertWeights> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights& w = experts[static_cast<size_t>(e)];
    if (!wl.source().values_needed()) {
      w.gate = w.up = Tensor(gu.dtype, {ff, d}, gu.data, gu.storage);
      w.down = Tensor(dn.dtype, {d, ff}, dn.data, dn.storage);
      continue;
    }
    w.gate = columns(gu, e, d, 2 * ff, 0, interleaved ? 2 : 1, ff);
    w.up = columns(gu, e, d, 2 * ff, interleaved ? 1 : ff, interleaved ? 2 : 1, ff);
    w.down = columns(dn, e, ff, d, 0, 1, d);
  }
  return experts;
}

ExpertWeights load_mlp(WeightLoader& wl, const std::string& p, int64_t n_embd, int64_t n_ff, const ExpertNames& names) {
  ExpertWeights w;
  w.gate = wl.take_matrix(p + names.gate + ".weight", {n_ff, n_embd});
  w.up = wl.take_matrix(p + names.up + ".weight", {n_ff, n_embd});
  w.down = wl.take_matrix(p + names.down + ".weight", {n_embd, n_ff});
  return w;
}

Tensor load_output_head(WeightLoader& wl, const std::string& name, const Tensor& tok_embd, bool tied, int64_t n_vocab,
                        int64_t n_embd) {
  if (!tied) return wl.take_matrix(name, {n_vocab, n_embd});
  wl.skip_matching(name);
  return tok_embd;
}

}  // namespace sluice
