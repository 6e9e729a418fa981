// Residency of the expert cache: which record (in which kind) each slot holds, the state of
// every slot, the pins held by in-flight work, and the victim choice on a miss (through a
// pluggable EvictionPolicy). It knows nothing about memory or IO: the streamer turns a miss
// into a read into the slot's memory and reports back with complete_load / fail_load.
//
// Records: record = moe_layer * n_expert + expert (format/pack.h). The cache key is
// (record, kind): a slot holding the q2 copy of a record is not a hit for its bf16 copy.
//
// Slot states:  free --acquire(miss)--> loading --complete_load--> resident
//                 ^----------fail_load--------'                       |
//                 '------------------------eviction by policy---------'
// A loading slot is never evicted (a read is writing into it); neither is a slot with pins.
//
// The speculative share: prefetched records (AccessKind::prefetch) live in a partition of
// at most `speculative_slots` slots. A prefetch may take a free slot or evict another
// unconfirmed prefetch, never a demand-loaded record. A demand access that finds a
// speculative record confirms the prediction and promotes it to the demand partition.
// Demand misses keep at least `speculative_slots` slots out of the demand partition while
// slots are free, evict demand records by policy, and fall back to an unpinned speculative
// record (or a free slot) only when nothing else can go. A confirmation grows the demand
// partition by one slot: when that leaves the share less room than `speculative_slots`
// (free plus speculative slots), the lowest-ranked unpinned demand record leaves, as the
// demand miss the prediction saved would have evicted it; otherwise an accurate predictor
// would fill the cache with confirmed records and find no room for the next prediction.
//
// Not thread-safe: one owner (the streamer's thread, or the simulator) makes every call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "experts/policy.h"
#include "format/pack.h"

namespace sluice {


enum class SlotState : uint8_t { free, loading, resident };
enum class AccessKind : uint8_t { demand, prefetch };

enum class AcquireStatus : uint8_t {
  hit,      // resident: use the slot now
  pending,  // loading (an earlier miss or prefetch): wait for its read to land
  miss,     // a slot was reserved (state loading): the caller must read the record into it
  no_slot,  // every slot is pinned or loading; nothing was changed
};

struct AcquireResult {
  AcquireStatus status = AcquireStatus::no_slot;
  int32_t slot = -1;
  int64_t evicted_record = -1;           // miss: the record the slot held before, or -1
  DType evicted_kind = DType::bf16;
  bool evicted_speculative = false;      // the evicted record was an unconfirmed prefetch
  bool confirmed_prefetch = false;       // demand hit/pending on a speculative record
};

struct ResidencyCounters {
  uint64_t hits = 0, pending = 0, misses = 0, no_slot = 0;  // demand acquires
  uint64_t prefetch_issued = 0;          // prefetch acquires that reserved a slot
  uint64_t prefetch_already = 0;         // prefetch acquires of a resident or loading key
  uint64_t prefetch_refused = 0;         // prefetch acquires that found no slot
  uint64_t prefetch_confirmed = 0;       // speculative records promoted by a demand access
  uint64_t prefetch_wasted = 0;          // speculative records evicted before any demand access
  uint64_t evictions = 0;
};

struct ResidencyOptions {
  int32_t n_slots = 0;
  int64_t n_records = 0;                 // moe layers x experts
  int64_t n_expert = 0;                  // records per layer, for per-layer policies (0: one layer)
  int32_t speculative_slots = 0;         // speculative share, < n_slots
  PolicyKind policy = kDefaultPolicy;
  PolicyOptions policy_options;          // n_slots and n_keys are filled in by the residency
  // Called when a resident record leaves its slot to make room (an eviction; not for
  // fail_load), before anything can reuse the slot: its memory still holds the record (the
  // streamer keeps it in the host tier). Must not throw.
  std::function<void(int32_t slot, int64_t record, DType kind)> on_evict;
};

class Residency {
 public:
  explicit Residency(const ResidencyOptions& opt);

  // Looks up (record, kind). A demand acquire pins the slot it returns (hit, pending or
  // miss); release() drops the pin. A prefetch acquire takes no pin: its reserved slot is
  // protected by its loading state, and on a hit or pending it changes nothing.
  AcquireResult acquire(int64_t record, DType kind, AccessKind access = AccessKind::demand);
  // Demand-acquires the distinct records of one step (a layer's union over the batch rows)
  // in one kind: first every record already present is pinned, then the misses reserve
  // slots in the order given (strongest first), so a step never evicts one of its own
  // records. results[i] answers records[i]; on no_slot for any record, the misses already
  // reserved keep their slots (the caller reads or fails them) and the rest are no_slot.
  void acquire_step(std::span<const int64_t> records, DType kind, std::span<AcquireResult> results);
  // Tells the policy the distinct records of one layer's step (acquire_step does it first;
  // a caller acquiring a step's records one by one calls it itself).
  void note_step(std::span<const int64_t> records) { policy_->on_step(records); }
  // Tells the policy the lookahead router's predicted records of the next layer's step.
  void note_prediction(std::span<const int64_t> records) { policy_->on_predict(records); }
  void complete_load(int32_t slot);  // loading -> resident
  void fail_load(int32_t slot);      // loading -> free; the record is forgotten
  void pin(int32_t slot);            // one more pin on an occupied slot
  void release(int32_t slot);        // drops one pin

  // The slot holding (record, kind) in any state but free, or -1. Changes nothing.
  int32_t find(int64_t record, DType kind) const;

  int32_t n_slots() const { return static_cast<int32_t>(slots_.size()); }
  int64_t n_records() const { return n_records_; }
  SlotState state(int32_t slot) const { return slots_[slot].state; }
  int64_t record(int32_t slot) const { return slots_[slot].key < 0 ? -1 : slots_[slot].key / kExpertKindCount; }
  DType kind(int32_t slot) const { return kExpertKinds[slots_[slot].key % kExpertKindCount]; }
  int32_t pins(int32_t slot) const { return slots_[slot].pins; }
  bool speculative(int32_t slot) const { return slots_[slot].speculative; }
  int32_t n_free() const { return n_free_; }
  int32_t n_speculative() const { return n_speculative_; }
  int32_t speculative_capacity() const { return speculative_capacity_; }
  uint64_t now() const { return clock_; }
  const ResidencyCounters& counters() const { return counters_; }
  const EvictionPolicy& policy() const { return *policy_; }

  // Checks every invariant (counts, the key index, states); throws Status::internal on a
  // violation. For tests.
  void check_invariants() const;

 private:
  struct Slot {
    int64_t key = -1;  // record * kExpertKindCount + expert_kind_index(kind), -1 when free
    SlotState state = SlotState::free;
    bool speculative = false;
    int32_t pins = 0;
  };

  int64_t key_of(int64_t record, DType kind) const;
  bool evictable(const Slot& s) const { return s.state == SlotState::resident && s.pins == 0; }
  int32_t find_free() const;
  int32_t find_victim(bool speculative) const;  // lowest-ranked evictable slot of one partition
  int32_t reserve(int64_t key, bool speculative, AcquireResult& r);
  void clear(int32_t slot);
  void evict(int32_t slot);  // a resident record leaves to make room (on_evict, counters)
  void rebalance();          // gives the speculative share its room back after confirmations

  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_key_;  // [n_records * kExpertKindCount], -1 if absent
  std::vector<uint64_t> filled_at_;   // [n_slots] clock at the slot's last reservation
  int64_t n_records_ = 0;
  int32_t n_free_ = 0, n_speculative_ = 0, speculative_capacity_ = 0;
  uint64_t clock_ = 0;
  bool in_step_ = false;  // acquire_step pinning its resident records: rebalance afterwards
  std::function<void(int32_t, int64_t, DType)> on_evict_;
  std::unique_ptr<EvictionPolicy> policy_;
  ResidencyCounters counters_;
};

}  // namespace sluice
