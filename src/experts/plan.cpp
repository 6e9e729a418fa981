// The one planner of the streaming providers: options, cache layout, step unions, row
// groups, predictions, acquire counting, a step's decisions (StepPlan) and prefetches.
#include "experts/plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"

namespace sluice {

void check_streaming_options(const Pack& pack, DType kind, int64_t top_k, const StreamerOptions& opt) {
  const PackManifest& m = pack.manifest();
  pack.kind(kind);  // an error naming the kinds the pack has
  SLUICE_CHECK(opt.enabled(), Status::invalid_argument, "expert streaming needs --expert-cache SIZE or --expert-slots N");
  SLUICE_CHECK(top_k >= 1 && top_k <= m.n_expert, Status::invalid_argument, "expert streaming: top-k ", top_k,
               " is outside [1, ", m.n_expert, "] experts per layer");
  if (opt.miss_kind) {
    pack.kind(*opt.miss_kind);
    SLUICE_CHECK(*opt.miss_kind != kind, Status::invalid_argument, "--miss-kind ", expert_kind_name(*opt.miss_kind),
                 " is the kind the run already uses (pick a lower-bit kind the pack holds, such as q2)");
  }
  SLUICE_CHECK(opt.cut >= 0 && opt.cut <= 1, Status::invalid_argument, "--cut ", opt.cut,
               " is outside [0, 1] (a routing weight; 0 turns the deadline off)");
  SLUICE_CHECK(opt.cut_share >= 0 && opt.cut_share <= 1, Status::invalid_argument, "the relative cut ", opt.cut_share,
               " is outside [0, 1] (a share of the uniform routing weight)");
}

uint64_t streaming_slot_bytes(const Pack& pack, DType kind, std::optional<DType> miss_kind) {
  uint64_t b = pack.kind(kind).record_stride;
  if (miss_kind) b = std::max(b, pack.kind(*miss_kind).record_stride);
  return b;
}

CacheLayout plan_cache_layout(const Pack& pack, int64_t top_k, uint64_t slot_bytes, const StreamerOptions& opt) {
  const PackManifest& m = pack.manifest();
  const int64_t min = top_k;
  int64_t n_slots = opt.slots > 0 ? opt.slots : static_cast<int64_t>(opt.cache_bytes / slot_bytes);
  if (n_slots < min) {
    const std::string asked = opt.slots > 0 ? str(opt.slots, opt.slots == 1 ? " slot" : " slots")
                                            : str(byte_size_text(opt.cache_bytes), " (", n_slots, " slots of ",
                                                  byte_size_text(slot_bytes), ")");
    fail(Status::invalid_argument, "expert cache too small: ", asked, "; the model routes each token to ", top_k,
         " experts, so the minimum is ", min, " slots (--expert-slots ", min, " or --expert-cache ",
         byte_size_text(static_cast<uint64_t>(min) * slot_bytes), ")");
  }
  // More slots than records of the kinds in use cannot be filled.
  const int64_t n_useful = m.n_records() * (opt.miss_kind ? 2 : 1);
  if (n_slots > n_useful) {
    LOG_INFO("expert cache: ", n_slots, " slots asked for, the pack has ", n_useful, " records to cache; using ", n_useful);
    n_slots = n_useful;
  }
  SLUICE_CHECK(n_slots <= (int64_t{1} << 30), Status::invalid_argument, "expert cache: ", n_slots, " slots is too many");
  CacheLayout c;
  c.n_slots = static_cast<int32_t>(n_slots);
  c.speculative_slots = opt.lookahead ? speculative_share(n_slots, top_k) : 0;
  if (opt.host_cache_bytes > 0) {
    const uint64_t n_host = std::min<uint64_t>(opt.host_cache_bytes / slot_bytes, static_cast<uint64_t>(n_useful));
    SLUICE_CHECK(n_host >= 1, Status::invalid_argument, "--host-cache ", byte_size_text(opt.host_cache_bytes),
                 " holds no record (one takes ", byte_size_text(slot_bytes), ")");
    c.host_slots = static_cast<int32_t>(n_host);
  }
  return c;
}

int32_t speculative_share(int64_t n_slots, int64_t top_k) {
  if (n_slots - top_k <= 0) return 0;
  return static_cast<int32_t>(std::clamp<int64_t>(std::min<int64_t>(2 * top_k, n_slots / 4), 1, n_slots - top_k));
}

std::vector<StepExpert> step_union(std::span<const int32_t> ids, std::span<const float> weights, int64_t k,
                                   int64_t row0, int64_t row1, int64_t moe_layer, int64_t n_expert) {
  std::vector<StepExpert> out;
  std::vector<int32_t> index(static_cast<size_t>(n_expert), -1);
  float row_sum = 0;  // the top-k weight of the row of pair p
  for (int64_t p = row0 * k; p < row1 * k; ++p) {
    const int32_t e = ids[static_cast<size_t>(p)];
    const float w = weights[static_cast<size_t>(p)];
    if (p % k == 0) {
      row_sum = 0;
      for (int64_t q = p; q < p + k; ++q) row_sum += weights[static_cast<size_t>(q)];
    }
    const float share = row_sum > 0 ? w * static_cast<float>(k) / row_sum : 1.0f;
    SLUICE_CHECK(e >= 0 && e < n_expert, Status::internal, "expert streaming: routed expert ", e, " outside [0, ",
                 n_expert, ")");
    int32_t& i = index[static_cast<size_t>(e)];
    if (i < 0) {
      i = static_cast<int32_t>(out.size());
      StepExpert s;
      s.expert = e;
      s.record = moe_layer * n_expert + e;
      s.best = w;
      s.best_share = share;
      out.push_back(std::move(s));
    }
    StepExpert& se = out[static_cast<size_t>(i)];
    se.pairs.push_back(static_cast<int32_t>(p));
    se.best = std::max(se.best, w);
    se.best_share = std::max(se.best_share, share);
  }
  std::stable_sort(out.begin(), out.end(), [](const StepExpert& a, const StepExpert& b) { return a.best > b.best; });
  return out;
}

int64_t row_group_end(std::span<const int32_t> ids, int64_t k, int64_t row0, int64_t n_rows, int64_t n_slots,
                      int64_t n_expert) {
  std::vector<uint8_t> seen(static_cast<size_t>(n_expert), 0);
  int64_t distinct = 0, row1 = row0;
  while (row1 < n_rows) {
    int64_t added = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[static_cast<size_t>(row1 * k + j)];
      if (!seen[static_cast<size_t>(e)]) {
        bool dup = false;
        for (int64_t i = 0; i < j; ++i) dup |= ids[static_cast<size_t>(row1 * k + i)] == e;
        added += dup ? 0 : 1;
      }
    }
    if (row1 > row0 && distinct + added > n_slots) break;
    for (int64_t j = 0; j < k; ++j) seen[static_cast<size_t>(ids[static_cast<size_t>(row1 * k + j)])] = 1;
    distinct += added;
    ++row1;
  }
  return row1;
}

std::vector<std::pair<float, int32_t>> predicted_union(std::span<const int32_t> ids, std::span<const float> weights,
                                                       int64_t n_expert) {
  std::vector<std::pair<float, int32_t>> order;
  std::vector<int32_t> index(static_cast<size_t>(n_expert), -1);
  for (size_t p = 0; p < ids.size(); ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= n_expert) continue;
    int32_t& i = index[static_cast<size_t>(e)];
    if (i < 0) {
      i = static_cast<int32_t>(order.size());
      order.emplace_back(weights[p], e);
    }
    order[static_cast<size_t>(i)].first = std::max(order[static_cast<size_t>(i)].first, weights[p]);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return order;
}

void count_demand_acquire(LayerStats& ls, const AcquireResult& a, uint64_t stride) {
  if (a.confirmed_prefetch) ++ls.prefetch_hits;
  if (a.status == AcquireStatus::hit || a.status == AcquireStatus::pending) {
    ++ls.hits;
    if (a.status == AcquireStatus::pending) ++ls.pending_hits;
  } else {
    ++ls.misses;
    ls.bytes_demand += stride;
  }
}

bool slot_holds(const Residency& res, int32_t slot, int64_t record, DType kind) {
  return slot >= 0 && res.state(slot) == SlotState::resident && res.record(slot) == record && res.kind(slot) == kind;
}

StepPlan::StepPlan(Residency& residency, const Pack& pack, const StreamerOptions& opt, DType kind,
                   int64_t moe_layer, bool deadline, std::chrono::milliseconds stall_limit)
    : res_(residency), pack_(pack), opt_(opt), kind_(kind), moe_layer_(moe_layer),
      deadline_(deadline && (opt.cuts() || opt.miss_kind.has_value())), stall_limit_(stall_limit) {}

void StepPlan::set_union(std::span<const int32_t> ids, std::span<const float> weights, int64_t k, int64_t row0,
                         int64_t row1, int64_t n_expert) {
  experts.clear();
  for (StepExpert& se : step_union(ids, weights, k, row0, row1, moe_layer_, n_expert)) {
    PlannedExpert w;
    static_cast<StepExpert&>(w) = std::move(se);
    experts.push_back(std::move(w));
  }
}

void StepPlan::acquire_and_read(StepFills& fills, LayerStats& ls, std::vector<int32_t>& pins) {
  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> records(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) records[i] = experts[i].record;
  std::vector<AcquireResult> acq(experts.size());
  res_.acquire_step(records, kind_, acq);
  for (const AcquireResult& a : acq)
    if (a.status != AcquireStatus::no_slot) pins.push_back(a.slot);
  // No slot: every other slot is loading (prefetches, background reads of cut experts). They
  // land (or fail) within the IO timeout; then retry.
  auto since = Clock::now();
  for (;;) {
    bool missing = false;
    for (size_t i = 0; i < experts.size(); ++i) {
      if (acq[i].status != AcquireStatus::no_slot) continue;
      acq[i] = res_.acquire(records[i], kind_);
      if (acq[i].status == AcquireStatus::no_slot) missing = true;
      else pins.push_back(acq[i].slot);
    }
    if (!missing) break;
    SLUICE_CHECK(fills.in_flight(), Status::internal, "expert cache: no slot for MoE layer ", moe_layer_,
                 " and nothing loading (", res_.n_slots(), " slots, ", experts.size(), " experts in the step)");
    if (fills.make_progress() > 0) since = Clock::now();
    SLUICE_CHECK(Clock::now() - since < stall_limit_, Status::timeout, "expert cache: MoE layer ", moe_layer_,
                 " waited ", std::chrono::duration<double>(stall_limit_).count(), " s for a free slot");
  }

  const uint64_t stride = pack_.kind(kind_).record_stride;
  std::vector<size_t> read_later;
  for (size_t i = 0; i < experts.size(); ++i) {
    PlannedExpert& w = experts[i];
    const AcquireResult& a = acq[i];
    w.status = a.status;
    w.slot = a.slot;
    count_demand_acquire(ls, a, stride);
    // --miss-kind alone: any late miss may take its low-bit copy; with a cut, the weak ones.
    if (deadline_ && a.status != AcquireStatus::hit)
      w.cut_if_late = opt_.cut > 0         ? w.best < opt_.cut
                      : opt_.cut_share > 0 ? w.best_share < opt_.cut_share
                                           : true;
    if (a.status != AcquireStatus::miss) continue;
    if (w.cut_if_late) {
      read_later.push_back(i);
      continue;
    }
    if (fills.start_fill(a, w.record, kind_, IoPriority::demand)) ++ls.host_hits;
  }
  if (deadline_ && opt_.miss_kind) {
    const DType lk = *opt_.miss_kind;
    const uint64_t low_stride = pack_.kind(lk).record_stride;
    for (PlannedExpert& w : experts) {
      if (!w.cut_if_late) continue;
      const AcquireResult a = res_.acquire(w.record, lk);
      if (a.status == AcquireStatus::no_slot) continue;  // best effort: the main copy is coming
      pins.push_back(a.slot);
      w.low_slot = a.slot;
      if (a.status == AcquireStatus::miss) {
        ++ls.low_bit_reads;
        ls.bytes_demand += low_stride;
        fills.start_fill(a, w.record, lk, IoPriority::demand);
      }
    }
  }
  for (size_t i : read_later)
    if (fills.start_fill(acq[i], experts[i].record, kind_, IoPriority::demand)) ++ls.host_hits;
}

bool StepPlan::in_phase1(const PlannedExpert& w) const {
  return slot_holds(res_, w.slot, w.record, kind_) && !(w.cut_if_late && opt_.deadline_worst_case);
}

void StepPlan::decide_deadline(LayerStats& ls, const std::function<void(const PlannedExpert&)>& wait_low) {
  if (!deadline_) return;
  for (auto it = experts.rbegin(); it != experts.rend(); ++it) {  // weakest first
    PlannedExpert& w = *it;
    if (w.done || !w.cut_if_late) continue;
    if (!opt_.deadline_worst_case && slot_holds(res_, w.slot, w.record, kind_)) continue;  // landed in time
    if (w.low_slot >= 0 && opt_.deadline_worst_case) wait_low(w);
    if (w.low_slot >= 0 && slot_holds(res_, w.low_slot, w.record, *opt_.miss_kind)) {
      take(w, ReadyCopy::low, ls);
    } else if (opt_.cuts()) {
      w.dropped = w.done = true;
      ++ls.cut;
    }
  }
}

ReadyCopy StepPlan::ready(const PlannedExpert& w, bool decided) const {
  if (w.done) return ReadyCopy::none;
  if (w.cut_if_late && !decided && opt_.deadline_worst_case) return ReadyCopy::none;  // late until the deadline
  if (slot_holds(res_, w.slot, w.record, kind_)) return ReadyCopy::main;
  // A candidate takes whichever copy lands first once the deadline has passed.
  if (decided && w.cut_if_late && w.low_slot >= 0 && slot_holds(res_, w.low_slot, w.record, *opt_.miss_kind))
    return ReadyCopy::low;
  return ReadyCopy::none;
}

void StepPlan::take(PlannedExpert& w, ReadyCopy copy, LayerStats& ls) {
  SLUICE_ASSERT(copy != ReadyCopy::none && !w.done);
  w.done = true;
  if (copy == ReadyCopy::low) {
    w.low = true;
    ++ls.cut;
    ++ls.low_bit;
  }
}

void plan_prefetch(Residency& residency, const Pack& pack, DType kind, int64_t next_layer, int64_t n_expert,
                   std::span<const std::pair<float, int32_t>> order, StepFills& fills, LayerStats& next) {
  const uint64_t stride = pack.kind(kind).record_stride;
  // The whole prediction goes to the policy first (a prediction-aware policy protects these
  // records from demand evictions), even the part the share has no room to prefetch.
  std::vector<int64_t> predicted;
  predicted.reserve(order.size());
  for (const auto& [weight, e] : order) predicted.push_back(next_layer * n_expert + e);
  residency.note_prediction(predicted);
  for (const auto& [weight, e] : order) {
    const int64_t record = next_layer * n_expert + e;
    const AcquireResult a = residency.acquire(record, kind, AccessKind::prefetch);
    if (a.status == AcquireStatus::no_slot) break;  // the speculative share is full of fills in flight
    if (a.status != AcquireStatus::miss) {
      ++next.prefetch_already;
      continue;
    }
    ++next.prefetch_requests;
    next.bytes_prefetch += stride;
    if (fills.start_fill(a, record, kind, IoPriority::prefetch)) ++next.host_hits;
  }
}

}  // namespace sluice
