// llama4_text: Llama 4's text model (Llama 4 Scout, Maverick). Layers alternate rope layers
// (rotary on consecutive pairs, then an L2 norm of q and k, attention in chunks of
// attention_chunk_size) and NoPE layers (no_rope_layers 0: no rotary, no q/k norm, the query
// scaled by a temperature that grows with the position, full causal attention). MoE on the
// moe_layers (every interleave_moe_layer_step-th), a dense MLP of intermediate_size_mlp
// elsewhere; the router takes the top-k logits and scales each chosen expert's *input* by the
// sigmoid of its logit, the outputs summed unweighted, plus a shared expert that always runs.
// Experts are stored inputs first: gate_up_proj [E, n_embd, 2 n_ff] (gate columns, then up),
// down_proj [E, n_ff, n_embd]. The published checkpoints are multimodal (model_type llama4):
// the text config in text_config, the weights under "language_model.", the vision model and
// projector beside them (skipped; the family's towers).
#include <algorithm>

#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"
#include "models/hybrid_weights.h"
#include "models/multimodal.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct Llama4Config {
  ModelInfo info;
  AttentionSpec attn;                 // the NoPE layers' (no q/k norm, temperature tuning)
  AttentionSpec rope_attn;            // the rope layers' (L2 q/k norm, chunks)
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;      // expert and shared expert width
  int64_t intermediate_size_mlp = 0;  // dense MLP width
  std::vector<bool> moe;              // [n_layer]
  std::vector<bool> use_rope;         // [n_layer]
  std::vector<bool> chunked;          // [n_layer] layer_types "chunked_attention" (default: the rope layers)
  int64_t chunk = 0;                  // attention_chunk_size (0: null, no chunks)
  bool tie_word_embeddings = false;
  std::string prefix;                 // of every weight: "" text-only, "language_model." multimodal
};

Llama4Config parse_config(const nlohmann::json& config) {
  const TextModelConfig tm = text_model_config(config, "llama4_text");
  const nlohmann::json& j = tm.text;
  ConfigReader c(j, "llama4_text");
  Llama4Config cfg;
  if (tm.multimodal) cfg.prefix = "language_model.";
  cfg.info = read_model_info(c);
  const int64_t L = cfg.info.n_layer;
  cfg.attn = read_attention_spec(c, QkNorm::none);
  if (c.boolean({"attention_bias"}, false)) c.invalid("attention_bias is true (Llama 4's projections have none)");
  cfg.router = read_router_spec(c, false);
  cfg.router.norm_topk_prob = false;
  cfg.router.scoring = RouterScoring::sigmoid;
  cfg.intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  cfg.intermediate_size_mlp = c.integer({"intermediate_size_mlp"}, {}, 1, 1 << 24);
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, false);

  // MoE layers: moe_layers, else every interleave_moe_layer_step-th (step - 1, 2 step - 1, ...).
  cfg.moe.assign(static_cast<size_t>(L), false);
  if (c.has({"moe_layers"})) {
    for (int64_t l : c.integer_list({"moe_layers"})) {
      if (l < 0 || l >= L) c.invalid(str("moe_layers holds ", l, ", outside [0, num_hidden_layers)"));
      cfg.moe[static_cast<size_t>(l)] = true;
    }
  } else {
    const int64_t step = c.integer({"interleave_moe_layer_step"}, 1, 1, L);
    for (int64_t l = step - 1; l < L; l += step) cfg.moe[static_cast<size_t>(l)] = true;
  }
  // Rope layers: no_rope_layers (1: rope, 0: NoPE), else a NoPE layer every
  // no_rope_layer_interval-th; transformers 5.17 takes an empty list as absent.
  std::vector<int64_t> flags = c.integer_list({"no_rope_layers"});
  if (flags.empty()) {
    const int64_t interval = c.integer({"no_rope_layer_interval"}, 4, 1, 1 << 20);
    for (int64_t l = 0; l < L; ++l) flags.push_back((l + 1) % interval != 0);
  }
  if (static_cast<int64_t>(flags.size()) < L)
    c.invalid(str("no_rope_layers has ", flags.size(), " entries for ", L, " layers"));
  for (int64_t l = 0; l < L; ++l) cfg.use_rope.push_back(flags[static_cast<size_t>(l)] != 0);

  // NoPE layers: full causal attention, the query's temperature tuned by position.
  // attn_temperature_tuning: a bool, or (Llama 4 Scout's config.json) a number used as one.
  const auto tuning = j.find("attn_temperature_tuning");
  const bool tuned = tuning == j.end() || tuning->is_null() ? true
                     : tuning->is_number()                  ? tuning->get<double>() != 0
                                                            : c.boolean({"attn_temperature_tuning"});
  if (tuned) {
    cfg.attn.temperature_floor_scale = c.integer({"floor_scale"}, 8192, 1, int64_t{1} << 40);
    cfg.attn.temperature_attn_scale = static_cast<float>(c.number({"attn_scale"}, 0.1));
  }
  // Rope layers: L2 (weightless RMS) q/k norm. Chunked attention where layer_types says so
  // (by default on the rope layers), in chunks of attention_chunk_size (null: none).
  cfg.rope_attn = cfg.attn;
  cfg.rope_attn.temperature_floor_scale = 0;
  cfg.rope_attn.temperature_attn_scale = 0.0f;
  if (c.boolean({"use_qk_norm"}, true)) cfg.rope_attn.qk_norm = QkNorm::per_head;
  const auto chunk_it = j.find("attention_chunk_size");
  cfg.chunk = chunk_it == j.end() ? 8192 : chunk_it->is_null() ? 0 : c.integer({"attention_chunk_size"}, {}, 1);
  const std::vector<std::string> types = c.layer_types(L, {"chunked_attention", "full_attention"});
  for (int64_t l = 0; l < L; ++l) {
    const bool chunked = types.empty() ? cfg.use_rope[static_cast<size_t>(l)] : types[static_cast<size_t>(l)] == "chunked_attention";
    cfg.chunked.push_back(chunked);
  }
  cfg.rope = rope_config_from_json(j, "llama4_text", cfg.attn.head_dim, cfg.info.n_ctx_train, 500000.0);
  cfg.rope.interleaved = true;  // rotary on consecutive pairs (transformers' complex view)
  return cfg;
}

// ---- 2. weights ----
DecoderWeights declare_weights(const Llama4Config& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab, E = cfg.router.n_expert, hd = cfg.attn.head_dim;
  DecoderWeights w;
  const std::string m = cfg.prefix + "model.";
  w.tok_embd = wl.take_matrix(m + "embed_tokens.weight", {V, d});
  w.output_norm = wl.take(m + "norm.weight", {d});
  w.output = load_output_head(wl, cfg.prefix + "lm_head.weight", w.tok_embd, cfg.tie_word_embeddings, V, d);
  // The L2 norm is a weightless RMS norm: a weight of ones gives the same bits (x * 1 = x).
  Tensor ones = host_tensor(DType::f32, {hd});
  std::fill(ones.ptr<float>(), ones.ptr<float>() + hd, 1.0f);
  const Tensor unit_norm = wl.backend().upload(ones);
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const std::string p = m + "layers." + std::to_string(l) + ".";
    const bool rope = cfg.use_rope[static_cast<size_t>(l)];
    DecoderLayerWeights lw;
    lw.attn_norm = wl.take(p + "input_layernorm.weight", {d});
    lw.attn = load_attention(wl, p + "self_attn.", cfg.attn, false);
    if (rope && cfg.rope_attn.qk_norm == QkNorm::per_head) lw.attn.q_norm = lw.attn.k_norm = unit_norm;
    lw.ffn_norm = wl.take(p + "post_attention_layernorm.weight", {d});
    const std::string ff = p + "feed_forward.";
    if (cfg.moe[static_cast<size_t>(l)]) {
      lw.router = wl.take_matrix(ff + "router.weight", {E, d});
      lw.experts = wl.source().pack() ? load_experts(wl, ff + "experts.", E, d, cfg.intermediate_size)
                                      : load_experts_inputs_first(wl, ff + "experts.", E, d, cfg.intermediate_size,
                                                                  /*interleaved=*/false);
      lw.shared = load_mlp(wl, ff + "shared_expert.", d, cfg.intermediate_size);
    } else {
      lw.mlp = load_mlp(wl, ff, d, cfg.intermediate_size_mlp);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_llama4(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  Llama4Config cfg = parse_config(j);
  WeightLoader wl(source, backend, "llama4_text");
  if (!cfg.prefix.empty()) skip_towers(wl, j);
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  ExpertMath math{ExpertActivation::swiglu};
  math.scale_input = true;
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, math};
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const bool moe = cfg.moe[static_cast<size_t>(l)], rope = cfg.use_rope[static_cast<size_t>(l)];
    AttentionSpec attn = rope ? cfg.rope_attn : cfg.attn;
    attn.chunk = cfg.chunked[static_cast<size_t>(l)] ? cfg.chunk : 0;
    spec.layers.push_back({moe, moe ? cfg.intermediate_size : cfg.intermediate_size_mlp, attn, rope});
  }
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
