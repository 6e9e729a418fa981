// Eviction policies of the expert cache. A policy keeps its own bookkeeping per cache key
// and ranks resident slots: the residency asks for the priority of every evictable slot and
// evicts the lowest. The residency (residency.h) owns slots, pins and states; a policy only
// orders them, so every policy obeys the same rules (never a pinned or loading slot).
//
// Keys are (record, kind) pairs flattened by the residency (key = record * n_kinds + kind);
// `now` is the residency's access clock (one tick per acquire).
//
// Policies (docs/policy.md has their measured hit rates on real routing traces):
//   lru    least recently used
//   lfu    least frequently used over the key's whole history (counts survive eviction),
//          ties broken by recency
//   lrfu   frequency-weighted recency (Lee et al., LRFU): each access adds 1 to a
//          combined recency-frequency value that halves every `half_life` accesses; the
//          lowest value is evicted. half_life is a multiple of the slot count so the policy
//          behaves the same for a per-layer cache and a shared pool.
//   fifo   first in, first out (a baseline)
//   markov the predicted chance that a key is used at its layer's next step: online counts of
//          which experts follow which (a per-layer transition table conditioned on the
//          layer's latest step), mixed with the key's frequency over the last steps (the
//          backoff where the table has few counts); when the lookahead router predicts the
//          next layer's experts (on_predict), a predicted key is worth at least the
//          predictions' measured precision. Ties go to the least recently used. Without
//          step notices (on_step) every chance is 0 and it is lru.
//   belady the offline optimum for simulation: evicts the key whose next use is furthest,
//          given an oracle over the future of the trace
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace sluice {

enum class PolicyKind { lru, lfu, lrfu, fifo, markov, belady };

std::string_view policy_name(PolicyKind k);
std::optional<PolicyKind> policy_from_name(std::string_view s);
// The policies an engine can run (all but belady), in the order simulate prints them.
std::span<const PolicyKind> online_policies();
// A comma-separated list of every policy name, for option help and error messages.
std::string_view policy_names_text();

// Default eviction policy of the engine: chosen by measurement (docs/policy.md).
constexpr PolicyKind kDefaultPolicy = PolicyKind::markov;

// The eviction order of a slot: the lowest (primary, secondary) pair is evicted first.
struct EvictionRank {
  double primary = 0;
  uint64_t secondary = 0;
  friend bool operator<(const EvictionRank& a, const EvictionRank& b) {
    return a.primary < b.primary || (a.primary == b.primary && a.secondary < b.secondary);
  }
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual PolicyKind kind() const = 0;
  std::string_view name() const { return policy_name(kind()); }

  // A key was placed in `slot` (a miss that reserved it) or found there (a hit). Both count
  // as an access of the key at time `now`.
  virtual void on_fill(int32_t slot, int64_t key, uint64_t now) = 0;
  virtual void on_hit(int32_t slot, int64_t key, uint64_t now) = 0;
  // The key left the slot (eviction or a failed load).
  virtual void on_evict(int32_t slot, int64_t key) {}
  // The rank of a resident slot holding `key`; the lowest rank is evicted.
  virtual EvictionRank rank(int32_t slot, int64_t key, uint64_t now) const = 0;
  // The distinct records of one step of one layer (Residency::acquire_step calls it before
  // acquiring them): what the engine knows of the step's union. Records, not keys.
  virtual void on_step(std::span<const int64_t> records) {}
  // The lookahead router's predicted records of the next layer's coming step.
  virtual void on_predict(std::span<const int64_t> records) {}
};

// The next time a key is used, in the oracle's own time unit, or UINT64_MAX if never again.
// Keys used by the current step must report the current step (the optimum may not evict
// an expert the current token uses).
using NextUseOracle = std::function<uint64_t(int64_t key)>;

struct PolicyOptions {
  int32_t n_slots = 0;             // slots of the cache (lrfu scales its half-life by it)
  int64_t n_keys = 0;              // size of the key space
  double lrfu_half_life_slots = 8; // lrfu: half-life of an access, in accesses per slot
  int32_t n_kinds = 1;             // key = record * n_kinds + kind (the residency fills it in)
  int64_t n_expert = 0;            // records per layer (record = layer * n_expert + expert); 0: one layer
  // markov: the half-life of the frequency, in steps of the key's layer (0: by the cache's
  // shape, markov_half_life_for), and the weight of the transition table against the
  // frequency (docs/policy.md has the measured choices).
  double markov_half_life_steps = 0;
  double markov_weight = 0.5;
  int64_t step_experts = 0;        // markov: experts a layer's step uses (top-k; 0: unknown)
  NextUseOracle next_use;          // belady only
};

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, const PolicyOptions& opt);

// markov's frequency half-life, in layer steps, for a cache of slots_per_layer slots a layer
// (a shared pool: its slots over the layers) whose steps use step_experts of n_expert experts
// (docs/policy.md, "The half-life and the cache size"): 24 when the cache holds 3 or more
// steps of a layer (a large cache keeps experts whose reuses lie far apart, so their counts
// must be remembered long), 4 below that when it holds a quarter of the layer's experts or
// less (a small cache of a wide layer must follow the current text), 8 otherwise; 8 when
// step_experts is unknown (0).
double markov_half_life_for(double slots_per_layer, int64_t step_experts, int64_t n_expert);

}  // namespace sluice
