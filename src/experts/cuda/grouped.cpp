// CudaStreamer's synchronous path for a batch whose union may exceed the cache (a long
// prefill on a small cache): rows grouped so each group's union fits (row_group_end); each
// group is planned, loaded and computed on the model thread before the next, without the
// handshake and without a deadline. With many pairs an expert, a group's rows go through the
// grouped (tensor-core) kernels in waves: the experts resident at the plan first, then those
// whose reads landed, while the others are still being read (compute_in_waves), and one
// combine; each pair computed exactly as the resident prefill computes it, bit for bit.
// Otherwise the group's union is wholly resident before the pair kernels compute it. With
// lookahead, each group's prediction of the next layer is prefetched behind its reads.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "backends/cuda/cuda_check.h"
#include "experts/cuda/streamer_impl.h"

namespace sluice {

bool CudaStreamer::Impl::prefill_waves_enabled() { return switch_on("SLUICE_CUDA_PREFILL_WAVES"); }

// Landed records are copied on the stream; their staging buffers come back once it passed the
// copies. A fill that waits for a staging buffer (a background fill landed, was copied and its
// slot evicted by this group, so its record is staged twice) gets one by a synchronisation
// here: nothing else would return it before the group ends.
void CudaStreamer::Impl::check_landing(int64_t L, StreamerClock::time_point since) const {
  SLUICE_CHECK(StreamerClock::now() - since < opt.wait_timeout, Status::timeout, "MoE layer ", L, " (model layer ",
               model_layer(L), "): expert reads did not land within ",
               std::chrono::duration<double>(opt.wait_timeout).count(), " s (", reading.size(), " reads in flight, ",
               waiting.size(), " waiting for a staging buffer)");
}

size_t CudaStreamer::Impl::land_synchronously() {
  const size_t n_landed = landed.size();
  copy_landed_on_stream();
  if (!waiting.empty() && staging_free.empty() && !retiring.empty()) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    retire();
    return n_landed + 1;
  }
  return n_landed;
}

StepPlan CudaStreamer::Impl::plan_group(const MoeLayerCall& c, std::span<const int32_t> ids,
                                       std::span<const float> weights, int64_t row0, int64_t row1, LayerStats& ls) {
  const int64_t L = c.moe_layer, k = top_k;
  ++ls.steps;
  ls.rows += static_cast<uint64_t>(row1 - row0);
  ls.routed += static_cast<uint64_t>((row1 - row0) * k);
  StepPlan plan(*residency, *pack, opt, kind, L, /*deadline=*/false, opt.wait_timeout);
  plan.set_union(ids, weights, k, row0, row1, n_expert);
  ls.unique += plan.experts.size();
  Fills fills(*this, [this] { return land_synchronously(); });
  plan.acquire_and_read(fills, ls, pins);
  // Lookahead: the next layer's predicted experts of this group's rows, read into the
  // speculative share while this group waits and computes (as the CPU streamer's sub-batches).
  if (opt.lookahead && !c.next_router.empty() && L + 1 < n_layers && residency->speculative_capacity() > 0)
    plan_prefetch(*residency, *pack, kind, L + 1, n_expert, lookahead_union(be, c, row0, row1, n_expert), fills,
                  layer_stats(L + 1, c.phase));
  return plan;
}

StepPlan CudaStreamer::Impl::load_group(const MoeLayerCall& c, std::span<const int32_t> ids,
                                       std::span<const float> weights, int64_t row0, int64_t row1, LayerStats& ls) {
  StepPlan plan = plan_group(c, ids, weights, row0, row1, ls);
  wait_group_resident(plan, c.moe_layer, ls);
  return plan;
}

void CudaStreamer::Impl::retire_group() {
  CUDA_CHECK(cudaStreamSynchronize(stream));  // the group's slots may be reused by the next
  retire();
  release_pins();
}

void CudaStreamer::Impl::land_group(const StepPlan& plan, int64_t L, LayerStats& ls,
                                    const std::function<bool(size_t ready, size_t left)>& take_now,
                                    const std::function<void(std::span<const size_t> experts)>& compute) {
  const size_t n = plan.experts.size();
  std::vector<uint8_t> taken(n, 0);
  std::vector<size_t> ready;
  size_t left = n;
  const auto t0 = StreamerClock::now();
  auto since = t0;
  while (left > 0) {
    size_t progress = land_synchronously();
    ready.clear();
    for (size_t i = 0; i < n; ++i)
      if (!taken[i] && resident(plan.experts[i].slot, plan.experts[i].record, kind)) ready.push_back(i);
    if (!ready.empty() && take_now(ready.size(), left)) {
      for (size_t i : ready) taken[i] = 1;
      left -= ready.size();
      compute(ready);
      since = StreamerClock::now();
      continue;
    }
    progress += pump();
    if (progress) since = StreamerClock::now();
    else cuda::host_idle(wait_mode);
    check_landing(L, since);
  }
  ls.demand_wait_seconds += seconds_between(t0, StreamerClock::now());
}

namespace {
std::atomic<int64_t> g_copy_chunks{0};  // CudaStreamer::prefill_copy_chunks
}  // namespace

bool CudaStreamer::Impl::prefill_copies_beside_enabled() {
  const char* e = std::getenv("SLUICE_CUDA_PREFILL_COPY_STREAM");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

int64_t CudaStreamer::prefill_copy_chunks() { return g_copy_chunks.load(std::memory_order_relaxed); }

std::vector<CudaStreamer::Impl::CopyChunk> CudaStreamer::Impl::copy_landed_in_chunks(
    int chunks, const StepPlan& plan, const std::unordered_map<int32_t, size_t>& plan_slots) {
  std::vector<CopyChunk> out;
  const size_t n = landed.size();
  if (n == 0) return out;
  const size_t per = (n + static_cast<size_t>(std::max(chunks, 1)) - 1) / static_cast<size_t>(std::max(chunks, 1));
  for (size_t i = 0; i < n; ++i) {
    const Fill& f = landed[i];
    if (i % per == 0) {
      out.emplace_back();
      if (opt.test_copy_delay_us > 0) cuda::launch_stream_delay(opt.test_copy_delay_us, copy_stream);
      g_copy_chunks.fetch_add(1, std::memory_order_relaxed);
    }
    copy_fill(f, copy_stream);
    const auto it = plan_slots.find(f.slot);
    if (it != plan_slots.end() && f.kind == kind && plan.experts[it->second].record == f.record)
      out.back().experts.push_back(it->second);
    if (i + 1 == n || (i + 1) % per == 0) {
      cudaEvent_t ev = nullptr;
      if (free_copy_events.empty()) {
        CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      } else {
        ev = free_copy_events.back();
        free_copy_events.pop_back();
      }
      CUDA_CHECK(cudaEventRecord(ev, copy_stream));
      out.back().done = ev;
      pending_copies.push_back(ev);
    }
  }
  landed.clear();
  return out;
}

void CudaStreamer::Impl::wait_copies_through(cudaEvent_t done) {
  if (pending_copies.empty()) return;
  auto last = done ? std::find(pending_copies.begin(), pending_copies.end(), done) : pending_copies.end() - 1;
  SLUICE_ASSERT(last != pending_copies.end());  // a wave waits for the chunk just copied
  // One copy stream: its later event completing means every earlier one has.
  CUDA_CHECK(cudaStreamWaitEvent(stream, *last, 0));
  free_copy_events.insert(free_copy_events.end(), pending_copies.begin(), last + 1);
  pending_copies.erase(pending_copies.begin(), last + 1);
}

void CudaStreamer::Impl::land_group_in_chunks(const StepPlan& plan, int64_t L, LayerStats& ls,
                                              const std::function<void(std::span<const size_t> experts)>& compute) {
  // The copy stream after everything the stream holds so far: a slot the plan's stall path
  // (land_synchronously) or an earlier step filled on the stream, or a kernel still reads, is
  // not overwritten from the copy stream before that.
  if (!copy_order) CUDA_CHECK(cudaEventCreateWithFlags(&copy_order, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(copy_order, stream));
  CUDA_CHECK(cudaStreamWaitEvent(copy_stream, copy_order, 0));
  try {
    land_chunks(plan, L, ls, compute);
  } catch (...) {
    // Whatever went out on the copy stream is waited for by the stream on every exit: the
    // fills it copies count as resident, and their host buffers are reused after a sync of
    // the stream alone (retire).
    try {
      wait_copies_through(nullptr);
    } catch (...) {
    }
    throw;
  }
  wait_copies_through(nullptr);  // the copies of records outside the plan (lookahead) too
}

void CudaStreamer::Impl::land_chunks(const StepPlan& plan, int64_t L, LayerStats& ls,
                                     const std::function<void(std::span<const size_t> experts)>& compute) {
  const size_t n = plan.experts.size();
  std::unordered_map<int32_t, size_t> plan_slots;
  for (size_t i = 0; i < n; ++i) plan_slots.emplace(plan.experts[i].slot, i);
  std::vector<uint8_t> taken(n, 0);
  size_t left = n;
  int waves_left = kPrefillWaves;
  std::vector<size_t> copied;  // copied (or copying) experts of the plan, not yet computed
  cudaEvent_t copied_through = nullptr;
  auto launch = [&](std::vector<size_t>& experts, cudaEvent_t after) {
    if (after) wait_copies_through(after);
    for (size_t i : experts) taken[i] = 1;
    left -= experts.size();
    --waves_left;
    compute(experts);
    experts.clear();
  };
  // The first wave: what the plan found resident, before any of the group's copies.
  std::vector<size_t> ready;
  for (size_t i = 0; i < n; ++i)
    if (resident(plan.experts[i].slot, plan.experts[i].record, kind)) ready.push_back(i);
  if (!ready.empty()) launch(ready, nullptr);
  const auto t0 = StreamerClock::now();
  auto since = t0;
  while (left > 0) {
    size_t progress = pump();
    if (!landed.empty()) {
      size_t of_plan = 0;  // landed records of the plan: is this the group's last batch?
      for (const Fill& f : landed) {
        const auto it = plan_slots.find(f.slot);
        of_plan += it != plan_slots.end() && f.kind == kind && plan.experts[it->second].record == f.record &&
                   !taken[it->second];
      }
      const bool last = copied.size() + of_plan == left;
      const int chunks = last ? std::max(1, std::min(waves_left, kCopyChunks)) : 1;
      progress += landed.size();
      for (CopyChunk& c : copy_landed_in_chunks(chunks, plan, plan_slots)) {
        copied.insert(copied.end(), c.experts.begin(), c.experts.end());
        copied_through = c.done;
        // As land_group's take_now: each wave at least its share of what is left, the last
        // one everything.
        const bool all = copied.size() == left;
        const size_t share = (left + static_cast<size_t>(waves_left) - 1) / static_cast<size_t>(std::max(waves_left, 1));
        if (!copied.empty() && (all || (waves_left > 1 && copied.size() >= share))) launch(copied, copied_through);
      }
    }
    // A fill waiting for a staging buffer gets one only once the stream passed the copies
    // out of the staging buffers retiring holds (land_synchronously's case).
    if (left > 0 && !waiting.empty() && staging_free.empty() && !retiring.empty()) {
      wait_copies_through(nullptr);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      retire();
      ++progress;
    }
    if (progress) since = StreamerClock::now();
    else if (left > 0) cuda::host_idle(wait_mode);
    check_landing(L, since);
  }
  ls.demand_wait_seconds += seconds_between(t0, StreamerClock::now());
}

void CudaStreamer::Impl::wait_group_resident(const StepPlan& plan, int64_t L, LayerStats& ls) {
  land_group(plan, L, ls, [](size_t ready, size_t left) { return ready == left; }, [](std::span<const size_t>) {});
}

const cuda::ExpertRef* CudaStreamer::Impl::upload_table(const StepPlan& plan, std::span<const size_t> experts,
                                                       cuda::ExpertRef* host, cuda::ExpertRef* dev) {
  std::fill(host, host + n_expert, cuda::ExpertRef{});
  for (size_t i : experts) host[plan.experts[i].expert] = ref(plan.experts[i].slot, kind);
  CUDA_CHECK(cudaMemcpyAsync(dev, host, static_cast<size_t>(n_expert) * sizeof(cuda::ExpertRef),
                             cudaMemcpyHostToDevice, stream));
  return dev;
}

void CudaStreamer::Impl::compute_in_waves(const StepPlan& plan, const cuda::MoeGroupedParams& rows, int64_t L,
                                          LayerStats& ls) {
  int wave = 0;
  cuda::launch_moe_grouped_prepare(rows, stream);
  // The first wave takes what is resident; each later one at least its share of what is left
  // (so at most kPrefillWaves of them), the last one everything.
  auto take_now = [&](size_t ready, size_t left) {
    const size_t waves_left = static_cast<size_t>(kPrefillWaves - wave);
    return ready == left || (waves_left > 1 && (wave == 0 || ready >= (left + waves_left - 1) / waves_left));
  };
  auto launch = [&](std::span<const size_t> experts) {
    const size_t offset = static_cast<size_t>(wave++) * static_cast<size_t>(n_expert);
    cuda::MoeGroupedParams p = rows;
    p.table = upload_table(plan, experts, reinterpret_cast<cuda::ExpertRef*>(wave_tables.data()) + offset,
                           d_wave_tables.as<cuda::ExpertRef>() + offset);
    cuda::launch_moe_grouped_experts(p, stream);
  };
  if (prefill_copies_beside_enabled()) land_group_in_chunks(plan, L, ls, launch);
  else land_group(plan, L, ls, take_now, launch);
  cuda::launch_moe_grouped_combine(rows, stream);
}

void CudaStreamer::Impl::grouped(const MoeLayerCall& c, const cuda::MoeShape& shape) {
  const int64_t L = c.moe_layer, n = shape.n_rows, k = shape.k;
  barrier();
  throw_if_failed();
  const LayerView lv = layer_view(L);
  const size_t nk = static_cast<size_t>(n * k);
  // The top-k kernel wrote the routing into lv too (moe()): it is there once the stream drained.
  CUDA_CHECK(cudaMemsetAsync(d_done.as(), 0, nk, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::lock_guard<std::mutex> g(mu);
  retire();  // the device is idle
  const std::span<const int32_t> ids(lv.ids, nk);
  const std::span<const float> weights(lv.weights, nk);
  observe(L, n, lv);
  LayerStats& ls = layer_stats(L, c.phase);
  const bool grouped_kernels = grouped_kernels_apply(shape);
  // With scaled inputs (expert_inputs) each group's pairs run as rows of their own and write
  // their outputs to d_pair_sum, summed into c.out after the last group.
  const bool per_pair = c.math.scale_input;
  const ExpertInputs all_rows = expert_inputs(c, shape);
  for (int64_t row0 = 0; row0 < n;) {
    const int64_t row1 = row_group_end(ids, k, row0, n, residency->n_slots(), n_expert);
    cuda::MoeShape rows = shape;
    rows.n_rows = row1 - row0;
    const ExpertInputs in = expert_inputs(c, rows, row0);
    cuda::MoeGroupedParams group_rows{in.h,
                                      d_ids.as<int32_t>() + row0 * k,
                                      in.combine_weights,
                                      device_phase().table,
                                      d_group.as(),
                                      d_act.as<float>(),
                                      d_pair.as<float>(),
                                      per_pair ? d_pair_sum.as<float>() + row0 * k * shape.n_embd
                                               : c.out.ptr<float>() + row0 * shape.n_embd,
                                      in.shape};
    if (grouped_kernels && prefill_waves_enabled()) {
      compute_in_waves(plan_group(c, ids, weights, row0, row1, ls), group_rows, L, ls);
    } else {
      const StepPlan plan = load_group(c, ids, weights, row0, row1, ls);
      std::vector<size_t> all(plan.experts.size());
      std::iota(all.begin(), all.end(), size_t{0});
      upload_table(plan, all, lv.phase1.table, device_phase().table);
      if (grouped_kernels)
        cuda::launch_moe_experts_grouped(group_rows, stream);
      else
        cuda::launch_moe_experts(all_rows.h, d_ids.as<int32_t>(), device_phase().table, d_done.as(),
                                 d_act.as<float>(), d_pair.as<float>(), all_rows.shape, stream);
    }
    retire_group();
    row0 = row1;
  }
  if (!grouped_kernels)
    cuda::launch_moe_combine_done(d_pair.as<float>(), all_rows.combine_weights, d_done.as(), c.out.ptr<float>(), shape,
                                  stream);
  else if (per_pair)  // the pairs' outputs, summed per row in rank order with weight 1
    cuda::launch_moe_combine(d_pair_sum.as<float>(), all_rows.combine_weights, c.out.ptr<float>(), n, k, shape.n_embd,
                             stream);
}

}  // namespace sluice
