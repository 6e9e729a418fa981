// The one planner of expert streaming (DESIGN.md, "The streamed decode step", steps 1-6),
// shared by the CPU streamer (experts/streamer.h) and the CUDA streamer
// (experts/cuda/cuda_streamer.h): the cache's size, a step's union strongest first, row
// groups whose union fits the cache, and StepPlan, which makes every decision of a step
// (hits pinned first, misses reserving slots strongest first, the read order, which misses a
// deadline may cut and their low-bit copies, what phase 1 computes, what is cut at the
// deadline, which copy phase 2 takes) and lookahead's prefetches into the speculative share.
// The streamers only move bytes and compute: they start fills when the plan asks (StepFills)
// and publish or run what it decided. Nothing here knows about memory, IO or compute.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "experts/io_engine.h"
#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/streamer_options.h"
#include "format/pack.h"

namespace sluice {

// Checks the options that do not depend on memory (top-k range, --miss-kind against the
// pack, --cut range); throws invalid_argument naming the option.
void check_streaming_options(const Pack& pack, DType kind, int64_t top_k, const StreamerOptions& opt);

// The slot size for these kinds of this pack: the largest record stride.
uint64_t streaming_slot_bytes(const Pack& pack, DType kind, std::optional<DType> miss_kind);

struct CacheLayout {
  int32_t n_slots = 0;
  int32_t speculative_slots = 0;  // lookahead's share (0 without lookahead)
  int32_t host_slots = 0;         // records the host tier holds (0: no tier)
};
// Slots from --expert-slots, else as many whole slots as --expert-cache holds; capped at the
// records of the kinds in use; fewer than top_k is an invalid_argument error that states the
// minimum (as slots and as bytes). With lookahead, the speculative share is speculative_share's.
CacheLayout plan_cache_layout(const Pack& pack, int64_t top_k, uint64_t slot_bytes, const StreamerOptions& opt);
// Lookahead's speculative share of a cache of n_slots (plan_cache_layout's, and sluice
// simulate --lookahead's): two steps' predictions (2 top_k) but at most a quarter of the cache,
// at least one slot, always leaving top_k slots beside it; 0 when the cache holds no more than
// top_k. Chosen on the trained models' traces (docs/policy.md, "The speculative share"): a
// larger share keeps stale predictions in room the demand needs (a quarter at every size was
// the rule before 2026-12-05; up to 0.02 lower demand hit rates, more bytes read).
int32_t speculative_share(int64_t n_slots, int64_t top_k);

// One distinct expert of a step (the rows [row0, row1) of a MoE layer call).
struct StepExpert {
  int32_t expert = 0;
  int64_t record = 0;           // moe_layer * n_expert + expert
  float best = 0;               // its largest routing weight in the group
  float best_share = 0;         // its largest weight x k / its row's top-k weight (1: uniform)
  std::vector<int32_t> pairs;   // pair indices (row * k + rank), ascending
};
// The union of the experts of rows [row0, row1), strongest routing weight first (ties: first
// seen). ids/weights [rows * k], as Routing.
std::vector<StepExpert> step_union(std::span<const int32_t> ids, std::span<const float> weights, int64_t k,
                                   int64_t row0, int64_t row1, int64_t moe_layer, int64_t n_expert);

// The end of the row group starting at row0: consecutive rows whose union of experts fits
// n_slots (at least one row).
int64_t row_group_end(std::span<const int32_t> ids, int64_t k, int64_t row0, int64_t n_rows, int64_t n_slots,
                      int64_t n_expert);

// Lookahead: the predicted experts of the next layer (ids/weights of the prediction's top-k
// over its rows), each once with its best weight, strongest first.
std::vector<std::pair<float, int32_t>> predicted_union(std::span<const int32_t> ids, std::span<const float> weights,
                                                       int64_t n_expert);

// Counts a demand acquire of a step's expert into the layer's statistics: hit (resident or
// pending), or miss with its bytes (stride of the kind read).
void count_demand_acquire(LayerStats& ls, const AcquireResult& a, uint64_t stride);

// True when `slot` holds (record, kind) and its bytes are there.
bool slot_holds(const Residency& res, int32_t slot, int64_t record, DType kind);

// What a streamer does for the plan: the memory and IO side of its decisions.
class StepFills {
 public:
  virtual ~StepFills() = default;
  // Slot a.slot, reserved for (record, kind) and loading, gets its bytes: true when they are
  // there at once (the host tier held them), false when a read went out.
  virtual bool start_fill(const AcquireResult& a, int64_t record, DType kind, IoPriority priority) = 0;
  // Lands the fills that arrived, waiting a short while for one; returns how many landed.
  virtual size_t make_progress() = 0;
  // True while a fill is in flight (so a slot may still free up).
  virtual bool in_flight() const = 0;
};

// One distinct expert of a step and what the plan decided for it.
struct PlannedExpert : StepExpert {
  AcquireStatus status = AcquireStatus::no_slot;
  int32_t slot = -1;         // the main kind's slot
  int32_t low_slot = -1;     // the low-bit copy's slot (--miss-kind), when one was acquired
  bool cut_if_late = false;  // a miss the deadline cuts if it has not landed by then
  bool done = false;         // computed (or published), substituted or dropped
  bool low = false;          // the low-bit copy stands in for it
  bool dropped = false;      // cut: contributes nothing (the weights are never renormalized)
};

// Which copy of an expert a phase can compute now.
enum class ReadyCopy { none, main, low };

// The decisions of one step (a MoE layer's rows [row0, row1) whose union fits the cache).
class StepPlan {
 public:
  // deadline: whether --cut / --miss-kind apply to this step (the CUDA streamer's grouped
  // path for large batches runs without). stall_limit: the longest the step waits for a slot
  // with nothing landing.
  StepPlan(Residency& residency, const Pack& pack, const StreamerOptions& opt, DType kind, int64_t moe_layer,
           bool deadline, std::chrono::milliseconds stall_limit);

  // 1. The union of rows [row0, row1) (ids/weights [rows * k]), strongest first.
  void set_union(std::span<const int32_t> ids, std::span<const float> weights, int64_t k, int64_t row0, int64_t row1,
                 int64_t n_expert);
  // 2-3. Acquire: hits pinned first, then misses reserve slots strongest first (no slot: the
  // fills in flight land, then retry; an error when nothing is in flight or nothing lands for
  // stall_limit). Reads: misses strongest first, then the low-bit copies of the misses a
  // deadline may cut, then those misses. Every slot pinned goes to `pins` (the streamer
  // releases them when the step's compute retired). Counts into `ls`.
  void acquire_and_read(StepFills& fills, LayerStats& ls, std::vector<int32_t>& pins);

  // 4. Phase 1 computes this expert now: resident, and not a miss the worst-case deadline
  // measurement treats as late.
  bool in_phase1(const PlannedExpert& w) const;
  // 5. The deadline (phase 1 done): late candidates, weakest first, take their landed low-bit
  // copy (low) or, with --cut, are cut (dropped); every decision is marked done. With
  // deadline_worst_case every candidate is late and waits for its low-bit copy through
  // wait_low(w) (which returns once that copy's slot holds it, or throws).
  void decide_deadline(LayerStats& ls, const std::function<void(const PlannedExpert&)>& wait_low);
  // 6. Which copy of w can be computed now (phase 2; decided: the deadline has passed). A low
  // copy taken is counted into ls by take().
  ReadyCopy ready(const PlannedExpert& w, bool decided) const;
  void take(PlannedExpert& w, ReadyCopy copy, LayerStats& ls);
  // The slot and kind a copy lives in.
  int32_t slot_of(const PlannedExpert& w, ReadyCopy copy) const { return copy == ReadyCopy::low ? w.low_slot : w.slot; }
  DType kind_of(ReadyCopy copy) const { return copy == ReadyCopy::low ? *opt_.miss_kind : kind_; }
  bool deadline() const { return deadline_; }

  std::vector<PlannedExpert> experts;

 private:
  Residency& res_;
  const Pack& pack_;
  const StreamerOptions& opt_;
  DType kind_;
  int64_t moe_layer_;
  bool deadline_;
  std::chrono::milliseconds stall_limit_;
};

// Lookahead (step 8): the predicted experts of MoE layer next_layer (predicted_union order)
// acquired as prefetches into the speculative share behind the demand reads, until the share
// is full of fills in flight. Counts into the next layer's statistics.
void plan_prefetch(Residency& residency, const Pack& pack, DType kind, int64_t next_layer, int64_t n_expert,
                   std::span<const std::pair<float, int32_t>> order, StepFills& fills, LayerStats& next);

}  // namespace sluice
