// Model: the input checks shared by every family's forward pass.
#include "models/model.h"

#include "core/error.h"

namespace sluice {

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

}  // namespace sluice
