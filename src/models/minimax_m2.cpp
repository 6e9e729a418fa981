// minimax_m2: MiniMax-M2 (MiniMaxM2ForCausalLM). Grouped-query attention whose q and k RMSNorms
// span the whole projection (all heads at once, before the heads are split), rotary on the
// first part of each head (partial_rotary_factor; the published config.json says rotary_dim
// instead); every layer routed experts, no shared expert: sigmoid scores, the choice on score
// plus the layer's e_score_correction_bias, weights the chosen scores renormalized
// (RouterScoring::sigmoid_grouped with one group, no scaling, no epsilon). Checkpoints name the
// block block_sparse_moe with experts w1 (gate), w3 (up), w2 (down); transformers 5's own
// layout names it mlp with fused experts.
#include <cmath>

#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"
#include "models/grouped_router.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct MiniMaxM2Config {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;  // expert width
  bool tie_word_embeddings = false;
};

// The rotated fraction of a head: partial_rotary_factor where the config gives it (in
// rope_parameters or beside it, as transformers reads it), else rotary_dim / head_dim (the
// published config.json); both given and disagreeing is an error.
nlohmann::json with_partial_rotary(const ConfigReader& c, int64_t head_dim) {
  const nlohmann::json& j = c.json();
  nlohmann::json out = j;
  std::optional<double> partial;
  for (const char* block : {"rope_parameters", "rope_scaling"})
    if (auto it = j.find(block); it != j.end() && it->is_object() && it->contains("partial_rotary_factor") &&
                                 (*it)["partial_rotary_factor"].is_number() && !partial)
      partial = (*it)["partial_rotary_factor"].get<double>();
  if (!partial && j.contains("partial_rotary_factor") && j["partial_rotary_factor"].is_number())
    partial = j["partial_rotary_factor"].get<double>();
  if (c.has({"rotary_dim"})) {
    const int64_t rotary_dim = c.integer({"rotary_dim"}, {}, 2, head_dim);
    if (partial && static_cast<int64_t>(static_cast<double>(head_dim) * *partial) != rotary_dim)
      c.invalid(str("rotary_dim (", rotary_dim, ") disagrees with partial_rotary_factor (", *partial, ") x head_dim (",
                    head_dim, ")"));
    if (!partial) out["partial_rotary_factor"] = static_cast<double>(rotary_dim) / static_cast<double>(head_dim);
  }
  return out;
}

MiniMaxM2Config parse_config(const nlohmann::json& j) {
  ConfigReader c(j, "minimax_m2");
  MiniMaxM2Config cfg;
  cfg.info = read_model_info(c);
  cfg.info.n_ctx_train = c.integer({"max_position_embeddings"}, 196608, 1, int64_t{1} << 31);
  cfg.attn = read_attention_spec(c, QkNorm::whole);
  cfg.attn.head_dim = c.integer({"head_dim"}, 128, 1, 4096);
  cfg.attn.scale = 1.0f / std::sqrt(static_cast<float>(cfg.attn.head_dim));
  if (c.boolean({"attention_bias"}, false)) c.invalid("attention_bias is true (MiniMax-M2's projections have none)");
  if (c.has({"scoring_func"}) && c.string({"scoring_func"}) != "sigmoid")
    c.invalid(str("scoring_func '", c.string({"scoring_func"}), "' is not supported (sigmoid, as transformers routes)"));
  // The router has no groups and no scaling and always renormalizes, without an epsilon
  // (transformers' MiniMaxM2TopKRouter reads no other field).
  cfg.router = read_router_spec(c, true);
  cfg.router.scoring = RouterScoring::sigmoid_grouped;
  cfg.router.norm_topk_prob = true;
  cfg.router.grouped = GroupedRouting{};
  cfg.intermediate_size = c.integer({"intermediate_size"}, 1536, 1, 1 << 24);
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, false);
  cfg.rope = rope_config_from_json(with_partial_rotary(c, cfg.attn.head_dim), "minimax_m2", cfg.attn.head_dim,
                                   cfg.info.n_ctx_train, 5000000.0);
  return cfg;
}

// ---- 2. weights ----
DecoderWeights declare_weights(const MiniMaxM2Config& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab, E = cfg.router.n_expert;
  DecoderWeights w;
  w.tok_embd = wl.take_matrix("model.embed_tokens.weight", {V, d});
  w.output_norm = wl.take("model.norm.weight", {d});
  w.output = load_output_head(wl, "lm_head.weight", w.tok_embd, cfg.tie_word_embeddings, V, d);
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayerWeights lw;
    lw.attn_norm = wl.take(p + "input_layernorm.weight", {d});
    lw.attn = load_attention(wl, p + "self_attn.", cfg.attn, false);
    lw.ffn_norm = wl.take(p + "post_attention_layernorm.weight", {d});
    // The published checkpoints: block_sparse_moe.{gate, e_score_correction_bias, experts.<e>.w1/w3/w2};
    // transformers 5's layout: mlp.{gate, e_score_correction_bias, experts.gate_up_proj / down_proj}.
    const std::string moe = wl.has(p + "block_sparse_moe.gate.weight") ? p + "block_sparse_moe." : p + "mlp.";
    lw.router = wl.take_matrix(moe + "gate.weight", {E, d});
    lw.router_score_bias = load_score_bias(wl, moe + "e_score_correction_bias", E);
    lw.experts = load_experts(wl, moe + "experts.", E, d, cfg.intermediate_size, ExpertNames{"w1", "w3", "w2"});
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_minimax_m2(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  MiniMaxM2Config cfg = parse_config(j);
  WeightLoader wl(source, backend, "minimax_m2");
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, ExpertMath{ExpertActivation::swiglu}};
  spec.layers.assign(static_cast<size_t>(cfg.info.n_layer), DecoderLayerSpec{true, cfg.intermediate_size, {}});
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
