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

struct Family {
  std::string_view model_type;                 // config.json "model_type"
  std::vector<std::string_view> architectures;  // config.json "architectures" entries
  FamilyLoader load;
  // Multimodal checkpoints: the prefix of the vision tower's tensors, which the text model
  // never reads and a pack leaves out (empty: none).
  std::string_view vision_prefix = {};
};

const std::vector<Family>& families();

// The family of a config.json: by model_type, else by architectures. Unknown: an error that
// lists the supported families.
const Family& find_family(const nlohmann::json& config);

}  // namespace sluice
