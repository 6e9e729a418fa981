// Shared config parsing and weight declarations of the hybrid families.
#include "models/hybrid_config.h"

#include <cmath>

#include "models/common_weights.h"
#include "models/multimodal.h"

namespace sluice {

HybridCheckpoint hybrid_checkpoint(const nlohmann::json& config, const std::string& family) {
  TextModelConfig tm = text_model_config(config, family);
  HybridCheckpoint ck;
  ck.text = std::move(tm.text);
  ck.multimodal = tm.multimodal;
  ck.prefix = ck.multimodal ? "model.language_model." : "model.";
  if (auto it = ck.text.find("tie_word_embeddings"); it != ck.text.end() && !it->is_null()) {
    SLUICE_CHECK(it->is_boolean(), Status::corrupt, family, ": tie_word_embeddings is not true or false");
    ck.tie_word_embeddings = it->get<bool>();
  }
  // These families rotate a quarter of each head unless the config says otherwise.
  auto rp = ck.text.find("rope_parameters");
  const bool in_params = rp != ck.text.end() && rp->is_object() && rp->contains("partial_rotary_factor");
  if (!in_params && !ck.text.contains("partial_rotary_factor")) ck.text["partial_rotary_factor"] = 0.25;
  return ck;
}

HybridCommon read_hybrid_common(const ConfigReader& c, const HybridCheckpoint& ck,
                                const std::vector<std::string>& attention_types) {
  HybridCommon h;
  h.info = read_model_info(c);

  h.attn = read_attention_spec(c, QkNorm::per_head);
  h.attn.head_dim = c.integer({"head_dim"}, 256, 1, 4096);
  h.attn.scale = 1.0f / std::sqrt(static_cast<float>(h.attn.head_dim));
  h.attention_bias = c.boolean({"attention_bias"}, false);

  DeltaNetSpec& d = h.delta;
  d.n_embd = h.info.n_embd;
  d.n_k_head = c.integer({"linear_num_key_heads"}, 16, 1, 4096);
  d.n_v_head = c.integer({"linear_num_value_heads"}, 32, 1, 4096);
  d.k_head_dim = c.integer({"linear_key_head_dim"}, 128, 1, 4096);
  d.v_head_dim = c.integer({"linear_value_head_dim"}, 128, 1, 4096);
  d.conv_kernel = c.integer({"linear_conv_kernel_dim"}, 4, 1, 64);
  d.norm_eps = h.attn.norm_eps;
  if (d.n_v_head % d.n_k_head != 0)
    c.invalid(str("linear_num_value_heads (", d.n_v_head, ") is not a multiple of linear_num_key_heads (",
                  d.n_k_head, ")"));

  const int64_t L = h.info.n_layer;
  if (c.has({"layer_types"})) {
    const nlohmann::json& lt = c.json()["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != L)
      c.invalid(str("layer_types must list one type for each of the ", L, " layers"));
    for (const auto& t : lt) {
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      if (name == "linear_attention") {
        h.mixers.push_back(TokenMixer::delta_net);
        continue;
      }
      bool attention = false;
      for (const auto& a : attention_types) attention = attention || name == a;
      if (!attention) {
        std::string ok = "linear_attention";
        for (const auto& a : attention_types) ok += ", " + a;
        c.invalid("layer_types holds '" + name + "' (supported: " + ok + ")");
      }
      h.mixers.push_back(TokenMixer::attention);
    }
  } else {
    const int64_t interval = c.integer({"full_attention_interval"}, 4, 1, 4096);
    for (int64_t l = 0; l < L; ++l)
      h.mixers.push_back((l + 1) % interval ? TokenMixer::delta_net : TokenMixer::attention);
  }
  h.rope = rope_config_from_json(ck.text, c.family(), h.attn.head_dim, h.info.n_ctx_train);
  return h;
}

void skip_unused_parts(WeightLoader& wl, const nlohmann::json& config, const HybridCheckpoint& ck) {
  if (ck.multimodal) skip_towers(wl, config);
  wl.skip_matching("mtp.");  // multi-token prediction: not used for decoding here
}

void load_embeddings(WeightLoader& wl, const HybridCheckpoint& ck, const ModelInfo& info, HybridWeights& w) {
  const int64_t d = info.n_embd, V = info.n_vocab;
  w.tok_embd = wl.take_matrix(ck.prefix + "embed_tokens.weight", {V, d});
  w.output = load_output_head(wl, "lm_head.weight", w.tok_embd, ck.tie_word_embeddings, V, d);
}

void load_moe_with_shared(WeightLoader& wl, const std::string& p, const HybridSpec& spec, int64_t n_ff,
                          HybridLayerWeights& lw) {
  const int64_t d = spec.info.n_embd;
  lw.router = wl.take_matrix(p + "gate.weight", {spec.router.n_expert, d});
  lw.experts = load_experts(wl, p + "experts.", spec.router.n_expert, d, n_ff);
  if (spec.n_ff_shared > 0) {
    lw.shared = load_mlp(wl, p + "shared_expert.", d, spec.n_ff_shared);
    lw.shared_gate = wl.take_matrix(p + "shared_expert_gate.weight", {1, d});
  }
}

}  // namespace sluice
