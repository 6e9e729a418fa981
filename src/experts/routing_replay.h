// Replayed routing (benchmarks: --replay-routing TRACE; DESIGN.md, "Replayed routing";
// docs/streaming.md, "Replayed routing"): every MoE layer's choice of experts (ids and
// weights, strongest first) comes from a recorded trace instead of the model's router, so a
// synthetic pack's streamed figures show a trained model's locality. The compute, the reads,
// the cache, the plan, the deadline and lookahead run as they would; lookahead predicts with
// the trace's own predicted_next (its real precision) where the trace has one.
//
// The mapping onto a pack (map_routing_trace), stated once here and in the docs:
//   tokens   the trace's stream (routing_fit.h: problems concatenated in the order they
//            first appear, token order within each); each row of each forward pass takes the
//            next token, prompt and generated alike, and a run longer than the trace wraps
//            around. Problem boundaries are not marked: the cache carries over, as from one
//            request to the next on a server.
//   layers   MoE layer L of the pack reads trace layer L mod n (n: the trace's layers); its
//            cycle c = L div n starts c x floor(T / C) tokens later in the stream (T tokens, C
//            cycles), so that repeated layers do not miss together.
//   experts  ids: the trace's own ids when the pack has as many experts; with more, through a
//            fixed permutation of the pack's experts (the layer's seed), so only the trace's
//            number of experts a layer is ever used. fit: a generator fitted on the trace
//            (routing_fit.h) at the pack's expert count and top-k. auto: ids when the expert
//            counts agree and the pack routes no more experts a token than the trace, else fit.
//   top-k    the first k of each row (strongest first); the weights as recorded, renormalized
//            to sum 1 when the family renormalizes its top-k (norm_topk_prob); what the family
//            does after its top-k (Gemma 4's per-expert scales) still applies.
//   lookahead  the prediction recorded with row (t, l) for layer l + 1, mapped as that layer's
//            ids, first k; none at the last trace layer of a cycle (its next pack layer reads
//            another part of the stream) nor where the trace has none: lookahead then prefetches
//            nothing after that layer.
//
// A RoutingReplay is shared by the model (which takes rows as its MoE layers run) and, for
// --kl-check, by the run's two streamers; one model thread uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "experts/routing.h"
#include "experts/simulate.h"
#include "experts/stats.h"

namespace sluice {

enum class ReplayMapping { automatic, ids, fit };
// "auto", "ids", "fit"; nullopt for anything else.
std::optional<ReplayMapping> replay_mapping_from_name(std::string_view name);

// The pack a routing is replayed on.
struct ReplayShape {
  int64_t n_layers = 0;  // MoE layers
  int64_t n_expert = 0;
  int64_t top_k = 0;
};

// A trace mapped onto a shape: the rows every MoE layer reads, token by token.
struct ReplayTable {
  int64_t n_layers = 0, n_tokens = 0, k = 0, n_expert = 0;
  std::vector<int32_t> ids;        // [n_layers, n_tokens, k] strongest first
  std::vector<float> weights;      // [n_layers, n_tokens, k] as recorded (first k)
  std::vector<int32_t> predicted;  // [n_layers, n_tokens, k] layer + 1's predicted ids, -1 where none; empty: none
  std::vector<uint8_t> predicts;   // [n_layers] whether layer L has predictions of layer L + 1
  std::string source;              // the trace's file name
  std::string mapping;             // "ids" or "fit"
  std::string rule;                // the mapping in words (one line)
  std::string fit;                 // RoutingFit::describe() when mapping is fit, else empty
};

// Maps `trace` (read from a file called `source`) onto `shape` by the rule above; errors
// (invalid_argument, one line) name what the rule cannot do: ids onto fewer experts than the
// trace has, or onto a larger top-k. seed: the permutations' and the generator's.
ReplayTable map_routing_trace(const Trace& trace, const std::string& source, const ReplayShape& shape,
                              ReplayMapping mapping, uint64_t seed = 1);

// The rows of the first n_tokens stream tokens as a trace of one problem (layer = MoE layer,
// token_idx = stream token, predicted_next where the table has it): what a replayed run reads,
// for `sluice simulate` and the tests.
Trace replay_as_trace(const ReplayTable& table, int64_t n_tokens);

class RoutingReplay {
 public:
  explicit RoutingReplay(ReplayTable table);

  const ReplayTable& table() const { return table_; }
  // Takes the next n rows of MoE layer L: returns the stream token of the first (later rows
  // follow it, wrapping at the table's tokens).
  int64_t take(int64_t layer, int64_t n);
  // Where each layer stands, to run a step twice on the same rows (--kl-check's exact step).
  std::vector<int64_t> position() const { return next_; }
  void set_position(std::vector<int64_t> position);

  // Rows [first, first + n) of layer L as route_topk gives a routing: ids and weights [n, k],
  // the weights renormalized to sum 1 a row when `normalize`.
  Routing rows(int64_t layer, int64_t first, int64_t n, bool normalize) const;
  // Layer L + 1's predicted experts at those rows, as a routing whose weights order them
  // (k - rank); ids of -1 where the trace has none. Null when layer L has no predictions.
  std::optional<Routing> predicted(int64_t layer, int64_t first, int64_t n) const;
  bool predicts(int64_t layer) const;
  // The table on `be` (Backend::make_routing_replay), made at the first call; null on a backend
  // that routes on the host.
  const RoutingReplayTable* device(Backend& be);

  // "replayed routing from routing-model-128e-code.jsonl.xz (ids: ...)": the whole rule.
  std::string label() const;
  // The run's routing source for its statistics and reports.
  RoutingSource source() const;

 private:
  // The table index of row `token` (wrapping) of `layer`.
  size_t row_at(int64_t layer, int64_t token) const;

  ReplayTable table_;
  std::vector<int64_t> next_;  // [n_layers] the next stream token of each layer
  Backend* device_backend_ = nullptr;
  std::unique_ptr<RoutingReplayTable> device_;
};

// The replayed routing of a MoE layer call: the replay and the stream token of its first row.
struct ReplayedRows {
  RoutingReplay* replay = nullptr;  // null: the router routes
  int64_t first = 0;
  explicit operator bool() const { return replay != nullptr; }
};

}  // namespace sluice
