// qwen3_5_moe: Qwen3.5 MoE (Qwen3.5-35B-A3B, Qwen3.5-397B-A17B). The qwen3_5 hybrid layout
// with routed experts and a sigmoid-gated shared expert in every layer; the router always
// renormalizes its top-k softmax weights. Checkpoints are multimodal
// (Qwen3_5MoeForConditionalGeneration): the text model runs, the vision tower is skipped.
#include "models/common_weights.h"
#include "models/hybrid_config.h"
#include "models/hybrid_weights.h"

namespace sluice {
namespace {

// ---- 1. config ----
HybridSpec parse_config(const HybridCheckpoint& ck) {
  ConfigReader c(ck.text, "qwen3_5_moe");
  HybridCommon h = read_hybrid_common(c, ck, {"full_attention"});
  HybridSpec spec;
  spec.info = h.info;
  spec.attn.attn = h.attn;
  spec.attn.bias = h.attention_bias;
  spec.rope = h.rope;
  spec.delta = h.delta;
  spec.router = read_router_spec(c, true);
  spec.router.norm_topk_prob = true;  // Qwen3_5MoeTopKRouter renormalizes unconditionally
  const int64_t moe_intermediate_size = c.integer({"moe_intermediate_size"}, 512, 1, 1 << 24);
  spec.n_ff_shared = c.integer({"shared_expert_intermediate_size"}, 512, 1, 1 << 24);
  spec.norm_eps = h.attn.norm_eps;
  for (int64_t l = 0; l < h.info.n_layer; ++l) spec.layers.push_back({h.mixers[l], true, moe_intermediate_size, false});
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
    load_moe_with_shared(wl, p + "mlp.", spec, ls.n_ff, lw);
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared hybrid decoder ----
std::unique_ptr<Model> load_qwen3_5_moe(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  HybridCheckpoint ck = hybrid_checkpoint(j, "qwen3_5_moe");
  HybridSpec spec = parse_config(ck);
  WeightLoader wl(source, backend, "qwen3_5_moe");
  skip_unused_parts(wl, j, ck);
  HybridWeights weights = declare_weights(spec, ck, wl);
  wl.finish();
  spec.info.n_params = wl.n_params();
  return std::make_unique<HybridModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
