// sluice synth: a pack with a real model's dimensions and random weights, written straight
// to disk with no HF checkpoint, for measuring speed at scale (DESIGN.md, "Test models").
//
// The tensor list comes from the family's own loader run over made-up weights
// (models/meta_source.h): names, shapes and order are exactly what loading the pack will
// ask for. The pack is laid out by the same code as convert's (format/pack.h for layouts,
// manifest and headers; convert/pack_writer.h for staging, dense.bin and the record writer),
// so it verifies, loads and runs like a converted one.
//
// Values: dense weights ~N(0, 0.02) in bf16 (the checkpoints' initializer_range; quantized
// dense matrices as the expert records below), RMSNorm
// weights ~1 (~0 where the family stores them as an offset from 1), Gated DeltaNet A_log,
// dt_bias and conv taps as transformers initializes them. Expert records hold uniformly
// random packed values with scales chosen so that the dequantized weights have a standard
// deviation of about 0.02 (bf16 records: bf16 ~N(0, 0.02)). A forward pass is finite and its
// activations neither vanish nor blow up; routing is not a trained model's (replay a real trace for
// anything that depends on routing locality). Every value is a pure function of the seed and
// its position, so the bytes do not depend on thread count or batch size.
//
// Generation runs on the global thread pool a batch at a time while a writer thread writes
// the previous batch (O_DIRECT for the expert files where the file system takes it); memory
// stays at two batches (batch_bytes each) whatever the model's size.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/pack.h"
#include "models/weight_source.h"

namespace sluice {

// A model `--like` can name: its config.json (the published one for real models; tiny ones
// for tests).
struct SynthPreset {
  std::string_view name;         // "qwen3-30b-a3b"
  std::string_view description;  // one line for --help and error messages
  nlohmann::json (*config)();
};

const std::vector<SynthPreset>& synth_presets();
// The config of a preset; an unknown name is Error(invalid_argument) listing the known ones.
nlohmann::json synth_preset_config(std::string_view name);

// Shrinks a config for quick runs: the first n_layer layers (layer_types, mlp_only_layers
// and the like cut to fit) and n_expert routed experts (num_experts_per_tok capped to
// them). Works on a flat config and on a multimodal one's text_config.
void synth_scale_config(nlohmann::json& config, std::optional<int64_t> n_layer, std::optional<int64_t> n_expert);

struct SynthProgress {
  std::string_view stage;  // "dense", "experts"
  int64_t records_done = 0, records_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // pack bytes written
  double seconds = 0;
};

struct SynthOptions {
  std::vector<DType> kinds = {DType::q4};
  // The dense tensors: bf16 or f32, or q8 / q4 (`--dense int8|q4`: the matrices the family
  // reads through matmul or get_rows, rows of whole 32-value groups, as random packed rows
  // like the expert records'; every other dense tensor bf16).
  DType dense = DType::bf16;
  bool force = false;                           // replace an existing pack
  uint64_t seed = 1;
  uint64_t batch_bytes = uint64_t{64} << 20;    // record bytes per batch (all kinds together), and
                                                // bytes per dense.bin chunk
  std::function<void(const SynthProgress&)> progress;  // called on the calling thread
  const std::atomic<bool>* cancel = nullptr;            // set (e.g. by SIGINT) to stop early
};

// What a synthetic pack of a config holds, before anything is written: the manifest with
// every offset and record layout (checksums zero), and the file sizes.
struct SynthPlan {
  PackManifest manifest;
  std::vector<WeightHint> dense_hints;  // per manifest.dense entry
  uint64_t dense_bytes = 0;              // dense.bin
  uint64_t expert_bytes = 0;             // all experts.<kind>.bin together
  uint64_t total_bytes() const { return dense_bytes + expert_bytes; }
};

// Throws the family's config errors (corrupt / unsupported, naming the field), and
// unsupported for a family whose checkpoints hold no routed experts.
SynthPlan synth_plan(const nlohmann::json& config, std::vector<DType> kinds, DType dense = DType::bf16);

struct SynthSummary {
  std::filesystem::path out_dir;
  std::string family;
  int64_t n_records = 0;         // per kind
  uint64_t bytes_out = 0;        // pack data bytes written (dense.bin and expert files)
  double seconds = 0;
  bool direct = false;           // the expert files were written with O_DIRECT
  std::vector<DType> kinds;
};

// Writes the pack into a staging directory beside OUT, fsyncs, checks that it loads at every
// kind and renames it into place. OUT must not exist, be an empty directory, or (with
// force) hold a pack; invalid_argument otherwise. A failure or cancel leaves nothing at OUT.
SynthSummary synth_pack(const nlohmann::json& config, const std::filesystem::path& out_dir, const SynthOptions& options);

}  // namespace sluice
