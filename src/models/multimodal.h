// The text model of a multimodal checkpoint. A ForConditionalGeneration checkpoint nests the
// text model's config in text_config and keeps beside its weights parts the text model never
// reads (vision and audio towers, their projectors: the family's `towers`, see registry.h),
// which the loader marks used with one message and a pack leaves out.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/weight_loader.h"

namespace sluice {

struct TextModelConfig {
  nlohmann::json text;      // text_config, with the ids and tying of the top level filled in;
                            // the config itself for a text-only checkpoint
  bool multimodal = false;  // text_config was there
};

// `family` names the family in messages. A top-level tie_word_embeddings decides (transformers
// ties on the outer config); bos/eos ids fill in those text_config lacks.
TextModelConfig text_model_config(const nlohmann::json& config, const std::string& family);

// Marks as used the tensors under the towers of `config`'s family (find_family), and says once
// how many it skipped (or that the pack left them out). Returns the count.
int64_t skip_towers(WeightLoader& wl, const nlohmann::json& config);

}  // namespace sluice
