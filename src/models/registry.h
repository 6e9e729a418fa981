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

  // Whether a tensor belongs to one of the towers.
  bool in_tower(std::string_view name) const;
  // The towers' prefixes, comma-separated (messages).
  std::string towers_text() const;
};

const std::vector<Family>& families();

// The family of a config.json: by model_type, else by architectures. Unknown: an error that
// lists the supported families.
const Family& find_family(const nlohmann::json& config);

}  // namespace sluice
