// Model: the input checks shared by every family's forward pass, and context sizes in bytes.
#include "models/model.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace sluice {

void Model::index_moe_layers(const std::vector<bool>& is_moe, std::vector<int64_t>& moe_index,
                             std::vector<int64_t>& next_moe) {
  moe_index.assign(is_moe.size(), -1);
  next_moe.assign(is_moe.size(), -1);
  info_.moe_layers.clear();
  int64_t last = -1;
  for (size_t l = 0; l < is_moe.size(); ++l) {
    if (!is_moe[l]) continue;
    moe_index[l] = static_cast<int64_t>(info_.moe_layers.size());
    info_.moe_layers.push_back(static_cast<int64_t>(l));
    if (last >= 0) next_moe[static_cast<size_t>(last)] = static_cast<int64_t>(l);
    last = static_cast<int64_t>(l);
  }
}

void Model::check_forward_inputs(std::span<const int32_t> tokens, const SequenceState& state, std::span<float> logits,
                                 bool all_logits) const {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = info_.n_vocab;
  SLUICE_CHECK(n > 0, Status::invalid_argument, "forward needs at least one token");
  SLUICE_CHECK(state.n_past + n <= state.n_ctx, Status::invalid_argument, "context full: ", state.n_past + n,
               " tokens exceed the context size ", state.n_ctx);
  SLUICE_CHECK(static_cast<int64_t>(logits.size()) >= (all_logits ? n : 1) * V, Status::internal,
               "logits buffer too small");
  for (int32_t t : tokens)
    SLUICE_CHECK(t >= 0 && t < V, Status::invalid_argument, "token id ", t, " is outside the vocabulary [0, ", V, ")");
}

uint64_t Model::saturating_product(uint64_t bytes_per_token, int64_t n_ctx) {
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(n_ctx, 0));
  if (n != 0 && bytes_per_token > std::numeric_limits<uint64_t>::max() / n) return std::numeric_limits<uint64_t>::max();
  return bytes_per_token * n;
}

}  // namespace sluice
