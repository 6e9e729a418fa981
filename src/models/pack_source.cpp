// PackSource: a pack's dense tensors by checkpoint name, and consumption tracking that
// covers the expert prefixes too.
#include "models/weight_source.h"

#include <algorithm>

namespace sluice {

PackSource::PackSource(std::shared_ptr<Pack> pack, ExpertKind kind, bool streamed)
    : pack_(std::move(pack)), kind_(kind), streamed_(streamed) {
  pack_->kind(kind);  // an error naming the kinds the pack has
}

Tensor PackSource::get(const std::string& name) {
  Tensor t = pack_->dense(name);
  consumed_.insert(name);
  return t;
}

void PackSource::consume(const std::string& name) {
  SLUICE_CHECK(pack_->has_dense(name) || pack_->moe_layer_of_prefix(name) >= 0, Status::not_found, pack_->dir().string(),
               ": the pack has no tensor or expert prefix ", name);
  consumed_.insert(name);
}

std::vector<std::string> PackSource::unconsumed() const {
  std::vector<std::string> out;
  for (const std::string& n : pack_->dense_names())
    if (!consumed_.count(n)) out.push_back(n);
  for (const std::string& p : pack_->manifest().expert_prefixes)
    if (!consumed_.count(p)) out.push_back(p + "* (routed experts)");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sluice
