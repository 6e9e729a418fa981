// PackSource: a pack's dense tensors by checkpoint name, and consumption tracking that
// covers the expert prefixes too.
#include "models/weight_source.h"

#include <algorithm>

#include "models/pack_ngram_table.h"

namespace sluice {

PackSource::PackSource(std::shared_ptr<Pack> pack, DType kind, bool streamed, NgramTableOptions tables)
    : pack_(std::move(pack)), kind_(kind), streamed_(streamed), tables_(tables) {
  if (!pack_->manifest().kinds.empty()) pack_->kind(kind);  // an error naming the kinds the pack has
}

std::shared_ptr<NgramTable> PackSource::ngram_table(const std::string& table) {
  const PackRowTable* t = pack_->row_table(table);
  if (!t) return nullptr;
  consumed_.insert(table);
  if (!ple_reader_) ple_reader_ = std::make_shared<PleFileReader>(*pack_, tables_);
  return std::make_shared<PackNgramTable>(pack_, *t, tables_, ple_reader_);
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
  if (pack_->manifest().ple)
    for (const PackRowTable& t : pack_->manifest().ple->tables)
      if (!consumed_.count(t.prefix)) out.push_back(t.prefix + "* (n-gram table)");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sluice
