// load_model: an HF checkpoint directory (config.json, *.safetensors, tokenizer files) or a
// pack directory (manifest.json; see format/pack.h) in, a ready model on a backend out. The
// family comes from config.json (a pack's manifest holds it) through the registry.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "experts/streamer_options.h"
#include "experts/streaming_provider.h"
#include "format/pack.h"
#include "format/tokenizer.h"
#include "models/ngram_table_options.h"
#include "models/model.h"

namespace sluice {

struct LoadOptions {
  // The precision of a pack's routed experts; default: default_expert_kind() of the pack.
  // Asking for a kind when loading a checkpoint is an invalid_argument error.
  std::optional<DType> expert_kind;
  // Stream the routed experts of a pack through a bounded expert cache instead of mapping
  // them all (experts/streamer.h). Unset or not enabled(): every expert is resident. Asking
  // for it with a checkpoint is an invalid_argument error.
  std::optional<StreamerOptions> streaming = std::nullopt;
  // How a pack's PLE n-gram tables are read (row cache size, IO mode, verification).
  NgramTableOptions ngram_tables = {};
};

struct LoadedModel {
  std::filesystem::path dir;
  std::optional<DType> expert_kind;  // set when loaded from a pack with routed experts
  nlohmann::json config;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;  // when the directory holds a tokenizer.json
  // Set when the experts are streamed (the model holds it too): an ExpertStreamer on the CPU
  // backend, the CUDA streamer on a CUDA backend.
  std::shared_ptr<StreamingProvider> streamer;
  // The pack (null for a checkpoint), for a second streamer over the same records (--kl-check).
  std::shared_ptr<const Pack> pack;

  std::optional<int32_t> bos_id() const;  // the tokenizer's, else config.json's
  std::optional<int32_t> eos_id() const;  // the tokenizer's, else config.json's
};

LoadedModel load_model(const std::filesystem::path& dir, Backend& backend, const LoadOptions& options = {});

// For `sluice verify`: loads a pack's model on the CPU without reading its weights (the CPU
// backend keeps views of the mappings), so the family's loader checks the manifest's config
// against every dense tensor and the expert records (a hidden_size that disagrees with the
// tensors, an expert width that disagrees with the records) and the tokenizer against the
// vocabulary. Errors are the loader's and name the pack's manifest.json.
void check_pack_model(const std::filesystem::path& dir);

}  // namespace sluice
