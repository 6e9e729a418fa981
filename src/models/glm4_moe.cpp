// glm4_moe: GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM). Grouped-query attention with q/k/v
// biases (attention_bias), optional per-head q/k RMSNorm (use_qk_norm), rotary on the first
// partial_rotary_factor of each head (transformers' default for this family: 0.5); the first
// first_k_dense_replace layers a dense SwiGLU MLP, the others routed experts under
// DeepSeek-V3's group-limited sigmoid router (grouped_router.h) plus n_shared_experts shared
// experts as one MLP beside them. The checkpoint's multi-token-prediction layers
// (model.layers.<num_hidden_layers>.*) are skipped.
#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"
#include "models/grouped_router.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct Glm4MoeConfig {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;      // dense MLP width
  int64_t moe_intermediate_size = 0;  // expert width
  int64_t n_shared_experts = 0;       // the shared MLP is n_shared_experts experts wide
  int64_t first_k_dense_replace = 0;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
};

Glm4MoeConfig parse_config(const nlohmann::json& j) {
  ConfigReader c(j, "glm4_moe");
  Glm4MoeConfig cfg;
  cfg.info = read_model_info(c);
  cfg.info.n_ctx_train = c.integer({"max_position_embeddings"}, 131072, 1, int64_t{1} << 31);
  cfg.attn = read_attention_spec(c, c.boolean({"use_qk_norm"}, false) ? QkNorm::per_head : QkNorm::none);
  cfg.attn.norm_eps = static_cast<float>(c.number({"rms_norm_eps"}, 1e-5));
  if (!(cfg.attn.norm_eps > 0)) c.invalid("rms_norm_eps must be positive");
  cfg.router = read_grouped_router(c, {128, 8, 1, 1, true, 1.0});
  cfg.intermediate_size = c.integer({"intermediate_size"}, 10944, 1, 1 << 24);
  cfg.moe_intermediate_size = c.integer({"moe_intermediate_size"}, 1408, 1, 1 << 24);
  cfg.n_shared_experts = c.integer({"n_shared_experts"}, 1, 0, 1024);
  cfg.first_k_dense_replace = c.integer({"first_k_dense_replace"}, 1, 0, 1 << 20);
  cfg.attention_bias = c.boolean({"attention_bias"}, false);
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, false);
  // transformers' Glm4MoeConfig rotates half of each head unless partial_rotary_factor says
  // otherwise (in rope_parameters, or beside it).
  nlohmann::json rope_json = j;
  const bool partial_given = j.contains("partial_rotary_factor") ||
                             (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
                              j["rope_parameters"].contains("partial_rotary_factor")) ||
                             (j.contains("rope_scaling") && j["rope_scaling"].is_object() &&
                              j["rope_scaling"].contains("partial_rotary_factor"));
  if (!partial_given) rope_json["partial_rotary_factor"] = 0.5;
  cfg.rope = rope_config_from_json(rope_json, "glm4_moe", cfg.attn.head_dim, cfg.info.n_ctx_train);
  return cfg;
}

bool layer_is_moe(const Glm4MoeConfig& cfg, int64_t l) { return l >= cfg.first_k_dense_replace; }

// ---- 2. weights ----
DecoderWeights declare_weights(const Glm4MoeConfig& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab, E = cfg.router.n_expert;
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
    if (layer_is_moe(cfg, l)) {
      load_grouped_moe(wl, p, E, d, cfg.moe_intermediate_size, cfg.n_shared_experts, lw);
    } else {
      lw.mlp = load_mlp(wl, p + "mlp.", d, cfg.intermediate_size);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_glm4_moe(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  Glm4MoeConfig cfg = parse_config(j);
  WeightLoader wl(source, backend, "glm4_moe");
  skip_mtp_layers(wl, j);
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, ExpertMath{ExpertActivation::swiglu}};
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const bool moe = layer_is_moe(cfg, l);
    spec.layers.push_back({moe, moe ? cfg.moe_intermediate_size : cfg.intermediate_size, {}});
  }
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
