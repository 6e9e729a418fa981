// mixtral: Mixtral 8x7B / 8x22B. Plain grouped-query attention (no q/k norm, no biases),
// optional sliding window; the router always renormalizes its top-k softmax weights; experts
// are named w1 (gate), w3 (up), w2 (down) under block_sparse_moe.
#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct MixtralConfig {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;  // expert width
  bool tie_word_embeddings = false;
};

MixtralConfig parse_config(const nlohmann::json& j) {
  ConfigReader c(j, "mixtral");
  MixtralConfig cfg;
  cfg.info = read_model_info(c);
  cfg.attn = read_attention_spec(c, QkNorm::none);
  cfg.attn.sliding_window = c.integer({"sliding_window"}, 0, 0);
  cfg.router = read_router_spec(c, true);
  cfg.router.norm_topk_prob = true;  // Mixtral's router renormalizes unconditionally
  cfg.intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, false);
  cfg.rope = rope_config_from_json(j, "mixtral", cfg.attn.head_dim, cfg.info.n_ctx_train, 1e6);
  return cfg;
}

// ---- 2. weights ----
DecoderWeights declare_weights(const MixtralConfig& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab;
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
    // Checkpoints name the block block_sparse_moe; transformers 5's own layout names it mlp.
    const std::string moe = wl.has(p + "block_sparse_moe.gate.weight") ? p + "block_sparse_moe." : p + "mlp.";
    lw.router = wl.take_matrix(moe + "gate.weight", {cfg.router.n_expert, d});
    lw.experts = load_experts(wl, moe + "experts.", cfg.router.n_expert, d, cfg.intermediate_size,
                              ExpertNames{"w1", "w3", "w2"});
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_mixtral(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  MixtralConfig cfg = parse_config(j);
  WeightLoader wl(source, backend, "mixtral");
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, ExpertMath{ExpertActivation::swiglu}};
  spec.layers.assign(cfg.info.n_layer, DecoderLayerSpec{true, cfg.intermediate_size, {}});
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
