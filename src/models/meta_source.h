// MetaSource: a WeightSource that holds no weights and makes up every tensor a family's
// loader asks for, with the shape it asks for (PyTorch's "meta device" idea). Running a
// family's loader over it lists the tensors a checkpoint of that config must hold, by their
// real checkpoint names and shapes, in the order the loader takes them: sluice synth writes
// packs from that list, so a synthetic pack matches what the loader expects by construction.
//
// The tensors it hands out are bf16 views of read-only zero pages (one anonymous mapping the
// size of the largest tensor, so a made-up 1 GB embedding costs no memory); optional tensors
// (take_optional) are never made up, so the list holds only what the config requires.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/weight_source.h"

namespace sluice {

struct MetaTensor {
  std::string name;             // checkpoint name
  std::vector<int64_t> shape;
  WeightHint hint = WeightHint::none;
  bool matrix = false;          // taken with take_matrix: a pack may hold it quantized
};

class MetaSource final : public WeightSource {
 public:
  MetaSource() = default;
  bool has(const std::string& name) const override { return index_.count(name) != 0; }
  Tensor get(const std::string& name) override;
  void consume(const std::string& name) override;
  std::vector<std::string> names() const override;
  std::vector<std::string> unconsumed() const override;
  std::string describe() const override { return "(made-up weights)"; }
  bool values_needed() const override { return false; }
  void declare(const std::string& name, std::span<const int64_t> shape, WeightHint hint) override;

  const std::vector<MetaTensor>& declared() const { return tensors_; }  // in the order asked for

 private:
  std::vector<MetaTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::set<std::string> consumed_;
  std::shared_ptr<void> zeros_;  // read-only zero pages
  uint64_t zeros_bytes_ = 0;
};

// The tensors a checkpoint of `config` must hold for its family (found through the
// registry), in load order; `model_type` receives the family. Config errors are the
// family's own (Status::corrupt / unsupported naming the field).
std::vector<MetaTensor> family_tensors(const nlohmann::json& config, std::string* model_type = nullptr);

}  // namespace sluice
