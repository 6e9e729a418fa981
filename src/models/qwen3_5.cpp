// qwen3_5: Qwen3.5, the dense members (Qwen3.5-27B and smaller). The hybrid layout of
// qwen3_next (Gated DeltaNet + sparse gated full attention, zero-centered RMSNorms) with a
// dense SwiGLU MLP in every layer and the DeltaNet projections unfused (in_proj_qkv, in_proj_z,
// in_proj_b, in_proj_a). Checkpoints are multimodal (Qwen3_5ForConditionalGeneration: config
// in text_config, weights under "model.language_model."); the text model runs, the vision
// tower is skipped. Text-only positions make its interleaved M-RoPE a plain partial rope.
#include "models/common_weights.h"
#include "models/hybrid_config.h"
#include "models/hybrid_weights.h"

namespace sluice {
namespace {

// ---- 1. config ----
HybridSpec parse_config(const HybridCheckpoint& ck) {
  ConfigReader c(ck.text, "qwen3_5");
  HybridCommon h = read_hybrid_common(c, ck, {"full_attention"});
  const int64_t intermediate_size = c.integer({"intermediate_size"}, {}, 1, 1 << 24);
  HybridSpec spec;
  spec.info = h.info;
  spec.attn.attn = h.attn;
  spec.attn.bias = h.attention_bias;
  spec.rope = h.rope;
  spec.delta = h.delta;
  spec.norm_eps = h.attn.norm_eps;
  for (int64_t l = 0; l < h.info.n_layer; ++l) spec.layers.push_back({h.mixers[l], false, intermediate_size, false});
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
    lw.mlp = load_mlp(wl, p + "mlp.", d, ls.n_ff);
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace

// ---- 3. forward: the shared hybrid decoder ----
std::unique_ptr<Model> load_qwen3_5(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  HybridCheckpoint ck = hybrid_checkpoint(j, "qwen3_5");
  HybridSpec spec = parse_config(ck);
  WeightLoader wl(source, backend, "qwen3_5");
  skip_unused_parts(wl, j, ck);
  HybridWeights weights = declare_weights(spec, ck, wl);
  wl.finish();
  spec.info.n_params = wl.n_params();
  return std::make_unique<HybridModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
