// The family registry: the one place that maps a checkpoint's model_type / architectures to
// the code that loads it. Everything else reads traits from the loaded model.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "models/weight_source.h"
#include "models/model.h"

namespace sluice {

using FamilyLoader = std::unique_ptr<Model> (*)(const nlohmann::json& config, WeightSource& source,
                                                Backend& backend);

// How a family's checkpoints store routed experts as one tensor over all experts
// (`<prefix>gate_up_proj` and `<prefix>down_proj`), which the shapes alone cannot tell when
// n_embd == 2 n_ff: convert and synth read it from the family.
enum class FusedExperts : uint8_t {
  gate_rows_first,             // gate_up [E, 2 n_ff, n_embd]: gate rows, then up rows; down [E, n_embd, n_ff]
  inputs_first_halves,         // gate_up [E, n_embd, 2 n_ff]: gate columns, then up columns; down
                               // [E, n_ff, n_embd] (Llama 4)
  inputs_first_interleaved,    // the same with gate and up columns interleaved (gate f at 2f), and
                               // biases (gpt-oss; also as MXFP4 *_blocks / *_scales)
};

struct Family {
  std::string_view model_type;                 // config.json "model_type"
  std::vector<std::string_view> architectures;  // config.json "architectures" entries
  FamilyLoader load;
  // Multimodal checkpoints: the prefixes of the parts the text model never reads (vision and
  // audio towers, their projectors), which the loader skips and a pack leaves out.
  std::vector<std::string_view> towers = {};
  FusedExperts fused_experts = FusedExperts::gate_rows_first;
  // Multi-token-prediction layers (DeepSeek-V3, Kimi K2, GLM-4.5): checkpoints store them after
  // the decoder's last layer, as <prefix><num_hidden_layers + i>.* for i <
  // num_nextn_predict_layers, under one of these prefixes; decoding never reads them, so the
  // loader skips them (saying so with -v) and a pack leaves them out.
  std::vector<std::string_view> mtp_layer_prefixes = {};

  // Whether a tensor belongs to one of the towers.
  bool in_tower(std::string_view name) const;
  // The towers' prefixes, comma-separated (messages).
  std::string towers_text() const;
  // The tensor-name prefixes of `config`'s multi-token-prediction layers ("model.layers.61."),
  // from num_hidden_layers and num_nextn_predict_layers (transformers' default: 1) of the
  // config or its text_config; empty for a family without them.
  std::vector<std::string> mtp_prefixes(const nlohmann::json& config) const;
};

const std::vector<Family>& families();

// The family of a config.json: by model_type, else by architectures. Unknown: an error that
// lists the supported families.
const Family& find_family(const nlohmann::json& config);

}  // namespace sluice
