// WeightSource: where a model's tensors come from, by checkpoint name: an HF checkpoint
// directory (safetensors) or a pack (dense.bin + expert records). Family code sees only this
// and the WeightLoader on top of it, so the same family file loads from both.
#pragma once

#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "format/checkpoint.h"
#include "format/pack.h"
#include "models/ngram_table_options.h"

namespace sluice {

class NgramTable;
struct PleFileReader;

// What a family knows about a weight beyond its name and shape, for a source that makes
// weights up (MetaSource, behind sluice synth) to pick plausible values; sources of real
// weights ignore it. zero_centered_norm: an RMSNorm weight stored as an offset from 1 (the
// loader adds 1), so a made-up one belongs near 0, not near 1.
enum class WeightHint { none, zero_centered_norm };

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Tensor get(const std::string& name) = 0;  // host view; marks the tensor used
  virtual void consume(const std::string& name) = 0;
  virtual std::vector<std::string> names() const = 0;       // sorted
  virtual std::vector<std::string> unconsumed() const = 0;  // sorted
  virtual std::string describe() const = 0;                 // for messages: the directory
  // The pack whose records hold the routed experts; null for a checkpoint.
  virtual const Pack* pack() const { return nullptr; }
  // The expert kind a pack source serves (meaningless without a pack).
  virtual DType expert_kind() const { return DType::bf16; }
  // True when the routed experts are streamed (the model gets none resident: load_experts
  // returns an empty list and the streamer serves them).
  virtual bool streams_experts() const { return false; }
  // False for a dry run of a family loader (MetaSource; convert's validation of a checkpoint),
  // whose model is never run: a family that transforms weights at load (gpt-oss's interleaved
  // experts) may then hand out views of the right shapes without reading or copying the values.
  virtual bool values_needed() const { return true; }
  // Called by WeightLoader before it takes a tensor the source lacks: a source that makes
  // tensors up (MetaSource) creates it with this shape; sources of real weights do nothing,
  // and the take fails as "checkpoint lacks tensor".
  virtual void declare(const std::string& name, std::span<const int64_t> shape, WeightHint hint) {}
  // Called by WeightLoader::take_matrix: the family reads `name` only as a matmul weight or an
  // embedding table, so a pack writer may store it quantized. convert's dry run over the
  // checkpoint and synth's run over a MetaSource read the set afterwards (matrices()).
  void note_matrix(const std::string& name) { matrices_.insert(name); }
  const std::set<std::string>& matrices() const { return matrices_; }
  // The family needs `name` unrounded (a router's correction bias, whose rounding would move
  // the routing choice): a pack writer stores it in f32 instead of the pack's dense dtype
  // (exact()).
  void note_exact(const std::string& name) { exact_.insert(name); }
  const std::set<std::string>& exact() const { return exact_; }
  // A PLE n-gram table stored row-addressable under `table` ("...ple_embedding.ngram_embedding.",
  // a pack's ple.<dtype>.bin), marked used; null when the source has none there (a
  // checkpoint: the loader takes the table's tensors).
  virtual std::shared_ptr<NgramTable> ngram_table(const std::string& table) { return nullptr; }

 private:
  std::set<std::string> matrices_;
  std::set<std::string> exact_;
};

// An HF checkpoint directory. FP8 weights come dequantized (Checkpoint::get); in a dry run
// they come as zero views of their dequantized dtype and shape instead, so that validating a
// checkpoint of hundreds of GB reads no weight.
class CheckpointSource final : public WeightSource {
 public:
  // dry_run: see values_needed.
  explicit CheckpointSource(Checkpoint checkpoint, bool dry_run = false) : ck_(std::move(checkpoint)), dry_run_(dry_run) {}
  bool values_needed() const override { return !dry_run_; }
  bool has(const std::string& name) const override { return ck_.has(name); }
  Tensor get(const std::string& name) override;
  void consume(const std::string& name) override { ck_.consume(name); }
  std::vector<std::string> names() const override { return ck_.names(); }
  std::vector<std::string> unconsumed() const override { return ck_.unconsumed(); }
  std::string describe() const override { return ck_.dir().string(); }
  Checkpoint& checkpoint() { return ck_; }

 private:
  Checkpoint ck_;
  bool dry_run_ = false;
};

// A pack: dense tensors from dense.bin by checkpoint name; the routed experts of the chosen
// kind are taken by load_experts through pack() and consumed by their prefix (consume
// ("model.layers.3.mlp.experts.")), so that unconsumed() also reports MoE layers no family
// weight asked for.
class PackSource final : public WeightSource {
 public:
  // kind is ignored for a pack without routed experts.
  PackSource(std::shared_ptr<Pack> pack, DType kind, bool streamed = false, NgramTableOptions tables = {});
  bool has(const std::string& name) const override { return pack_->has_dense(name); }
  Tensor get(const std::string& name) override;
  void consume(const std::string& name) override;
  std::vector<std::string> names() const override { return pack_->dense_names(); }
  std::vector<std::string> unconsumed() const override;
  std::string describe() const override { return pack_->dir().string(); }
  const Pack* pack() const override { return pack_.get(); }
  DType expert_kind() const override { return kind_; }
  bool streams_experts() const override { return streamed_; }
  std::shared_ptr<NgramTable> ngram_table(const std::string& table) override;

 private:
  std::shared_ptr<Pack> pack_;
  DType kind_;
  bool streamed_ = false;
  NgramTableOptions tables_;
  std::shared_ptr<PleFileReader> ple_reader_;  // one IO engine for all the pack's n-gram tables
  std::set<std::string> consumed_;  // dense names, expert prefixes and n-gram table prefixes
};

}  // namespace sluice
