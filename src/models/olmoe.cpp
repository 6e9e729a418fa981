// olmoe: OLMoE (allenai/OLMoE-1B-7B). Attention with q/k RMSNorm over the whole projection
// (all heads at once, not per head) and optional clipping of q, k and v to +-clip_qkv; softmax
// top-k router, not renormalized unless norm_topk_prob.
#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct OlmoeConfig {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;  // expert width
  bool attention_bias = false;
  bool tie_word_embeddings = false;
};

OlmoeConfig parse_config(const nlohmann::json& j) {
  ConfigReader c(j, "olmoe");
  OlmoeConfig cfg;
  cfg.info = read_model_info(c);
  cfg.attn = read_attention_spec(c, QkNorm::whole);
  if (c.has({"clip_qkv"})) {
    double clip = c.number({"clip_qkv"});
    if (!(clip > 0)) c.invalid("clip_qkv must be positive");
    cfg.attn.clip_qkv = static_cast<float>(clip);
  }
  cfg.router = read_router_spec(c, false);
  cfg.intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  cfg.attention_bias = c.boolean({"attention_bias"}, false);
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, false);
  cfg.rope = rope_config_from_json(j, "olmoe", cfg.attn.head_dim, cfg.info.n_ctx_train);
  return cfg;
}

// ---- 2. weights ----
DecoderWeights declare_weights(const OlmoeConfig& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab;
  DecoderWeights w;
  w.tok_embd = wl.take_matrix("model.embed_tokens.weight", {V, d});
  w.output_norm = wl.take("model.norm.weight", {d});
  w.output = load_output_head(wl, "lm_head.weight", w.tok_embd, cfg.tie_word_embeddings, V, d);
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayerWeights lw;
    lw.attn_norm = wl.take(p + "input_layernorm.weight", {d});
    lw.attn = load_attention(wl, p + "self_attn.", cfg.attn, cfg.attention_bias);
    lw.ffn_norm = wl.take(p + "post_attention_layernorm.weight", {d});
    lw.router = wl.take_matrix(p + "mlp.gate.weight", {cfg.router.n_expert, d});
    lw.experts = load_experts(wl, p + "mlp.experts.", cfg.router.n_expert, d, cfg.intermediate_size);
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_olmoe(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  OlmoeConfig cfg = parse_config(j);
  WeightLoader wl(source, backend, "olmoe");
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, ExpertMath{ExpertActivation::swiglu}};
  spec.layers.assign(cfg.info.n_layer, DecoderLayerSpec{true, cfg.intermediate_size, {}});
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
