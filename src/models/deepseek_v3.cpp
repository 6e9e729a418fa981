// deepseek_v3: DeepSeek-V3 / R1 / V3.1 (DeepseekV3ForCausalLM), and the same architecture as
// Kimi K2 names it (model_type kimi_k2) and Kimi K2.5 nests it (kimi_k25: the text model in
// text_config, its weights beside a vision tower). Multi-head latent attention (mla.h: a
// q-LoRA or a plain q projection, the compressed KV latent with its norm, the decoupled rotary
// key in the checkpoint's layout, rope_interleave; YaRN's mscale in the softmax scale); the
// first first_k_dense_replace layers a dense SwiGLU MLP, the others routed experts under the
// group-limited sigmoid router (grouped_router.h) plus n_shared_experts shared experts as one
// MLP. The multi-token-prediction layer (model.layers.<num_hidden_layers>.*) is skipped.
#include <cmath>

#include "models/common_config.h"
#include "models/common_weights.h"
#include "models/decoder.h"
#include "models/grouped_router.h"
#include "models/multimodal.h"
#include "models/registry.h"

namespace sluice {
namespace {

// ---- 1. config ----
struct DeepseekV3Config {
  ModelInfo info;
  MlaSpec mla;
  RopeConfig rope;
  RouterSpec router;
  int64_t intermediate_size = 0;      // dense MLP width
  int64_t moe_intermediate_size = 0;  // expert width
  int64_t n_shared_experts = 0;       // the shared MLP is n_shared_experts experts wide
  int64_t first_k_dense_replace = 0;
  float norm_eps = 1e-6f;             // rms_norm_eps: the layers' and the final norm's
  bool tie_word_embeddings = false;
  bool multimodal = false;            // kimi_k25: text_config, weights beside a vision tower
};

// transformers' yarn_get_mscale: 0.1 m ln(scale) + 1 for scale > 1, else 1.
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The softmax scale: qk_head_dim^-1/2, times mscale^2 with mscale = yarn_get_mscale(factor,
// mscale_all_dim) when the rope is scaled (rope_type not default) and mscale_all_dim is set
// (transformers' yarn_apply_mscale, in double, applied to f32 scores as one f32 factor).
float softmax_scale(const ConfigReader& c, const RopeConfig& rope, int64_t qk_head_dim) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  if (rope.type == "default") return static_cast<float>(scale);
  const nlohmann::json& j = c.json();
  const nlohmann::json* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (auto it = j.find(key); !params && it != j.end() && it->is_object()) params = &*it;
  auto number = [&](const char* key) -> double {
    auto it = params->find(key);
    if (it == params->end() || it->is_null()) return 0.0;
    if (!it->is_number()) c.invalid(str("rope parameter ", key, " is not a number"));
    return it->get<double>();
  };
  const double mscale_all_dim = number("mscale_all_dim");
  if (mscale_all_dim != 0) {
    if (!params->contains("factor")) c.invalid(str("rope type '", rope.type, "' with mscale_all_dim needs factor"));
    const double m = yarn_mscale(number("factor"), mscale_all_dim);
    scale = scale * m * m;
  }
  return static_cast<float>(scale);
}

DeepseekV3Config parse_config(const nlohmann::json& config) {
  const std::string family(find_family(config).model_type);
  const TextModelConfig tm = text_model_config(config, family);
  const nlohmann::json& j = tm.text;
  ConfigReader c(j, family);
  DeepseekV3Config cfg;
  cfg.multimodal = tm.multimodal;
  cfg.info = read_model_info(c);
  cfg.info.family = family;
  cfg.info.n_ctx_train = c.integer({"max_position_embeddings"}, 4096, 1, int64_t{1} << 31);
  MlaSpec& m = cfg.mla;
  m.n_embd = cfg.info.n_embd;
  m.n_head = c.integer({"num_attention_heads"}, 128, 1, 4096);
  const int64_t n_kv = c.integer({"num_key_value_heads"}, m.n_head, 1, 4096);
  if (n_kv != m.n_head)
    c.invalid(str("num_key_value_heads (", n_kv, ") differs from num_attention_heads (", m.n_head,
                  "): latent attention forms keys and values for every head"));
  // q_lora_rank: null is a plain q projection; absent, transformers' default (1536).
  const auto q_lora = j.find("q_lora_rank");
  m.q_lora_rank = q_lora != j.end() && q_lora->is_null() ? 0 : c.integer({"q_lora_rank"}, 1536, 1, 1 << 20);
  m.kv_lora_rank = c.integer({"kv_lora_rank"}, 512, 1, 1 << 16);
  m.qk_nope_head_dim = c.integer({"qk_nope_head_dim"}, 128, 1, 4096);
  m.qk_rope_head_dim = c.integer({"qk_rope_head_dim"}, 64, 2, 4096);
  m.v_head_dim = c.integer({"v_head_dim"}, 128, 1, 4096);
  if (m.qk_rope_head_dim % 2 != 0) c.invalid(str("qk_rope_head_dim (", m.qk_rope_head_dim, ") is odd"));
  cfg.norm_eps = static_cast<float>(c.number({"rms_norm_eps"}, 1e-6));
  if (!(cfg.norm_eps > 0)) c.invalid("rms_norm_eps must be positive");
  m.norm_eps = 1e-6f;  // transformers builds the q_a and kv_a norms with RMSNorm's default eps, not rms_norm_eps
  m.attention_bias = c.boolean({"attention_bias"}, false);
  // The rotary part is qk_rope_head_dim wide (transformers sets head_dim to it): a partial
  // rotary factor would not fit.
  cfg.rope = rope_config_from_json(j, family, m.qk_rope_head_dim, cfg.info.n_ctx_train);
  if (cfg.rope.rot_dim != m.qk_rope_head_dim)
    c.invalid(str("partial_rotary_factor leaves ", cfg.rope.rot_dim, " of qk_rope_head_dim (", m.qk_rope_head_dim,
                  ") rotary dims; the rotary key is rotated whole"));
  cfg.rope.interleaved = c.boolean({"rope_interleave"}, true);
  m.scale = softmax_scale(c, cfg.rope, m.qk_head_dim());

  if (c.has({"scoring_func"}) && c.string({"scoring_func"}) != "sigmoid")
    c.invalid(str("scoring_func '", c.string({"scoring_func"}), "' is not supported (sigmoid, as transformers routes)"));
  cfg.router = read_grouped_router(c, {256, 8, 8, 4, true, 2.5});
  cfg.intermediate_size = c.integer({"intermediate_size"}, 18432, 1, 1 << 24);
  cfg.moe_intermediate_size = c.integer({"moe_intermediate_size"}, 2048, 1, 1 << 24);
  cfg.n_shared_experts = c.integer({"n_shared_experts"}, 1, 0, 1024);
  cfg.first_k_dense_replace = c.integer({"first_k_dense_replace"}, 3, 0, 1 << 20);
  // A multimodal Kimi K2.5 ties on the outer config (its default: tied).
  cfg.tie_word_embeddings = tm.multimodal ? config.value("tie_word_embeddings", true)
                                          : c.boolean({"tie_word_embeddings"}, false);
  return cfg;
}

bool layer_is_moe(const DeepseekV3Config& cfg, int64_t l) { return l >= cfg.first_k_dense_replace; }

// ---- 2. weights ----
// Where the text model's weights are: "model." and "lm_head.weight" (DeepSeek-V3, Kimi K2),
// or under Kimi K2.5's language_model ("language_model.model." and "language_model.lm_head.",
// as published; "model.language_model." and "lm_head." in transformers 5's layout).
struct WeightPrefixes {
  std::string model = "model.", head = "lm_head.weight";
};

WeightPrefixes weight_prefixes(WeightLoader& wl) {
  if (wl.has("language_model.model.embed_tokens.weight")) return {"language_model.model.", "language_model.lm_head.weight"};
  if (wl.has("model.language_model.embed_tokens.weight")) return {"model.language_model.", "lm_head.weight"};
  return {};
}

DecoderWeights declare_weights(const DeepseekV3Config& cfg, WeightLoader& wl) {
  const int64_t d = cfg.info.n_embd, V = cfg.info.n_vocab, E = cfg.router.n_expert;
  const WeightPrefixes pre = weight_prefixes(wl);
  DecoderWeights w;
  w.tok_embd = wl.take_matrix(pre.model + "embed_tokens.weight", {V, d});
  w.output_norm = wl.take(pre.model + "norm.weight", {d});
  w.output = load_output_head(wl, pre.head, w.tok_embd, cfg.tie_word_embeddings, V, d);
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const std::string p = pre.model + "layers." + std::to_string(l) + ".";
    DecoderLayerWeights lw;
    lw.attn_norm = wl.take(p + "input_layernorm.weight", {d});
    lw.mla = load_mla(wl, p + "self_attn.", cfg.mla);
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

// ---- 3. forward: the shared decoder with latent attention ----
std::unique_ptr<Model> load_deepseek_v3(const nlohmann::json& j, WeightSource& source, Backend& backend) {
  DeepseekV3Config cfg = parse_config(j);
  WeightLoader wl(source, backend, cfg.info.family);
  if (cfg.multimodal) skip_towers(wl, j);
  skip_mtp_layers(wl, j);
  DecoderWeights weights = declare_weights(cfg, wl);
  wl.finish();
  AttentionSpec attn;  // what the decoder's own fields read; the layers run cfg.mla
  attn.n_embd = cfg.info.n_embd;
  attn.n_head = attn.n_head_kv = cfg.mla.n_head;
  attn.head_dim = cfg.mla.qk_head_dim();
  attn.norm_eps = cfg.norm_eps;
  attn.scale = cfg.mla.scale;
  DecoderSpec spec{cfg.info, attn, cfg.rope, cfg.router, cfg.norm_eps, {}, ExpertMath{ExpertActivation::swiglu}, cfg.mla};
  for (int64_t l = 0; l < cfg.info.n_layer; ++l) {
    const bool moe = layer_is_moe(cfg, l);
    spec.layers.push_back({moe, moe ? cfg.moe_intermediate_size : cfg.intermediate_size, {}});
  }
  spec.info.n_params = wl.n_params();
  return std::make_unique<DecoderModel>(backend, std::move(spec), std::move(weights));
}

}  // namespace sluice
