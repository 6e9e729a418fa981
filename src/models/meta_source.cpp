// MetaSource: made-up tensors for a dry run of a family loader.
#include "models/meta_source.h"

#include "backends/backend.h"
#include "core/error.h"
#include "core/zero_pages.h"
#include "models/registry.h"

namespace sluice {

void MetaSource::declare(const std::string& name, std::span<const int64_t> shape, WeightHint hint) {
  if (index_.count(name)) return;
  SLUICE_CHECK(!shape.empty() && shape.size() <= 4, Status::internal, "meta source: tensor ",
               name, " has ", shape.size(), " dimensions");
  uint64_t bytes = 2;  // bf16
  constexpr uint64_t kMaxBytes = uint64_t{1} << 40;  // far beyond any tensor; keeps the product from overflowing
  for (int64_t d : shape) {
    SLUICE_CHECK(d > 0, Status::internal, "meta source: tensor ", name, " has a dimension of ", d);
    SLUICE_CHECK(static_cast<uint64_t>(d) <= kMaxBytes / bytes, Status::invalid_argument, "meta source: tensor ", name,
                 " would hold more than 1 TiB");
    bytes *= static_cast<uint64_t>(d);
  }
  if (bytes > zeros_bytes_) {
    // A larger read-only mapping of the zero page; tensors handed out keep the old one alive.
    zeros_ = zero_pages(bytes);
    zeros_bytes_ = bytes;
  }
  index_[name] = tensors_.size();
  tensors_.push_back({name, std::vector<int64_t>(shape.begin(), shape.end()), hint});
}

Tensor MetaSource::get(const std::string& name) {
  auto it = index_.find(name);
  SLUICE_CHECK(it != index_.end(), Status::not_found, "meta source: no tensor ", name);
  const MetaTensor& m = tensors_[it->second];
  Tensor t;
  t.dtype = DType::bf16;
  for (int64_t d : m.shape) t.shape[t.ndim++] = d;
  t.data = zeros_.get();  // read-only: never written
  t.storage = zeros_;
  consumed_.insert(name);
  return t;
}

void MetaSource::consume(const std::string& name) {
  SLUICE_CHECK(index_.count(name), Status::not_found, "meta source: no tensor ", name);
  consumed_.insert(name);
}

std::vector<std::string> MetaSource::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : index_) out.push_back(name);
  return out;
}

std::vector<std::string> MetaSource::unconsumed() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : index_)
    if (!consumed_.count(name)) out.push_back(name);
  return out;
}

std::vector<MetaTensor> family_tensors(const nlohmann::json& config, std::string* model_type) {
  const Family& family = find_family(config);
  if (model_type) *model_type = std::string(family.model_type);
  auto backend = make_cpu_backend();  // upload keeps host views: nothing is copied
  MetaSource source;
  family.load(config, source, *backend);
  std::vector<MetaTensor> out = source.declared();
  for (MetaTensor& t : out) t.matrix = source.matrices().count(t.name) != 0;
  return out;
}

}  // namespace sluice
