// load_model: an HF checkpoint directory (config.json, *.safetensors, tokenizer files) in,
// a ready model on a backend out. The family comes from config.json through the registry.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "format/tokenizer.h"
#include "models/model.h"

namespace sluice {

struct LoadedModel {
  std::filesystem::path dir;
  nlohmann::json config;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;  // when the directory holds a tokenizer.json

  std::optional<int32_t> eos_id() const;  // the tokenizer's, else config.json's
};

LoadedModel load_model(const std::filesystem::path& dir, Backend& backend);

}  // namespace sluice
