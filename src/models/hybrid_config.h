// Config and weight declarations shared by the hybrid Qwen families (qwen3_next, qwen3_5,
// qwen3_5_moe, qwen4_exp): the text part of a possibly multimodal checkpoint, the fields every
// one of them has (attention, Gated DeltaNet, layer types, partial rotary), and the routed +
// shared experts block. Defaults are those of transformers' config classes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common_config.h"
#include "models/hybrid_decoder.h"

namespace sluice {

// Where the language model is in a checkpoint. ForCausalLM checkpoints keep the config flat
// and the weights under "model."; the multimodal ForConditionalGeneration checkpoints of
// qwen3_5(_moe) and qwen4_exp nest the text model's config in text_config and its weights
// under "model.language_model." (the vision tower under "model.visual.", lm_head at the top).
// Where a multimodal checkpoint keeps its vision tower (skipped here, left out of packs).
inline constexpr std::string_view kVisionTowerPrefix = "model.visual.";

struct HybridCheckpoint {
  nlohmann::json text;     // the text config, with the family's partial_rotary_factor default applied
  std::string prefix;      // of the language model's weights: "model." or "model.language_model."
  bool multimodal = false;
  bool tie_word_embeddings = false;
};

HybridCheckpoint hybrid_checkpoint(const nlohmann::json& config, const std::string& family);

// The fields every hybrid family reads the same way. `attention_types`: the layer_types names
// of full-attention layers ("full_attention"; qwen4_exp also "qwen_sparse_attention").
struct HybridCommon {
  ModelInfo info;
  AttentionSpec attn;
  bool attention_bias = false;
  DeltaNetSpec delta;
  RopeConfig rope;
  std::vector<TokenMixer> mixers;  // per layer, from layer_types or full_attention_interval
};

HybridCommon read_hybrid_common(const ConfigReader& c, const HybridCheckpoint& ck,
                                const std::vector<std::string>& attention_types);

// Marks as used, and says once, the tensors a text-only run never reads: the vision tower of
// a multimodal checkpoint (skip_towers) and the multi-token-prediction head (mtp.*).
void skip_unused_parts(WeightLoader& wl, const nlohmann::json& config, const HybridCheckpoint& ck);

// The embedding and output head (lm_head, or the embedding when tied).
void load_embeddings(WeightLoader& wl, const HybridCheckpoint& ck, const ModelInfo& info, HybridWeights& w);

// Routed experts, router and the sigmoid-gated shared expert of one layer; prefix ends with
// "mlp.".
void load_moe_with_shared(WeightLoader& wl, const std::string& prefix, const HybridSpec& spec, int64_t n_ff,
                          HybridLayerWeights& lw);

}  // namespace sluice
