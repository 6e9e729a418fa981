// The slot table: acquire (hit / pending / miss with a reserved slot / no slot), pins,
// load completion, and the victim search by policy within the demand or speculative share.
// A victim search scans the slots once (O(n_slots) per miss): a few thousand slots at most,
// far below the cost of the read a miss triggers.
#include "experts/residency.h"

#include <limits>

#include "core/error.h"

namespace sluice {

Residency::Residency(const ResidencyOptions& opt) : n_records_(opt.n_records) {
  SLUICE_CHECK(opt.n_slots > 0, Status::invalid_argument, "expert cache: needs at least one slot (got ", opt.n_slots, ")");
  SLUICE_CHECK(opt.n_records > 0, Status::invalid_argument, "expert cache: no records to cache");
  SLUICE_CHECK(opt.speculative_slots >= 0 && opt.speculative_slots < opt.n_slots, Status::invalid_argument,
               "expert cache: the speculative share (", opt.speculative_slots, " slots) must be smaller than the cache (",
               opt.n_slots, " slots)");
  slots_.resize(opt.n_slots);
  slot_of_key_.assign(opt.n_records * kExpertKindCount, -1);
  filled_at_.assign(opt.n_slots, 0);
  n_free_ = opt.n_slots;
  speculative_capacity_ = opt.speculative_slots;
  on_evict_ = opt.on_evict;
  PolicyOptions po = opt.policy_options;
  po.n_slots = opt.n_slots;
  po.n_keys = opt.n_records * kExpertKindCount;
  po.n_kinds = kExpertKindCount;
  po.n_expert = opt.n_expert;
  policy_ = make_policy(opt.policy, po);
}

int64_t Residency::key_of(int64_t record, DType kind) const {
  SLUICE_CHECK(record >= 0 && record < n_records_, Status::internal, "expert cache: record ", record,
               " is outside [0, ", n_records_, ")");
  return record * kExpertKindCount + expert_kind_index(kind);
}

int32_t Residency::find(int64_t record, DType kind) const { return slot_of_key_[key_of(record, kind)]; }

int32_t Residency::find_free() const {
  if (n_free_ == 0) return -1;
  for (int32_t i = 0; i < n_slots(); ++i)
    if (slots_[i].state == SlotState::free) return i;
  return -1;
}

int32_t Residency::find_victim(bool speculative) const {
  int32_t best = -1;
  EvictionRank best_rank;
  uint64_t best_fill = 0;
  for (int32_t i = 0; i < n_slots(); ++i) {
    const Slot& s = slots_[i];
    if (!evictable(s) || s.speculative != speculative) continue;
    if (speculative) {
      // Unconfirmed prefetches have had no real access: the oldest goes first.
      if (best < 0 || filled_at_[i] < best_fill) best = i, best_fill = filled_at_[i];
    } else {
      EvictionRank r = policy_->rank(i, s.key, clock_);
      if (best < 0 || r < best_rank) best = i, best_rank = r;
    }
  }
  return best;
}

void Residency::clear(int32_t slot) {
  Slot& s = slots_[slot];
  if (s.key >= 0) {
    slot_of_key_[s.key] = -1;
    policy_->on_evict(slot, s.key);
  }
  if (s.speculative) --n_speculative_;
  if (s.state != SlotState::free) ++n_free_;
  s = Slot{};
}

int32_t Residency::reserve(int64_t key, bool speculative, AcquireResult& r) {
  const int32_t n_demand = n_slots() - n_free_ - n_speculative_;
  int32_t slot = -1;
  if (speculative) {
    if (n_speculative_ < speculative_capacity_) slot = find_free();
    if (slot < 0) slot = find_victim(true);
  } else {
    if (n_demand < n_slots() - speculative_capacity_) slot = find_free();
    if (slot < 0) slot = find_victim(false);
    if (slot < 0) slot = find_free();       // borrow from the speculative share
    if (slot < 0) slot = find_victim(true);  // or drop an unconfirmed prefetch
  }
  if (slot < 0) return -1;
  Slot& s = slots_[slot];
  if (s.state != SlotState::free) {
    r.evicted_record = s.key / kExpertKindCount;
    r.evicted_kind = kExpertKinds[s.key % kExpertKindCount];
    r.evicted_speculative = s.speculative;
    if (s.speculative) ++counters_.prefetch_wasted;
    evict(slot);
  }
  s.key = key;
  s.state = SlotState::loading;
  s.speculative = speculative;
  s.pins = 0;
  --n_free_;
  if (speculative) ++n_speculative_;
  slot_of_key_[key] = slot;
  filled_at_[slot] = clock_;
  return slot;
}

void Residency::evict(int32_t slot) {
  const Slot& s = slots_[slot];
  ++counters_.evictions;
  if (on_evict_) on_evict_(slot, s.key / kExpertKindCount, kExpertKinds[s.key % kExpertKindCount]);
  clear(slot);
}

void Residency::rebalance() {
  while (n_free_ + n_speculative_ < speculative_capacity_) {
    const int32_t v = find_victim(false);
    if (v < 0) return;  // every demand record is pinned or loading: later
    evict(v);
  }
}

AcquireResult Residency::acquire(int64_t record, DType kind, AccessKind access) {
  const int64_t key = key_of(record, kind);
  const bool demand = access == AccessKind::demand;
  ++clock_;
  AcquireResult r;
  int32_t slot = slot_of_key_[key];
  if (slot >= 0) {
    Slot& s = slots_[slot];
    r.slot = slot;
    r.status = s.state == SlotState::resident ? AcquireStatus::hit : AcquireStatus::pending;
    if (!demand) {
      ++counters_.prefetch_already;
      return r;
    }
    ++(r.status == AcquireStatus::hit ? counters_.hits : counters_.pending);
    if (s.speculative) {
      // A demand access confirms the prediction: the record joins the demand partition and
      // has its first real access now.
      s.speculative = false;
      --n_speculative_;
      r.confirmed_prefetch = true;
      ++counters_.prefetch_confirmed;
      policy_->on_fill(slot, key, clock_);
    } else {
      policy_->on_hit(slot, key, clock_);
    }
    ++s.pins;
    if (r.confirmed_prefetch && !in_step_) rebalance();
    return r;
  }
  slot = reserve(key, !demand, r);
  if (slot < 0) {
    ++(demand ? counters_.no_slot : counters_.prefetch_refused);
    r = AcquireResult{};
    return r;
  }
  r.status = AcquireStatus::miss;
  r.slot = slot;
  if (demand) {
    ++counters_.misses;
    ++slots_[slot].pins;
    policy_->on_fill(slot, key, clock_);
  } else {
    ++counters_.prefetch_issued;
  }
  return r;
}

void Residency::acquire_step(std::span<const int64_t> records, DType kind, std::span<AcquireResult> results) {
  SLUICE_ASSERT(records.size() == results.size());
  note_step(records);
  // Every record of the step already present is pinned before a confirmation may evict.
  in_step_ = true;
  for (size_t i = 0; i < records.size(); ++i)
    if (find(records[i], kind) >= 0) results[i] = acquire(records[i], kind);
  in_step_ = false;
  rebalance();
  for (size_t i = 0; i < records.size(); ++i)
    if (find(records[i], kind) < 0) results[i] = acquire(records[i], kind);
}

void Residency::complete_load(int32_t slot) {
  SLUICE_ASSERT(slot >= 0 && slot < n_slots() && slots_[slot].state == SlotState::loading);
  slots_[slot].state = SlotState::resident;
}

void Residency::fail_load(int32_t slot) {
  SLUICE_ASSERT(slot >= 0 && slot < n_slots() && slots_[slot].state == SlotState::loading);
  clear(slot);
}

void Residency::pin(int32_t slot) {
  SLUICE_ASSERT(slot >= 0 && slot < n_slots() && slots_[slot].state != SlotState::free);
  ++slots_[slot].pins;
}

void Residency::release(int32_t slot) {
  SLUICE_ASSERT(slot >= 0 && slot < n_slots() && slots_[slot].pins > 0);
  --slots_[slot].pins;
}

void Residency::check_invariants() const {
  int32_t n_free = 0, n_spec = 0;
  for (int32_t i = 0; i < n_slots(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == SlotState::free) {
      ++n_free;
      SLUICE_ASSERT(s.key < 0 && s.pins == 0 && !s.speculative);
      continue;
    }
    SLUICE_ASSERT(s.key >= 0 && s.pins >= 0);
    SLUICE_ASSERT(slot_of_key_[s.key] == i);
    if (s.speculative) ++n_spec;
  }
  int64_t n_keys = 0;
  for (size_t k = 0; k < slot_of_key_.size(); ++k) {
    if (slot_of_key_[k] < 0) continue;
    ++n_keys;
    SLUICE_ASSERT(slots_[slot_of_key_[k]].key == static_cast<int64_t>(k));
  }
  SLUICE_ASSERT(n_free == n_free_ && n_spec == n_speculative_);
  SLUICE_ASSERT(n_keys == n_slots() - n_free);
  SLUICE_ASSERT(n_speculative_ <= speculative_capacity_);
}

}  // namespace sluice
