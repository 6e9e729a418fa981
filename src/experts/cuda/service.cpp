// CudaStreamer's service thread: it answers the four-signal handshake of every MoE layer the
// model thread enqueued (experts/cuda/handshake.h). Per layer: wait for router_ready, plan
// the step (experts/plan.h: acquire, reads, --miss-kind copies, lookahead), publish table 1
// (the resident experts), land the misses (at resident_done the plan decides what is cut),
// publish table 2 and answer misses_ready. It never calls the CUDA API (expert_copy.h says
// why): copies go out as lists the device's copy kernel reads.
#include <algorithm>
#include <atomic>
#include <thread>

#include "core/log.h"
#include "experts/cuda/streamer_impl.h"

namespace sluice {

std::atomic<int64_t> g_decode_copies_beside{0};  // CudaStreamer::decode_copies_beside
int64_t CudaStreamer::decode_copies_beside() { return g_decode_copies_beside.load(std::memory_order_relaxed); }
std::atomic<int64_t> g_decode_settled{0};  // CudaStreamer::decode_settled_at_plan
int64_t CudaStreamer::decode_settled_at_plan() { return g_decode_settled.load(std::memory_order_relaxed); }
std::atomic<int64_t> g_decode_hits_on_device{0};  // CudaStreamer::decode_hits_on_device
int64_t CudaStreamer::decode_hits_on_device() { return g_decode_hits_on_device.load(std::memory_order_relaxed); }

void CudaStreamer::Impl::set_error(const Error& e) {
  {
    std::lock_guard<std::mutex> lk(q_mu);
    if (!error) error = e;
  }
  failed = true;
  done_cv.notify_all();
}

void CudaStreamer::Impl::service_loop() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> lk(q_mu);
      while (jobs.empty()) {
        // Idle: land background reads (cut experts, prefetches) so their slots free up.
        lk.unlock();
        bool busy = false;
        {
          std::lock_guard<std::mutex> g(mu);
          if (!failed) {
            try {
              pump();
            } catch (const Error& e) {
              set_error(e);
            }
          }
          busy = in_flight() > 0;
        }
        lk.lock();
        if (jobs.empty()) q_cv.wait_for(lk, busy ? std::chrono::microseconds(200) : std::chrono::microseconds(5000));
      }
      j = jobs.front();
      jobs.pop_front();
      layer_job_running = j.kind == Job::Kind::layer;
    }
    if (j.kind == Job::Kind::stop) return;
    if (j.kind == Job::Kind::barrier) {
      {
        std::lock_guard<std::mutex> g(mu);
        release_pins();
      }
      {
        std::lock_guard<std::mutex> lk(q_mu);
        barriers_done = j.value;
      }
      done_cv.notify_all();
      continue;
    }
    published_resident = published_misses = false;
    if (failed) {
      release_device(j);
    } else {
      try {
        std::lock_guard<std::mutex> g(mu);
        run_layer(j);
      } catch (const Error& e) {
        set_error(e);
        release_device(j);
      } catch (const std::exception& e) {
        set_error(Error(Status::internal, str("cuda expert streamer: ", e.what())));
        release_device(j);
      }
    }
    std::lock_guard<std::mutex> lk(q_mu);
    layer_job_running = false;
    calls_done[static_cast<size_t>(j.layer)] = j.value;  // its routing entry is free (wait_routing_slot)
    done_cv.notify_all();
  }
}

// After a failure: answers the call's host-to-device signals with empty tables (no expert is
// computed), so the stream runs to its end and the model thread sees the error.
void CudaStreamer::Impl::release_device(const Job& j) {
  const LayerView lv = layer_view(j.layer, j.value);
  if (!published_resident) {
    clear_phase(lv.phase1);
    hs->store(j.layer, cuda::Signal::resident_ready, j.value);
  }
  if (!published_misses) {
    clear_phase(lv.phase2);
    hs->store(j.layer, cuda::Signal::misses_ready, j.value);
  }
  published_resident = published_misses = true;
}

void CudaStreamer::Impl::wait_signal(int64_t L, cuda::Signal sig, uint64_t value) {
  const auto t0 = StreamerClock::now();
  while (hs->load(L, sig) < value) {
    if (pump() == 0) cuda::host_idle(wait_mode);
    if (StreamerClock::now() - t0 > opt.wait_timeout)
      fail(Status::timeout, "MoE layer ", L, " (model layer ", model_layer(L), "): no ", cuda::signal_name(sig),
           " signal from the device within ", std::chrono::duration<double>(opt.wait_timeout).count(),
           " s (waiting for value ", value, ", last seen ", hs->load(L, sig), ")");
  }
}

void CudaStreamer::Impl::observe(int64_t L, int64_t n, const LayerView& lv) {
  if (!observer) return;
  const size_t nk = static_cast<size_t>(n * top_k);
  Routing r{n, top_k, std::vector<int32_t>(lv.ids, lv.ids + nk), std::vector<float>(lv.weights, lv.weights + nk)};
  observer({model_layer(L), -1, &r});
}

void CudaStreamer::Impl::lookahead(const Job& j, const LayerView& lv, StepFills& fills) {
  const int64_t L = j.layer;
  if (!j.lookahead || L + 1 >= n_layers || residency->speculative_capacity() == 0) return;
  const size_t nk = static_cast<size_t>(j.n * top_k);
  const auto order = predicted_union(std::span<const int32_t>(lv.pred_ids, nk),
                                     std::span<const float>(lv.pred_weights, nk), n_expert);
  plan_prefetch(*residency, *pack, kind, L + 1, n_expert, order, fills, layer_stats(L + 1, j.phase));
}

void CudaStreamer::Impl::run_layer(const Job& j) {
  const int64_t L = j.layer, n = j.n, k = top_k;
  const uint64_t v = j.value;
  LayerStats& ls = layer_stats(L, j.phase);
  const auto ready0 = StreamerClock::now();
  wait_signal(L, cuda::Signal::router_ready, v);
  const auto wall0 = StreamerClock::now();
  const double cpu0 = thread_cpu_seconds();
  // The service thread's time on this layer until its last publication to the device.
  auto count_service_time = [&] {
    ls.service_wall_seconds += seconds_between(wall0, StreamerClock::now());
    ls.service_cpu_seconds += thread_cpu_seconds() - cpu0;
  };
  // The device reached this layer: the previous steps' copies and experts are done.
  retire();
  release_pins();
  const LayerView lv = layer_view(L, v);
  const size_t nk = static_cast<size_t>(n * k);
  observe(L, n, lv);
  ++ls.steps;
  ls.rows += static_cast<uint64_t>(n);
  ls.routed += nk;
  StepPlan plan(*residency, *pack, opt, kind, L, /*deadline=*/true, opt.wait_timeout);
  plan.set_union(std::span<const int32_t>(lv.ids, nk), std::span<const float>(lv.weights, nk), k, 0, n, n_expert);
  ls.unique += plan.experts.size();
  uint32_t n1 = 0, n2 = 0;
  Fills fills(*this, [&] { return list_landed(lv.phase1.copies, n1); });
  if (hs->load(L, cuda::Signal::hits_taken) >= v) {
    // The device took every expert from the slot map and computes the layer without a table
    // from here: the plan only pins, counts and tells the policy. Nothing can be a miss (the
    // map is the cache's resident main-kind records, and only this thread's plans change them
    // while the device runs; the routing read is this call's, in its ring entry, even when the
    // device has gone on to the layer's next call), and nothing is listed: the device reads no
    // list of this layer.
    plan.acquire_and_read(fills, ls, pins);
    for (PlannedExpert& w : plan.experts) {
      SLUICE_CHECK(w.status == AcquireStatus::hit, Status::internal, "MoE layer ", L, " (model layer ", model_layer(L),
                   "): the device took ", describe(w.record, kind), " from the slot map in call ", v,
                   ", which the cache does not hold (slot ", residency->find(w.record, kind), ", map ",
                   hit_slots()[w.record], ")");
      plan.take(w, ReadyCopy::main, ls);
    }
    g_decode_settled.fetch_add(1, std::memory_order_relaxed);
    g_decode_hits_on_device.fetch_add(1, std::memory_order_relaxed);
    published_resident = published_misses = true;  // nothing waits for them
    count_service_time();
    return;
  }
  plan.acquire_and_read(fills, ls, pins);
  lookahead(j, lv, fills);
  pump();

  if (opt.test_publish_delay_us > 0 && !delayed_publish) {
    delayed_publish = true;
    std::this_thread::sleep_for(std::chrono::microseconds(opt.test_publish_delay_us));
  }
  // Phase 1: the experts resident now. The records that landed are copied beside it (by
  // leading blocks of its gate/up launch) while it computes the others, and their experts are
  // phase 2's.
  list_landed(lv.phase1.copies, n1);
  *lv.phase1.count = n1;
  std::vector<int32_t> beside_slots;
  for (uint32_t i = 0; i < n1; ++i) beside_slots.push_back(slot_of(lv.phase1.copies[i]));
  if (n1 > 0) g_decode_copies_beside.fetch_add(1, std::memory_order_relaxed);
  auto copied_beside = [&](int32_t slot) {
    return std::find(beside_slots.begin(), beside_slots.end(), slot) != beside_slots.end();
  };
  std::fill(lv.phase1.table, lv.phase1.table + n_expert, cuda::ExpertRef{});
  for (PlannedExpert& w : plan.experts) {
    if (!plan.in_phase1(w) || copied_beside(w.slot)) continue;
    lv.phase1.table[w.expert] = ref(w.slot, kind);
    plan.take(w, ReadyCopy::main, ls);
  }
  // Phase 2's entries of the union's experts: their main or low-bit copy, none for a cut one
  // (whose phase-1 entry is none too: a cut expert was never in phase 1). The handshake
  // kernels read the entries of the call's pairs only.
  auto fill_union_entries = [&] {
    for (const PlannedExpert& w : plan.experts)
      lv.phase2.table[w.expert] = w.dropped ? cuda::ExpertRef{}
                                  : w.low   ? ref(w.low_slot, *opt.miss_kind)
                                            : ref(w.slot, kind);
  };
  // Settled at the plan: every expert left is ready now (the host tier's misses, whose records
  // phase 1's list copies), so nothing is left to land or decide and phase 2's list goes out
  // before resident_ready, with no copies (a record landing later waits for the next layer's
  // list). The device's phase-2 handshake then takes it from device memory.
  bool decided = !plan.deadline();
  auto ready_now = [&](const PlannedExpert& w) { return w.done || plan.ready(w, decided) != ReadyCopy::none; };
  const bool settled = std::all_of(plan.experts.begin(), plan.experts.end(), ready_now);
  if (settled) {
    g_decode_settled.fetch_add(1, std::memory_order_relaxed);
    for (PlannedExpert& w : plan.experts)
      if (!w.done) plan.take(w, plan.ready(w, decided), ls);
    *lv.phase2.count = 0;  // a settled list has no copies, and only its union's entries are read
    fill_union_entries();
  }
  *lv.phase1.settled = settled ? 1 : 0;
  hs->store(L, cuda::Signal::resident_ready, v);
  published_resident = true;
  if (settled) {
    hs->store(L, cuda::Signal::misses_ready, v);  // for release_device
    published_misses = true;
    count_service_time();
    return;
  }
  // Every copy listed so far runs before phase 1 on the stream (or with its gate/up): at
  // resident_done their host memory is free. Phase 2 may need those staging buffers for its
  // own misses (a lookahead fill listed and evicted within the step holds a second one), so it
  // must not wait for the next layer's router_ready to get them back.
  const size_t listed_for_phase1 = retiring.size();
  count_service_time();

  // Phase 2: the misses as they land; with a deadline, the plan decides what is cut (or
  // takes its landed low-bit copy) once the device finished phase 1.
  std::optional<StreamerClock::time_point> phase1_done;
  auto since = StreamerClock::now();
  auto wait_low = [&](const PlannedExpert& w) {
    const auto t0 = StreamerClock::now();
    while (!resident(w.low_slot, w.record, *opt.miss_kind)) {
      if (pump() == 0) cuda::host_idle(wait_mode);
      list_landed(lv.phase2.copies, n2);
      SLUICE_CHECK(StreamerClock::now() - t0 < opt.wait_timeout, Status::timeout, "MoE layer ", L,
                   ": the low-bit copy of ", describe(w.record, *opt.miss_kind), " did not land");
    }
  };
  for (;;) {
    size_t progress = pump();
    list_landed(lv.phase2.copies, n2);
    if (!phase1_done && hs->load(L, cuda::Signal::resident_done) >= v) {
      phase1_done = StreamerClock::now();
      retire(listed_for_phase1);
    }
    if (!decided && phase1_done) {
      plan.decide_deadline(ls, wait_low);
      decided = true;
    }
    bool all = true;
    for (PlannedExpert& w : plan.experts) {
      if (w.done) continue;
      const ReadyCopy copy = plan.ready(w, decided);
      if (copy == ReadyCopy::none) {
        all = false;
        continue;
      }
      plan.take(w, copy, ls);
      ++progress;
    }
    if (all) break;  // nothing left to cut
    if (progress) since = StreamerClock::now();
    else cuda::host_idle(wait_mode);
    if (StreamerClock::now() - since > opt.wait_timeout) {
      size_t late = 0;
      for (const PlannedExpert& w : plan.experts) late += w.done ? 0 : 1;
      fail(Status::timeout, "MoE layer ", L, " (model layer ", model_layer(L), "): ", late, " expert",
           late == 1 ? "" : "s", " did not land within ", std::chrono::duration<double>(opt.wait_timeout).count(),
           " s (", reading.size(), " reads in flight, ", waiting.size(), " waiting for staging; misses_ready not sent)");
    }
  }
  list_landed(lv.phase2.copies, n2);
  // Phase 2's table: the union's entries (the handshake kernel reads the entries of the
  // call's pairs only); its copies, the n2 records just listed.
  *lv.phase2.count = n2;
  fill_union_entries();
  hs->store(L, cuda::Signal::misses_ready, v);
  published_misses = true;
  LOG_DEBUG("cuda streamer: MoE layer ", L, " call ", v, ": ", plan.experts.size(), " experts, ", n1, " + ", n2,
            " copies, router_ready after ", seconds_between(ready0, wall0) * 1e3, " ms, misses_ready after ",
            seconds_between(wall0, StreamerClock::now()) * 1e3, " ms");
  // The device waited from the end of phase 1 until now.
  if (phase1_done) ls.demand_wait_seconds += seconds_between(*phase1_done, StreamerClock::now());
}

}  // namespace sluice
