// qwen3_moe: Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B). Attention with per-head q/k RMSNorm;
// softmax top-k router with optional renormalization; layers listed in mlp_only_layers, or
// not on the decoder_sparse_step grid, use a dense MLP instead of experts.
#include <algorithm>

#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct Qwen3MoeConfig {
  ModelInfo info;
  AttentionSpec attn;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;      // dense MLP width
  int64_t moe_intermediate_size = 0;  // expert width
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
};

Qwen3MoeConfig parse_config(const nlohmann::json& j) {
  ConfigReader c(j, "qwen3_moe");
  Qwen3MoeConfig cfg;
  cfg.info = read_model_info(c);
  cfg.attn = read_attention_spec(c, QkNorm::per_head);
  cfg.router = read_router_spec(c, false);
  cfg.intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  cfg.moe_intermediate_size = c.integer({"moe_intermediate_size"}, {}, 1, 1 << 24);
  cfg.decoder_sparse_step = c.integer({"decoder_sparse_step"}, 1, 1, 4096);
  cfg.mlp_only_layers = c.integer_list({"mlp_only_layers"});
  for (int64_t l : cfg.mlp_only_layers)
    if (l < 0 || l >= cfg.info.n_layer) c.invalid(str("mlp_only_layers holds ", l, ", outside [0, num_hidden_layers)"));
  cfg.attention_bias = c.boolean({"attention_bias"}, false);
  cfg.tie_word_embeddings = c.boolean({"tie_word_embeddings"}, false);
  if (c.boolean({"use_sliding_window"}, false)) cfg.attn.sliding_window = c.integer({"sliding_window"}, 0, 0);
  cfg.rope = rope_config_from_json(j, "qwen3_moe", cfg.attn.head_dim, cfg.info.n_ctx_train);
  return cfg;
}

bool layer_is_moe(const Qwen3MoeConfig& cfg, int64_t l) {
  bool dense = std::find(cfg.mlp_only_layers.begin(), cfg.mlp_only_layers.end(), l) != cfg.mlp_only_layers.end();
  return !dense && cfg.router.n_expert > 0 && (l + 1) % cfg.decoder_sparse_step == 0;
}

// ---- 2. weights ----
DecoderWeights declare_weights(const Qwen3MoeConfig& cfg, WeightLoader& wl) {
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
    if (layer_is_moe(cfg, l)) {
      lw.router = wl.take_matrix(p + "mlp.gate.weight", {cfg.router.n_expert, d});
      lw.experts = load_experts(wl, p + "mlp.experts.", cfg.router.n_expert, d, cfg.moe_intermediate_size);
    } else {
      lw.mlp = load_mlp(wl, p + "mlp.", d, cfg.intermediate_size);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared decoder ----
std::unique_ptr<Model> load_qwen3_moe(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  Qwen3MoeConfig cfg = parse_config(j);
  WeightLoader wl(source, backend, "qwen3_moe");
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  DecoderSpec spec{cfg.info, cfg.attn, cfg.rope, cfg.router, cfg.attn.norm_eps, {}, ExpertMath{ExpertActivation::swiglu}};
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    bool moe = layer_is_moe(cfg, l);
    spec.layers.push_back({moe, moe ? cfg.moe_intermediate_size : cfg.intermediate_size, {}});
  }
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
