// Routing-trace replay: feeds the expert accesses of a recorded trace through the real
// residency code (residency.h) and counts hits and misses, for comparing eviction policies
// against each other and against the offline optimum (Belady).
//
// Trace format (docs/trace-format.md): JSON lines, one object per (token, MoE layer):
//   {"problem_id": 0, "layer": 3, "token_idx": 17, "experts": [6, 5], "gating_probs": [0.7, 0.3]}
// experts are strongest first. problem_id (default 0) separates independent requests, each
// replayed from a cold cache; token_idx (default: file order) orders the layers of a problem
// into token order for a shared pool; "weights" is accepted for "gating_probs". Optional
// "predicted_next" (expert ids, strongest first) is the lookahead router's prediction for the
// next MoE layer of the same token, "next_layer" (default layer + 1) that layer's index, as
// `sluice run --trace-routing` writes them with --lookahead on; a shared-pool replay hands
// them to the policy after the row's step, where the engine's lookahead runs. (With one cache
// per layer a prediction is for a step whose union its cache knows when it evicts, so there
// it cannot change a decision.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "experts/policy.h"

namespace sluice {

struct TraceRow {
  int64_t problem = 0;
  int64_t layer = 0;
  int64_t token = 0;             // token_idx, or the row's position among its (problem, layer)
  std::vector<int32_t> experts;  // strongest first, distinct
  std::vector<float> weights;    // empty when the trace has none
  std::vector<int32_t> predicted_next;  // lookahead's experts for next_layer; empty when none
  int64_t next_layer = -1;              // the layer predicted_next is for (-1: none)
};

struct Trace {
  std::vector<TraceRow> rows;  // in file order
  int64_t n_layer = 0;         // 1 + the largest layer index
  int32_t n_expert = 0;        // 1 + the largest expert id
  int32_t top_k = 0;           // the most experts in a row
  int64_t n_problems = 0;
  bool has_predictions = false;  // some row carries predicted_next
};

// Parses a trace file; errors name the file and line.
Trace read_trace(const std::filesystem::path& path);
// Writes a trace as JSON lines in the format read_trace reads (problem_id, layer, token_idx,
// experts, gating_probs when the rows have weights, next_layer and predicted_next when they
// have a prediction); the file appears whole at the end (format/output_file.h).
void write_trace(const Trace& trace, const std::filesystem::path& path);

// How long an access pins its slot.
//   access: each routed expert is one independent request, released at once (the usual
//           cache-simulation convention, and the one of docs/trace-format.md)
//   step:   the experts of one (token, layer) stay pinned until all of them are acquired,
//           as in the engine, so a token never evicts its own experts
enum class PinScope { access, step };

// When a shared-pool replay hands a row's predicted_next to the policy:
//   after_step   after the row's own step acquired its experts: where the streamers' lookahead
//                runs now (StepPlan::acquire_and_read, then plan_prefetch)
//   before_step  before it: the lookahead router reads the same hidden state as the layer's
//                own router, so an engine can know the next layer's prediction before this
//                layer's misses choose their victims
//   never        the policy never sees them (a trace with predictions replayed as one without)
enum class PredictionTime { after_step, before_step, never };

struct SimulateOptions {
  int32_t slots_per_layer = 0;  // > 0: one cache of this many slots per layer
  int32_t slots = 0;            // > 0: one shared pool over all layers
  PolicyKind policy = kDefaultPolicy;
  PinScope pin = PinScope::access;
  double lrfu_half_life_slots = PolicyOptions{}.lrfu_half_life_slots;
  double markov_half_life_steps = PolicyOptions{}.markov_half_life_steps;
  PredictionTime predictions = PredictionTime::after_step;
  // Lookahead's prefetches (a shared pool, a trace with predictions): after each row's step,
  // its predicted_next experts are acquired as prefetches into the speculative share, as
  // plan_prefetch does in the engine, and land before the next layer's step (the best case:
  // a read a layer ahead). A demand access that finds one counts as a hit. Not for belady
  // (the optimum of demand paging, the reference).
  bool prefetch = false;
  // The speculative share with prefetches; -1: the engine's (speculative_share: 2 top_k, at
  // most a quarter of the pool, at least 1, leaving room for a token's experts).
  int32_t speculative_slots = -1;
};

struct SimulateResult {
  uint64_t hits = 0, misses = 0;                    // demand accesses
  uint64_t prefetch_reads = 0;                      // prefetches that read a record
  uint64_t prefetch_confirmed = 0;                  // of them, used by a demand access first
  uint64_t prefetch_wasted = 0;                     // of them, evicted before any demand access
  double hit_rate() const { return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0; }
  // Records read, demand misses and prefetches, per demand access.
  double reads_per_access() const {
    return hits + misses ? static_cast<double>(misses + prefetch_reads) / static_cast<double>(hits + misses) : 0;
  }
};

// The speculative share simulate_trace gives a pool of n_slots with prefetches on (the
// engine's rule, plan_cache_layout's).
int32_t simulate_speculative_slots(const SimulateOptions& opt, int32_t n_slots, int32_t top_k);

// The most slots a replay can fill: per layer, the distinct experts of the trace's busiest
// layer; for a shared pool, the trace's distinct (layer, expert) pairs (at most layers x
// experts). More slots never evict, so the hit rates are the same at any larger size, and
// simulate_trace caps the slot count here (--expert-slots 100000000 would otherwise allocate
// gigabytes of slot state for nothing).
int64_t simulate_slot_cap(const Trace& trace, bool per_layer);

// Replays the trace. Exactly one of slots_per_layer and slots must be set, and it must be
// at least the trace's top_k (the engine's minimum); a larger one than simulate_slot_cap()
// is replayed at the cap.
SimulateResult simulate_trace(const Trace& trace, const SimulateOptions& opt);

}  // namespace sluice
