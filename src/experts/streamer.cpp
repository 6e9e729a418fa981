// ExpertStreamer: the streamed MoE step (plan, acquire, read, phase 1, deadline, phase 2),
// lookahead prefetch, the host tier and the statistics.
#include "experts/streamer.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/units.h"
#include "experts/expert_math.h"
#include "experts/routing.h"

namespace sluice {

using Clock = std::chrono::steady_clock;

namespace {

// A wait for reads polls in slices of this length (each slice ends early when a read lands),
// so that a step notices a stall and can give up with an error.
constexpr auto kPollSlice = std::chrono::milliseconds(50);

// Releases the pins a step took, also when the step throws. Never throws itself.
struct PinGuard {
  Residency& res;
  std::vector<int32_t> slots;
  ~PinGuard() {
    for (int32_t s : slots)
      if (res.state(s) != SlotState::free && res.pins(s) > 0) res.release(s);
  }
};

}  // namespace

// Wall and thread-CPU time of a step, split into the streamer's own work (service), expert
// compute and waits for reads.
struct ExpertStreamer::StepClock {
  Clock::time_point wall0 = Clock::now();
  double cpu0 = thread_cpu_seconds();
  double compute_wall = 0, compute_cpu = 0, wait_wall = 0, wait_cpu = 0;

  template <typename Fn>
  void compute(Fn&& fn) {
    const auto w = Clock::now();
    const double c = thread_cpu_seconds();
    fn();
    compute_wall += std::chrono::duration<double>(Clock::now() - w).count();
    compute_cpu += thread_cpu_seconds() - c;
  }
  // Runs a wait; returns its wall seconds.
  template <typename Fn>
  double wait(Fn&& fn) {
    const auto w = Clock::now();
    const double c = thread_cpu_seconds();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - w).count();
    wait_wall += s;
    wait_cpu += thread_cpu_seconds() - c;
    return s;
  }
  void finish(LayerStats& ls) const {
    const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
    const double cpu = thread_cpu_seconds() - cpu0;
    ls.service_wall_seconds += std::max(0.0, wall - compute_wall - wait_wall);
    ls.service_cpu_seconds += std::max(0.0, cpu - compute_cpu - wait_cpu);
    ls.compute_seconds += compute_wall;
  }
};

ExpertStreamer::ExpertStreamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k,
                               const StreamerOptions& opt)
    // An evicted record's bytes are still in its slot: the host tier keeps them.
    : st_(std::move(pack), kind, top_k, opt,
          [this](int32_t slot, int64_t record, DType k) { keep_in_host_tier(slot, record, k); }) {
  slot_mem_ = std::make_unique<AlignedBuffer>(static_cast<uint64_t>(st_.layout.n_slots) * st_.slot_bytes);
  if (st_.host) host_mem_ = std::make_unique<AlignedBuffer>(static_cast<uint64_t>(st_.host->n_slots()) * st_.slot_bytes);
  if (st_.opt.lookahead && st_.layout.speculative_slots == 0)
    LOG_WARN("--lookahead needs more slots than the ", st_.top_k, " of one token; prefetching is off");
  LOG_INFO("expert streaming: ", st_.layout.n_slots, " slots of ", byte_size_text(st_.slot_bytes), " (",
           expert_kind_name(st_.kind),
           st_.opt.miss_kind ? str(", misses may use ", expert_kind_name(*st_.opt.miss_kind)) : std::string(), "), ",
           st_.layout.speculative_slots, " speculative, policy ", policy_name(st_.opt.policy), ", ",
           st_.io->file_is_direct(st_.files.at(st_.kind)) ? "O_DIRECT" : "buffered", " reads, depth ", st_.opt.io_depth,
           st_.io->uses_io_uring() ? " (io_uring)" : " (pread threads)",
           st_.host ? str(", host tier of ", st_.host->n_slots(), " records") : std::string());
}

ExpertStreamer::~ExpertStreamer() {
  // Reads in flight write into the slots: the slot memory may go only once they are done.
  bool drained = true;
  try {
    drained = st_.io->drain(st_.opt.io_timeout);
  } catch (...) {
    drained = false;
  }
  st_.io.reset();
  if (!drained) {
    LOG_ERROR("expert streamer: reads still in flight at shutdown; leaving their memory allocated");
    (void)slot_mem_.release();
  }
}

void ExpertStreamer::submit_read(int32_t slot, int64_t record, DType kind, IoPriority priority) {
  const ReadRequest q = st_.read_request(record, kind, slot_ptr(slot), next_tag_++, priority);
  reads_[q.tag] = Read{slot, record, kind};
  try {
    st_.io->submit(q);
  } catch (...) {
    reads_.erase(q.tag);
    st_.residency->fail_load(slot);
    throw;
  }
}

void ExpertStreamer::keep_in_host_tier(int32_t slot, int64_t record, DType kind) {
  if (!st_.host || st_.host->find(record, kind) >= 0) return;
  AcquireResult h = st_.host->acquire(record, kind);
  if (h.status == AcquireStatus::miss) {
    std::memcpy(host_mem_->data() + static_cast<uint64_t>(h.slot) * st_.slot_bytes, slot_ptr(slot),
                st_.pack->kind(kind).record_stride);
    st_.host->complete_load(h.slot);
  }
  if (h.slot >= 0) st_.host->release(h.slot);
}

bool ExpertStreamer::fill_slot(const AcquireResult& a, int64_t record, DType kind, IoPriority priority) {
  if (st_.opt.fake_experts) {  // the slot keeps whatever it holds (--fake-experts)
    st_.residency->complete_load(a.slot);
    return false;
  }
  if (st_.host) {
    const int32_t hs = st_.host->find(record, kind);
    if (hs >= 0) {
      AcquireResult h = st_.host->acquire(record, kind);  // a hit: counts as an access for the policy
      std::memcpy(slot_ptr(a.slot), host_mem_->data() + static_cast<uint64_t>(hs) * st_.slot_bytes,
                  st_.pack->kind(kind).record_stride);
      st_.host->release(h.slot);
      st_.residency->complete_load(a.slot);
      return true;
    }
  }
  submit_read(a.slot, record, kind, priority);
  return false;
}

size_t ExpertStreamer::land(std::chrono::milliseconds wait) {
  std::vector<ReadCompletion> done;
  st_.io->poll(done, wait);
  std::optional<Error> first;
  for (const ReadCompletion& c : done) {
    const std::optional<Read> read = take_in_flight(reads_, c.tag);
    if (!read) continue;
    const Read& rd = *read;
    if (std::optional<Error> bad = st_.landed_error(c, rd.record, rd.kind, slot_ptr(rd.slot))) {
      st_.residency->fail_load(rd.slot);
      if (!first) first = std::move(bad);
      continue;
    }
    st_.residency->complete_load(rd.slot);
  }
  if (first) throw *first;
  return done.size();
}

bool ExpertStreamer::drain(std::chrono::milliseconds wait) {
  const auto until = Clock::now() + wait;
  while (!reads_.empty()) {
    const auto now = Clock::now();
    if (now >= until) return false;
    land(std::min(kPollSlice, std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
                                  std::chrono::milliseconds(1)));
  }
  return true;
}

// The CPU side of the plan's decisions: fills land in host slots, and waits run on this
// thread, counted as demand waits of the step.
struct ExpertStreamer::Fills final : StepFills {
  ExpertStreamer& s;
  StepClock& clock;
  LayerStats& ls;
  Fills(ExpertStreamer& streamer, StepClock& c, LayerStats& l) : s(streamer), clock(c), ls(l) {}
  bool start_fill(const AcquireResult& a, int64_t record, DType kind, IoPriority priority) override {
    return s.fill_slot(a, record, kind, priority);
  }
  size_t make_progress() override {
    if (s.reads_.empty()) return 0;
    size_t landed = 0;
    ls.demand_wait_seconds += clock.wait([&] { landed = s.land(kPollSlice); });
    return landed;
  }
  bool in_flight() const override { return !s.reads_.empty(); }
};

// A planned sub-batch: its decisions and the pins that protect its slots until it retired.
struct ExpertStreamer::Step {
  StepPlan plan;
  PinGuard pins;
  int64_t row0, row1;
  Step(ExpertStreamer& s, int64_t L, int64_t r0, int64_t r1)
      : plan(*s.st_.residency, *s.st_.pack, s.st_.opt, s.st_.kind, L, /*deadline=*/true, s.stall_limit()),
        pins{*s.st_.residency, {}}, row0(r0), row1(r1) {}
};

void ExpertStreamer::moe(Backend& be, const MoeLayerCall& c) {
  SLUICE_CHECK(c.routing && c.router, Status::internal, "expert streamer: a MoE call without its routing");
  const Routing& r = *c.routing;
  const int64_t n = r.n_rows, k = r.k, d = c.h.cols();
  SLUICE_CHECK(c.moe_layer >= 0 && c.moe_layer < st_.n_layers, Status::internal, "expert streamer: MoE layer ",
               c.moe_layer, " outside the pack's ", st_.n_layers);
  SLUICE_CHECK(k <= n_slots(), Status::invalid_argument, "expert cache: ", n_slots(), " slots cannot hold the ", k,
               " experts of one token");
  for (int32_t e : r.ids)
    SLUICE_CHECK(e >= 0 && e < st_.n_expert, Status::internal, "expert streamer: routed expert ", e, " outside [0, ", st_.n_expert, ")");
  Tensor expert_out = be.alloc(DType::f32, {n * k, d});  // [n*k, n_embd], row = pair
  std::vector<uint8_t> dropped(static_cast<size_t>(n * k), 0);

  // Sub-batches of consecutive rows whose expert union fits the cache: the whole batch when it
  // fits (always for a decode step), fewer rows otherwise (a long prefill on a small cache).
  // With two banks (StreamerOptions::prefill_banks; a cache of at least 2 x top_k slots, no
  // --miss-kind copies pinned beside the misses) each sub-batch's union fits half the cache, and sub-batch i+1 is planned and
  // its reads issued before sub-batch i computes: i's pins protect its slots, and the two
  // unions fit the cache together, so i+1's acquire always finds room once reads land. With
  // one bank, i retires before i+1 is planned.
  const int64_t slots = n_slots();
  const bool split = row_group_end(r.ids, k, 0, n, slots, st_.n_expert) < n;
  const bool two_banks = split && slots >= 2 * k && !st_.opt.miss_kind && st_.opt.prefill_banks >= 2;
  const int64_t budget = two_banks ? slots / 2 : slots;
  std::unique_ptr<Step> cur = plan_step(be, c, 0, row_group_end(r.ids, k, 0, n, budget, st_.n_expert));
  while (cur) {
    std::unique_ptr<Step> next;
    const int64_t row1 = cur->row1;
    if (two_banks && row1 < n) {
      next = plan_step(be, c, row1, row_group_end(r.ids, k, row1, n, budget, st_.n_expert));
      ++st_.layer_stats(c.moe_layer, c.phase).overlapped;
    }
    run_step(be, c, *cur, expert_out, dropped);
    cur.reset();  // its pins go: the sub-batch retired
    if (!next && row1 < n) next = plan_step(be, c, row1, row_group_end(r.ids, k, row1, n, budget, st_.n_expert));
    cur = std::move(next);
  }
  // A cut expert contributes nothing; the remaining weights stay as routed.
  for (size_t p = 0; p < dropped.size(); ++p)
    if (dropped[p]) be.fill(expert_out.slice_rows(static_cast<int64_t>(p), 1), 0.0f);
  std::vector<float> ones;
  be.moe_combine(expert_out, combine_weights(c.math, r.weights, ones), k, c.out);
}

std::chrono::milliseconds ExpertStreamer::stall_limit() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(2 * st_.opt.io_timeout + std::chrono::seconds(5));
}

std::unique_ptr<ExpertStreamer::Step> ExpertStreamer::plan_step(Backend& be, const MoeLayerCall& c, int64_t row0,
                                                                int64_t row1) {
  StepClock clock;
  const Routing& r = *c.routing;
  const int64_t k = r.k, L = c.moe_layer;
  LayerStats& ls = st_.layer_stats(L, c.phase);
  ++ls.steps;
  ls.rows += static_cast<uint64_t>(row1 - row0);
  // 1-3. The union strongest first, acquire (hits pinned first), reads (experts/plan.h).
  auto step = std::make_unique<Step>(*this, L, row0, row1);
  step->plan.set_union(r.ids, r.weights, k, row0, row1, st_.n_expert);
  ls.routed += static_cast<uint64_t>((row1 - row0) * k);
  ls.unique += step->plan.experts.size();
  Fills fills(*this, clock, ls);
  step->plan.acquire_and_read(fills, ls, step->pins.slots);
  lookahead(be, c, row0, row1, fills);
  clock.finish(ls);
  return step;
}

void ExpertStreamer::run_step(Backend& be, const MoeLayerCall& c, Step& step, const Tensor& expert_out,
                              std::vector<uint8_t>& dropped) {
  StepClock clock;
  const int64_t k = c.routing->k, L = c.moe_layer;
  LayerStats& ls = st_.layer_stats(L, c.phase);
  StepPlan& plan = step.plan;
  const auto stall_limit = this->stall_limit();

  auto compute = [&](PlannedExpert& w, ReadyCopy copy) {
    plan.take(w, copy, ls);
    const ExpertWeights ew = expert_view(st_.pack->kind(plan.kind_of(copy)), slot_ptr(plan.slot_of(w, copy)));
    clock.compute([&] { expert_pairs_forward(be, c.math, ew, c.h, w.pairs, k, c.routing->weights, expert_out); });
  };
  // Waits for reads; throws when none landed for the stall limit.
  auto since = Clock::now();
  auto wait_for_reads = [&](bool demand) {
    size_t landed = 0;
    const double s = clock.wait([&] { landed = land(kPollSlice); });
    (demand ? ls.demand_wait_seconds : ls.prefetch_wait_seconds) += s;
    if (landed) since = Clock::now();
    SLUICE_CHECK(Clock::now() - since < stall_limit, Status::timeout, "MoE layer ", L, " (model layer ",
                 st_.pack->manifest().moe_layers[static_cast<size_t>(L)], "): no expert read landed for ",
                 std::chrono::duration<double>(stall_limit).count(), " s (", reads_.size(), " reads in flight)");
  };

  // 4. Phase 1: the experts resident now (hits, and misses the host tier answered).
  for (PlannedExpert& w : plan.experts) {
    if (!plan.in_phase1(w)) continue;
    compute(w, ReadyCopy::main);
    land(std::chrono::milliseconds(0));
  }

  since = Clock::now();
  // 5. The deadline: late candidates take their landed low-bit copy or are cut (their reads
  // finish in the background and join the cache).
  if (plan.deadline()) {
    land(std::chrono::milliseconds(0));
    plan.decide_deadline(ls, [&](const PlannedExpert& w) {
      while (!slot_holds(*st_.residency, w.low_slot, w.record, *st_.opt.miss_kind)) wait_for_reads(true);
    });
    for (PlannedExpert& w : plan.experts) {
      if (w.dropped) {
        for (int32_t p : w.pairs) dropped[static_cast<size_t>(p)] = 1;
      } else if (w.low) {
        const ExpertWeights ew = expert_view(st_.pack->kind(*st_.opt.miss_kind), slot_ptr(w.low_slot));
        clock.compute([&] { expert_pairs_forward(be, c.math, ew, c.h, w.pairs, k, c.routing->weights, expert_out); });
      }
    }
  }

  // 6. Phase 2: the rest as they land (a --miss-kind candidate takes whichever copy lands
  // first).
  for (;;) {
    bool progress = false, all_done = true, demand = false;
    for (PlannedExpert& w : plan.experts) {
      if (w.done) continue;
      const ReadyCopy copy = plan.ready(w, /*decided=*/true);
      if (copy != ReadyCopy::none) {
        compute(w, copy);
        progress = true;
      } else {
        all_done = false;
        demand |= w.status == AcquireStatus::miss;
      }
    }
    if (all_done) break;
    if (!progress) wait_for_reads(demand);
    else land(std::chrono::milliseconds(0));
  }
  clock.finish(ls);
}

void ExpertStreamer::lookahead(Backend& be, const MoeLayerCall& c, int64_t row0, int64_t row1, StepFills& fills) {
  const int64_t L = c.moe_layer;
  if (!st_.opt.lookahead || c.next_router.empty() || L + 1 >= st_.n_layers || st_.residency->speculative_capacity() == 0)
    return;
  const auto order = lookahead_union(be, c, row0, row1, st_.n_expert);
  plan_prefetch(*st_.residency, *st_.pack, st_.kind, L + 1, st_.n_expert, order, fills, st_.layer_stats(L + 1, c.phase));
}

RunStats ExpertStreamer::stats() const { return st_.run_stats(); }

void ExpertStreamer::reset_stats() {
  drain(st_.opt.io_timeout);
  st_.reset_counters();
}

}  // namespace sluice
