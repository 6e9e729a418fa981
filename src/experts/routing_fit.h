// A recorded routing trace as one stream of tokens, and a routing generator fitted on it, for
// replaying real routing on packs of shapes the trace lacks (--replay-routing,
// experts/routing_replay.h; docs/streaming.md, "Replayed routing").
//
// The stream: the trace's problems concatenated in the order they first appear; within a
// problem each layer's rows in token order (token_idx, else file order), token j of the
// problem being the j-th row of every layer. A problem has as many tokens as its layer with the
// fewest rows (a recorder that dropped rows, as the Mixtral trace's did, leaves the longer
// layers' tails out). Layers are the trace's distinct layer indices, ascending, renumbered
// 0..n_layers-1.
//
// The generator (fit_routing, generate_routing) keeps what a cache sees of the trace, per
// layer: the popularity of its experts by rank (the share of the layer's routing the r-th most
// used expert takes, resampled at equal rank fractions for another expert count), the
// previous token's reuse (the share of a token's experts that the previous token of the
// layer also used), the sequel (the share of a token's experts that are the favourite other
// follower, at the layer's next token, of one of the previous token's experts: what markov's
// transition table learns), the next layer's transition (the share of a layer's experts that
// are the favourite successor of one of the previous layer's experts at the same token) and
// the lookahead's recall (the share of the next layer's experts that predicted_next holds).
// Each of a token's k experts is drawn, in turn, from the previous token's experts (p_reuse),
// from the favourite successors of the previous layer's (p_transition), from the favourite
// followers of the previous token's (p_sequel), from the layer's recent history (p_history,
// counts halving every history_half_life tokens), or else from the popularity draw.
// Calibrated in rounds (generate, measure, correct): p_reuse, p_transition and p_sequel per
// layer so the generated trace shows the trace's reuse, transition and sequel, and the
// popularity draw's weight of each rank so the generated popularity is the trace's (the other
// draws favour popular experts); p_history and its half-life are picked from a small grid by
// the hit rates of cache_hit_rates (LRU a layer, markov in one pool) and the statistics above.
// At another expert count or top-k the draws are calibrated again at that shape: the same
// reuse, transition, sequel and popularity at equal rank fractions, the history as fitted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experts/simulate.h"

namespace sluice {

struct TraceStream {
  int64_t n_layers = 0, n_tokens = 0;
  std::vector<int64_t> layer_ids;       // [n_layers] the trace's own index of each layer
  std::vector<const TraceRow*> rows;    // [n_layers * n_tokens], rows of the Trace it was made from
  std::vector<int64_t> problem_starts;  // the first stream token of each problem
  const TraceRow& at(int64_t layer, int64_t token) const {
    return *rows[static_cast<size_t>(layer * n_tokens + token)];
  }
};

// The stream of `trace`, which must outlive it. Errors (corrupt) for a trace without a token
// every layer routes.
TraceStream trace_stream(const Trace& trace);

// The generator's probabilities at one shape (expert count, top-k).
struct RoutingDraws {
  std::vector<double> p_reuse, p_transition, p_sequel;  // [layer]
  double p_history = 0, history_half_life = 8;
  std::vector<std::vector<double>> weight;    // [layer][rank] the popularity draw's weights
};

struct RoutingFit {
  int64_t n_layers = 0, n_expert = 0, top_k = 0;  // the trace's (layers of its stream)
  int64_t n_tokens = 0;                           // the trace's stream
  // What the trace shows, per layer.
  std::vector<std::vector<double>> popularity;  // [layer][rank]: share of the layer's routing, descending
  std::vector<double> reuse;                    // [layer] previous token's experts reused, share of top_k
  std::vector<double> transition;               // [layer] favourite successors of the previous layer's experts, share of top_k (layer 0: 0)
  std::vector<double> sequel;                   // [layer] favourite other followers of the previous token's experts, share of top_k
  std::vector<double> recall;                   // [layer] predicted_next's share of layer + 1's experts; -1: none
  std::vector<std::vector<float>> row_weights;  // [layer] the weights of the layer's rows, top_k each, in stream order
  std::vector<double> hit_rate;                 // [5] cache_hit_rates (below)
  // The generator's probabilities, fitted at the trace's own shape.
  RoutingDraws draws;
  std::vector<double> fitted_hit_rate;        // [5] the generated trace's, at the trace's own shape
  // "reuse 0.39 (drawn 0.31), transition ..., history 0.15 halving every 16 tokens, LRU 0.39/0.51/0.76 (trace) 0.40/0.52/0.75 (fit)"
  std::string describe() const;
};

// The cache fractions of cache_hit_rates: LRU with a cache a layer, markov with one pool.
inline constexpr double kFitLruFractions[3] = {0.125, 0.25, 0.5};
inline constexpr double kFitPoolFractions[2] = {0.25, 0.5};

// What the trace shows (every field above the generator's probabilities), as the fit sees it.
RoutingFit routing_statistics(const Trace& trace);
// routing_statistics, then the generator fitted to them (about a second for a trace of
// 24,576 rows).
RoutingFit fit_routing(const Trace& trace);

// A trace of one problem of n_tokens tokens over the fit's layers, n_expert experts a layer,
// top_k a token (each row's weights a random row's of the trace's layer: its first top_k, or
// its ranks stretched over top_k), with predicted_next where the trace had predictions.
// Deterministic for a seed.
Trace generate_routing(const RoutingFit& fit, int64_t n_expert, int64_t top_k, int64_t n_tokens, uint64_t seed);

// The hit rates the fit compares (step pins, at least top_k slots a layer): LRU with one cache
// a layer of kFitLruFractions of `n_expert` experts, then markov (the engine's default) with one
// pool of kFitPoolFractions of every layer's experts (predictions never handed to it).
std::vector<double> cache_hit_rates(const Trace& trace, int64_t n_expert, int64_t top_k);

}  // namespace sluice
