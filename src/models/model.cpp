// Model: the input checks shared by every family's forward pass, the context limit, context
// sizes in bytes, and the host fallback of forward_sample.
#include "models/model.h"

#include <algorithm>
#include <limits>
#include <vector>

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

void Model::set_routing_replay(std::shared_ptr<RoutingReplay> replay) {
  if (replay) {
    const ReplayTable& t = replay->table();
    SLUICE_CHECK(t.n_layers == static_cast<int64_t>(info_.moe_layers.size()) && t.n_expert == info_.n_expert &&
                     t.k == info_.n_expert_used,
                 Status::invalid_argument, "replayed routing of ", t.n_layers, " MoE layers of ", t.n_expert,
                 " experts, top-", t.k, " for a model of ", info_.moe_layers.size(), " MoE layers of ",
                 info_.n_expert, " experts, top-", info_.n_expert_used);
  }
  routing_replay_ = std::move(replay);
}

void Model::check_context(int64_t n_tokens, const std::string& what) const {
  SLUICE_CHECK(n_tokens <= info_.n_ctx_train, Status::invalid_argument, what, ": ", n_tokens,
               " tokens exceed the model's context limit of ", info_.n_ctx_train,
               " tokens (max_position_embeddings in its config)");
}

void Model::check_forward_inputs(std::span<const int32_t> tokens, const SequenceState& state, std::span<float> logits,
                                 bool all_logits) const {
  check_step_inputs(tokens, state);
  const int64_t n = static_cast<int64_t>(tokens.size()), V = info_.n_vocab;
  SLUICE_CHECK(static_cast<int64_t>(logits.size()) >= (all_logits ? n : 1) * V, Status::internal,
               "logits buffer too small");
}

void Model::check_step_inputs(std::span<const int32_t> tokens, const SequenceState& state) const {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = info_.n_vocab;
  SLUICE_CHECK(n > 0, Status::invalid_argument, "forward needs at least one token");
  SLUICE_CHECK(state.n_past + n <= state.n_ctx, Status::invalid_argument, "context full: ", state.n_past + n,
               " tokens exceed the context size ", state.n_ctx);
  for (int32_t t : tokens)
    SLUICE_CHECK(t >= 0 && t < V, Status::invalid_argument, "token id ", t, " is outside the vocabulary [0, ", V, ")");
}

int32_t Model::forward_sample(int32_t token, SequenceState& state, const SampleRule& rule, int64_t n_valid,
                              int64_t draw53, std::optional<int64_t> /*next_draw53*/) {
  SLUICE_CHECK(n_valid > 0 && n_valid <= info_.n_vocab, Status::invalid_argument, "forward_sample: n_valid ", n_valid,
               " outside [1, ", info_.n_vocab, "]");
  std::vector<float> logits(static_cast<size_t>(info_.n_vocab));
  DecodePhase decode(*this);
  forward(std::span<const int32_t>(&token, 1), state, logits, false);
  SampleScratch scratch;
  return sample_row(std::span<const float>(logits).first(static_cast<size_t>(n_valid)), rule,
                    static_cast<double>(draw53) * 0x1p-53, scratch);
}

void Model::forward_batch(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                          std::span<float> logits) {
  check_batch_inputs(tokens, states, logits);
  DecodePhase decode(*this);
  const size_t V = static_cast<size_t>(info_.n_vocab);
  for (size_t b = 0; b < tokens.size(); ++b)
    forward(tokens.subspan(b, 1), *states[b], logits.subspan(b * V, V), false);
}

void Model::forward_batch_sample(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                 std::span<const SampleRule> rules, int64_t n_valid, std::span<const int64_t> draw53,
                                 std::span<int32_t> next) {
  check_batch_sample_inputs(tokens, states, rules, n_valid, draw53, next);
  if (tokens.size() == 1) {
    // The next step's draw is not known here; a greedy rule reads none.
    const bool greedy = rules[0].temperature < kGreedyTemperature;
    next[0] = forward_sample(tokens[0], *states[0], rules[0], n_valid, draw53[0],
                             greedy ? std::optional<int64_t>(0) : std::nullopt);
    return;
  }
  const size_t V = static_cast<size_t>(info_.n_vocab);
  std::vector<float> logits(tokens.size() * V);
  forward_batch(tokens, states, logits);
  SampleScratch scratch;
  for (size_t b = 0; b < tokens.size(); ++b)
    next[b] = sample_row(std::span<const float>(logits).subspan(b * V, static_cast<size_t>(n_valid)), rules[b],
                         static_cast<double>(draw53[b]) * 0x1p-53, scratch);
}

void Model::check_batch_sample_inputs(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                                      std::span<const SampleRule> rules, int64_t n_valid,
                                      std::span<const int64_t> draw53, std::span<int32_t> next) const {
  check_batch_states(tokens, states);
  SLUICE_CHECK(rules.size() == tokens.size() && draw53.size() == tokens.size() && next.size() == tokens.size(),
               Status::invalid_argument, "forward_batch_sample: ", tokens.size(), " tokens, ", rules.size(),
               " rules, ", draw53.size(), " draws, ", next.size(), " outputs");
  SLUICE_CHECK(n_valid > 0 && n_valid <= info_.n_vocab, Status::invalid_argument, "forward_batch_sample: n_valid ",
               n_valid, " outside [1, ", info_.n_vocab, "]");
}

void Model::check_batch_inputs(std::span<const int32_t> tokens, std::span<SequenceState* const> states,
                               std::span<float> logits) const {
  check_batch_states(tokens, states);
  SLUICE_CHECK(logits.size() >= tokens.size() * static_cast<size_t>(info_.n_vocab), Status::invalid_argument,
               "forward_batch: logits buffer of ", logits.size(), " floats for ", tokens.size(), " rows");
}

void Model::check_batch_states(std::span<const int32_t> tokens, std::span<SequenceState* const> states) const {
  SLUICE_CHECK(!tokens.empty() && states.size() == tokens.size(), Status::invalid_argument, "forward_batch: ",
               tokens.size(), " tokens for ", states.size(), " sequences");
  for (size_t b = 0; b < tokens.size(); ++b) {
    SLUICE_CHECK(states[b] != nullptr, Status::invalid_argument, "forward_batch: sequence ", b, " has no state");
    for (size_t c = 0; c < b; ++c)
      SLUICE_CHECK(states[c] != states[b], Status::invalid_argument, "forward_batch: sequence ", b,
                   " is in the batch twice");
    check_step_inputs(tokens.subspan(b, 1), *states[b]);
  }
}

void Model::copy_prefix(const SequenceState&, SequenceState&, int64_t, int64_t, const StateSnapshot*) {
  fail(Status::unsupported, info_.family, ": states of this family cannot be copied (no prompt cache)");
}

void Model::check_prefix_copy(const SequenceState& src, const SequenceState& dst, int64_t from, int64_t n,
                              const StateSnapshot* at) const {
  SLUICE_CHECK(0 <= from && from <= n && n <= src.n_past && n <= dst.n_ctx, Status::internal, "copy_prefix: rows [",
               from, ", ", n, ") of a state of ", src.n_past, " tokens into one of ", dst.n_ctx);
  SLUICE_CHECK(snapshot_bytes() == 0 || (at && at->n_past == n), Status::internal, "copy_prefix: ", info_.family,
               " resumes at ", n, " only from a snapshot taken there");
}

uint64_t Model::saturating_product(uint64_t bytes_per_token, int64_t n_ctx) {
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(n_ctx, 0));
  if (n != 0 && bytes_per_token > std::numeric_limits<uint64_t>::max() / n) return std::numeric_limits<uint64_t>::max();
  return bytes_per_token * n;
}

}  // namespace sluice
