// qwen3_next: Qwen3-Next (Qwen3-Next-80B-A3B). Gated DeltaNet layers with sparse gated
// full-attention layers between them (layer_types / full_attention_interval), zero-centered
// RMSNorms, routed experts with a sigmoid-gated shared expert (mlp_only_layers and
// decoder_sparse_step select dense layers), the DeltaNet input projections fused per key head
// (in_proj_qkvz, in_proj_ba). A ForCausalLM checkpoint: flat config, weights under "model.".
#include <algorithm>

#include "models/common_weights.h"
#include "models/hybrid_config.h"
#include "models/hybrid_weights.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct Qwen3NextConfig {
  HybridCommon common;
  RouterSpec router;
  int64_t intermediate_size = 0;             // dense MLP width
  int64_t moe_intermediate_size = 0;         // expert width
  int64_t shared_expert_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
};

Qwen3NextConfig parse_config(const HybridCheckpoint& ck) {
  ConfigReader c(ck.text, "qwen3_next");
  Qwen3NextConfig cfg;
  cfg.common = read_hybrid_common(c, ck, {"full_attention"});
  cfg.router = read_router_spec(c, true);
  cfg.intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  cfg.moe_intermediate_size = c.integer({"moe_intermediate_size"}, {}, 1, 1 << 24);
  cfg.shared_expert_intermediate_size = c.integer({"shared_expert_intermediate_size"}, {}, 1, 1 << 24);
  cfg.decoder_sparse_step = c.integer({"decoder_sparse_step"}, 1, 1, 4096);
  cfg.mlp_only_layers = c.integer_list({"mlp_only_layers"});
  for (int64_t l : cfg.mlp_only_layers)
    if (l < 0 || l >= cfg.common.info.n_layer)
      c.invalid(str("mlp_only_layers holds ", l, ", outside [0, num_hidden_layers)"));
  return cfg;
}

bool layer_is_moe(const Qwen3NextConfig& cfg, int64_t l) {
  bool dense = std::find(cfg.mlp_only_layers.begin(), cfg.mlp_only_layers.end(), l) != cfg.mlp_only_layers.end();
  return !dense && (l + 1) % cfg.decoder_sparse_step == 0;
}

HybridSpec make_spec(const Qwen3NextConfig& cfg) {
  const HybridCommon& h = cfg.common;
  HybridSpec spec;
  spec.info = h.info;
  spec.attn.attn = h.attn;
  spec.attn.bias = h.attention_bias;
  spec.rope = h.rope;
  spec.delta = h.delta;
  spec.router = cfg.router;
  spec.n_ff_shared = cfg.shared_expert_intermediate_size;
  spec.norm_eps = h.attn.norm_eps;
  for (int64_t l = 0; l < h.info.n_layer; ++l) {
    const bool moe = layer_is_moe(cfg, l);
    spec.layers.push_back({h.mixers[l], moe, moe ? cfg.moe_intermediate_size : cfg.intermediate_size, false});
  }
  return spec;
}

// ---- 2. weights ----
HybridWeights declare_weights(const HybridSpec& spec, const HybridCheckpoint& ck, WeightLoader& wl) {
  const int64_t d = spec.info.n_embd;
  HybridWeights w;
  load_embeddings(wl, ck, spec.info, w);
  w.output_norm = take_norm_plus_one(wl, ck.prefix + "norm.weight", {d});
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const HybridLayerSpec& ls = spec.layers[l];
    const std::string p = ck.prefix + "layers." + std::to_string(l) + ".";
    HybridLayerWeights lw;
    lw.attn_norm = take_norm_plus_one(wl, p + "input_layernorm.weight", {d});
    lw.ffn_norm = take_norm_plus_one(wl, p + "post_attention_layernorm.weight", {d});
    if (ls.mixer == TokenMixer::attention) lw.attn = load_gated_attention(wl, p + "self_attn.", spec.attn);
    else lw.delta = load_delta_net(wl, p + "linear_attn.", spec.delta);
    if (ls.moe) load_moe_with_shared(wl, p + "mlp.", spec, ls.n_ff, lw);
    else lw.mlp = load_mlp(wl, p + "mlp.", d, ls.n_ff);
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared hybrid decoder ----
std::unique_ptr<Model> load_qwen3_next(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  HybridCheckpoint ck = hybrid_checkpoint(j, "qwen3_next");
  HybridSpec spec = make_spec(parse_config(ck));
  WeightLoader wl(source, backend, "qwen3_next");
  skip_unused_parts(wl, j, ck);
  HybridWeights weights = declare_weights(spec, ck, wl);
  wl.finish();
  spec.info.n_params = wl.n_params();
  return std::make_unique<HybridModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
