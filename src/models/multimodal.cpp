// Reading the text model out of multimodal checkpoints.
#include "models/multimodal.h"

#include "core/error.h"
#include "core/log.h"
#include "models/registry.h"

namespace sluice {

TextModelConfig text_model_config(const nlohmann::json& config, const std::string& family) {
  SLUICE_CHECK(config.is_object(), Status::corrupt, family, ": config is not a JSON object");
  TextModelConfig out;
  auto tc = config.find("text_config");
  out.multimodal = tc != config.end() && !tc->is_null();
  if (!out.multimodal) {
    out.text = config;
    return out;
  }
  SLUICE_CHECK(tc->is_object(), Status::corrupt, family, ": text_config is not a JSON object");
  out.text = *tc;
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if ((!out.text.contains(key) || out.text[key].is_null()) && config.contains(key)) out.text[key] = config[key];
  if (auto it = config.find("tie_word_embeddings"); it != config.end() && !it->is_null())
    out.text["tie_word_embeddings"] = *it;
  return out;
}

int64_t skip_towers(WeightLoader& wl, const nlohmann::json& config) {
  const Family& family = find_family(config);
  int64_t n = 0;
  for (const std::string& name : wl.source().names())
    if (family.in_tower(name)) {
      wl.source().consume(name);
      ++n;
    }
  if (wl.source().pack())  // convert left the towers out
    LOG_INFO(wl.family(), ": multimodal model: loading the text model (the pack holds nothing under ",
             family.towers_text(), ")");
  else
    LOG_INFO(wl.family(), ": multimodal checkpoint: loading the text model, skipping what it never reads (", n,
             " tensors under ", family.towers_text(), ")");
  return n;
}

}  // namespace sluice
