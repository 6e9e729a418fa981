// Checkpoint: the tensors of a Hugging Face model directory, whichever way they are stored:
// `model.safetensors`, shards listed by `model.safetensors.index.json`, or a directory with
// exactly one other `*.safetensors` file. Tracks which tensors the model loader took, so it
// can assert that every tensor in the checkpoint was used.
//
// FP8 checkpoints (format/fp8.h: F8_E4M3 / F8_E5M2 weights with a `<name>_scale_inv` per
// block, config.json's quantization_config) are read here, the one place both the direct run
// and the converter go through: each FP8 weight is paired with its scales at open, the scale
// tensors are no tensors of their own (names() leaves them out), and get() hands the weight
// out dequantized, so a family never sees FP8.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "format/fp8.h"
#include "format/safetensors.h"

namespace sluice {

// An FP8 weight's scales: the scale tensor (float [scale rows, scale cols], fp8.h) and the
// blocks they scale.
struct Fp8Weight {
  std::string scale;
  Fp8Config config;
};

class Checkpoint {
 public:
  // Opens and validates every file up front. Throws Error(not_found) when the directory or a
  // shard is missing, Error(corrupt) for a malformed index (shard names with '/' or "..", a
  // mapped tensor absent from its shard, a tensor in two shards that the index does not
  // assign) and the safetensors parse errors for the files themselves. With FP8 tensors it
  // reads config.json's quantization_config and checks every weight's scale tensor (present,
  // float, the shape its blocks give): Error(unsupported) for FP8 without an fp8
  // quantization_config or an FP8 tensor that is not a matrix, Error(corrupt) for a missing
  // or misshapen scale tensor.
  static Checkpoint open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool has(const std::string& name) const;
  // A host view of the tensor (see SafetensorsFile::tensor); marks it consumed. A missing
  // name is Error(not_found) naming the tensor and the directory. An FP8 weight comes
  // dequantized to dtype(name), in memory of its own.
  Tensor get(const std::string& name);
  // The dtype get() hands the tensor out in: the stored one, or fp8_dtype() for an FP8 weight.
  DType dtype(const std::string& name) const;
  // What FP8 weights are dequantized to: bf16 when every other float tensor of the checkpoint
  // is bf16 (a bf16 model quantized: a run holds what a bf16 checkpoint would), else f32.
  DType fp8_dtype() const { return fp8_dtype_; }
  // The scales of FP8 weight `name`; null for every other tensor.
  const Fp8Weight* fp8(const std::string& name) const;
  // FP8 weight `name` [rows, cols] dequantized block by block to f32 (exactly fp8.h's
  // values) or to bf16 (those rounded to nearest even), in memory of its own.
  Tensor dequantized(const std::string& name, DType to) const;
  // Marks a tensor consumed without fetching it (for tensors skipped on purpose).
  void consume(const std::string& name);
  std::vector<std::string> names() const;       // sorted
  std::vector<std::string> unconsumed() const;  // sorted; empty once the loader took everything

  // Where a tensor lives, for readers that bypass the mapping (the converter): the file and
  // the entry (file offset = file.data_offset() + entry.begin; the stored dtype and shape).
  // Also the scale tensors of FP8 weights. Does not mark consumed.
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;

 private:
  struct Location {
    std::shared_ptr<SafetensorsFile> file;
    const SafetensorsEntry* entry;  // points into file->entries()
  };
  const Location& locate(const std::string& name) const;  // a tensor or an FP8 weight's scales
  void add_file(std::shared_ptr<SafetensorsFile> file);
  void pair_fp8();  // moves the scale tensors of FP8 weights from tensors_ to scales_

  std::filesystem::path dir_;
  std::map<std::string, Location> tensors_;
  std::map<std::string, Location> scales_;  // the scale tensors of FP8 weights
  std::map<std::string, Fp8Weight> fp8_;    // FP8 weight -> its scales
  DType fp8_dtype_ = DType::bf16;
  std::set<std::string> consumed_;
};

}  // namespace sluice
