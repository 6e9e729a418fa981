// One row per family. Adding a family: its file, one row here, one fixture.
#include "models/registry.h"

#include "core/error.h"
#include "models/hybrid_config.h"

namespace sluice {

std::unique_ptr<Model> load_qwen3_moe(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_mixtral(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_olmoe(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_qwen3_next(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_qwen3_5(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_qwen3_5_moe(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_qwen4_exp(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_gpt_oss(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_llama4(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_gemma4(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_deepseek_v3(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_glm4_moe(const nlohmann::json&, WeightSource&, Backend&);
std::unique_ptr<Model> load_minimax_m2(const nlohmann::json&, WeightSource&, Backend&);

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"qwen3_moe", {"Qwen3MoeForCausalLM"}, load_qwen3_moe},
      {"mixtral", {"MixtralForCausalLM"}, load_mixtral},
      {"olmoe", {"OlmoeForCausalLM"}, load_olmoe},
      {"qwen3_next", {"Qwen3NextForCausalLM"}, load_qwen3_next},
      {"qwen3_5", {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"}, load_qwen3_5, {kVisionTowerPrefix}},
      {"qwen3_5_moe", {"Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"}, load_qwen3_5_moe,
       {kVisionTowerPrefix}},
      {"qwen4_exp", {"Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLM"}, load_qwen4_exp, {kVisionTowerPrefix}},
      {"gpt_oss", {"GptOssForCausalLM"}, load_gpt_oss, {}, FusedExperts::inputs_first_interleaved},
      {"llama4_text", {"Llama4ForCausalLM"}, load_llama4, {}, FusedExperts::inputs_first_halves},
      // Llama 4 as published (Scout, Maverick): the text model under language_model.
      {"llama4", {"Llama4ForConditionalGeneration"}, load_llama4, {"vision_model.", "multi_modal_projector."},
       FusedExperts::inputs_first_halves},
      {"gemma4_text", {"Gemma4ForCausalLM"}, load_gemma4},
      // Gemma 4 as published: the text model under model.language_model.
      {"gemma4", {"Gemma4ForConditionalGeneration"}, load_gemma4,
       {"model.vision_tower.", "model.embed_vision.", "model.vision_embedder.", "model.audio_tower.", "model.embed_audio."}},
      {"deepseek_v3", {"DeepseekV3ForCausalLM"}, load_deepseek_v3, {}, FusedExperts::gate_rows_first, {"model.layers."}},
      // Kimi K2: DeepSeek-V3's architecture under a model_type of its own.
      {"kimi_k2", {}, load_deepseek_v3, {}, FusedExperts::gate_rows_first, {"model.layers."}},
      // Kimi K2.5: the same text model in text_config, beside a vision tower.
      {"kimi_k25", {"KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"}, load_deepseek_v3,
       {"vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector."}, FusedExperts::gate_rows_first,
       {"model.layers.", "language_model.model.layers.", "model.language_model.layers."}},
      {"glm4_moe", {"Glm4MoeForCausalLM"}, load_glm4_moe, {}, FusedExperts::gate_rows_first, {"model.layers."}},
      {"minimax_m2", {"MiniMaxM2ForCausalLM"}, load_minimax_m2},
  };
  return table;
}

bool Family::in_tower(std::string_view name) const {
  for (std::string_view tower : towers)
    if (name.substr(0, tower.size()) == tower) return true;
  return false;
}

std::vector<std::string> Family::mtp_prefixes(const nlohmann::json& config) const {
  if (mtp_layer_prefixes.empty() || !config.is_object()) return {};
  const nlohmann::json& text = config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
  auto count = [&](const char* key, int64_t fallback) {
    auto it = text.find(key);
    return it != text.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
  };
  const int64_t layers = count("num_hidden_layers", -1);
  const int64_t mtp = count("num_nextn_predict_layers", count("num_mtp_layers", 1));
  std::vector<std::string> out;
  for (int64_t i = 0; layers >= 0 && i < mtp; ++i)
    for (std::string_view p : mtp_layer_prefixes) out.push_back(str(p, layers + i, "."));
  return out;
}

std::string Family::towers_text() const {
  std::string out;
  for (std::string_view tower : towers) out += (out.empty() ? "" : ", ") + std::string(tower);
  return out;
}

const Family& find_family(const nlohmann::json& config) {
  SLUICE_CHECK(config.is_object(), Status::corrupt, "config.json is not a JSON object");
  std::string model_type;
  if (auto it = config.find("model_type"); it != config.end() && it->is_string()) model_type = *it;
  for (const auto& f : families())
    if (f.model_type == model_type) return f;
  if (auto it = config.find("architectures"); it != config.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (!a.is_string()) continue;
      for (const auto& f : families())
        for (auto arch : f.architectures)
          if (arch == a.get<std::string>()) return f;
    }
  }
  std::string supported;
  for (const auto& f : families()) supported += (supported.empty() ? "" : ", ") + std::string(f.model_type);
  fail(Status::unsupported, "unknown model family '", model_type.empty() ? "(no model_type)" : model_type,
       "'; supported: ", supported);
}

}  // namespace sluice
