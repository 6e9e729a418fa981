// ExpertStreamer: the routed experts of a pack served from a bounded expert cache (DESIGN.md,
// "The streamed decode step"). It owns the slots (4096-aligned host memory for the CPU
// backend, each as large as the largest record stride of the kinds in use), the residency
// (which record each slot holds, pins, eviction policy), the IO engine reading records from
// the pack's experts.<kind>.bin files, an optional host tier, and the statistics.
//
// One MoE layer call (moe()), for each group of rows whose expert union fits the cache (the
// whole batch when it fits; a decode step is one row):
//   1. the union of the group's experts, strongest routing weight first;
//   2. acquire_step: hits are pinned, misses reserve slots (evicting by policy; a victim goes
//      to the host tier when there is one); no slot -> wait for reads in flight, retry;
//   3. misses are read strongest first (from the host tier when it holds them), then with
//      --miss-kind the low-bit copies of the misses a deadline may cut, then lookahead:
//      the next MoE layer's router on this hidden state predicts its experts, read into the
//      speculative share behind the demand reads;
//   4. phase 1 computes the resident experts while the reads land;
//   5. the deadline (--cut W / --miss-kind): misses not landed whose best weight is below W
//      are cut, weakest first, replaced by a landed low-bit copy when there is one, else
//      dropped (never renormalized); their reads finish in the background;
//   6. phase 2 computes the misses as they land.
// Every decision of a step is the one planner's (experts/plan.h, StepPlan). Every expert is
// computed by expert_pairs_forward (the call's ExpertMath) on expert_view(kind, slot) over the
// rows routed to it, in pair order, and the layer's output is moe_combine in routing-rank order: what the
// cache holds, and in which order experts ran, never changes a bit of the result (without a
// cut or a low-bit substitute).
//
// Not thread-safe: one model thread calls moe(); the IO engine's thread only fills slots.
// Every wait is bounded (the IO engine's request timeout; a step waits at most twice that).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "experts/io_engine.h"
#include "experts/plan.h"
#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/stream_state.h"
#include "experts/streamer_options.h"
#include "experts/streaming_provider.h"
#include "format/pack.h"

namespace sluice {

class ExpertStreamer final : public StreamingProvider {
 public:
  // top_k: experts per token (the minimum number of slots). Throws invalid_argument for a
  // cache below the minimum (the message states it), a miss kind the pack lacks, bad options.
  ExpertStreamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k, const StreamerOptions& opt);
  ~ExpertStreamer() override;

  void moe(Backend& be, const MoeLayerCall& call) override;

  // The slot size for these kinds of this pack: the largest record stride.
  static uint64_t slot_bytes_for(const Pack& pack, DType kind, std::optional<DType> miss_kind) {
    return streaming_slot_bytes(pack, kind, miss_kind);
  }

  int32_t n_slots() const override { return st_.residency->n_slots(); }
  uint64_t slot_bytes() const override { return st_.slot_bytes; }
  DType kind() const override { return st_.kind; }
  const Residency& residency() const override { return *st_.residency; }
  const StreamerOptions& options() const override { return st_.opt; }

  RunStats stats() const override;
  void reset_stats() override;
  // Also lands background reads of cut experts and unused prefetches.
  bool drain(std::chrono::milliseconds wait) override;

 private:
  struct Read {
    int32_t slot = -1;
    int64_t record = -1;
    DType kind = DType::bf16;
  };
  struct StepClock;
  struct Fills;  // the plan's fills and waits (StepFills)

  struct Step;   // a planned sub-batch
  // Plans rows [row0, row1) of the call (steps 1-3 and lookahead): its reads go out.
  std::unique_ptr<Step> plan_step(Backend& be, const MoeLayerCall& c, int64_t row0, int64_t row1);
  // Computes a planned sub-batch (steps 4-6) into expert_out; cut pairs are marked in dropped.
  void run_step(Backend& be, const MoeLayerCall& c, Step& step, const Tensor& expert_out, std::vector<uint8_t>& dropped);
  // The longest a step waits with nothing landing.
  std::chrono::milliseconds stall_limit() const;
  void lookahead(Backend& be, const MoeLayerCall& c, int64_t row0, int64_t row1, StepFills& fills);
  // A reserved slot (state loading) gets its record: from the host tier at once (true), or
  // by a read submitted now (false).
  bool fill_slot(const AcquireResult& a, int64_t record, DType kind, IoPriority priority);
  // The residency's eviction hook: a record leaving its slot goes to the host tier.
  void keep_in_host_tier(int32_t slot, int64_t record, DType kind);
  void submit_read(int32_t slot, int64_t record, DType kind, IoPriority priority);
  // Lands the completions that arrive within `wait`; returns how many. Throws for a failed
  // or corrupt read, naming the record.
  size_t land(std::chrono::milliseconds wait);
  uint8_t* slot_ptr(int32_t slot) const { return slot_mem_->data() + static_cast<uint64_t>(slot) * st_.slot_bytes; }

  // The memory comes first: it outlives the IO engine (in st_), whose reads write into it.
  std::unique_ptr<AlignedBuffer> slot_mem_;  // [n_slots * slot_bytes]
  std::unique_ptr<AlignedBuffer> host_mem_;  // the host tier: records evicted from the slots
  StreamState st_;
  std::unordered_map<uint64_t, Read> reads_;  // in flight, by tag
  uint64_t next_tag_ = 1;
};

}  // namespace sluice
