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
#include <numeric>

#include "backends/cuda/cuda_check.h"
#include "experts/cuda/streamer_impl.h"

namespace sluice {

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
  land_group(plan, L, ls, take_now, launch);
  cuda::launch_moe_grouped_combine(rows, stream);
}

void CudaStreamer::Impl::grouped(const MoeLayerCall& c, const cuda::MoeShape& shape, const LayerView& lv) {
  const int64_t L = c.moe_layer, n = shape.n_rows, k = shape.k;
  barrier();
  throw_if_failed();
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
    if (grouped_kernels) {
      compute_in_waves(plan_group(c, ids, weights, row0, row1, ls), group_rows, L, ls);
    } else {
      const StepPlan plan = load_group(c, ids, weights, row0, row1, ls);
      std::vector<size_t> all(plan.experts.size());
      std::iota(all.begin(), all.end(), size_t{0});
      upload_table(plan, all, lv.phase1.table, device_phase().table);
      cuda::launch_moe_experts(all_rows.h, d_ids.as<int32_t>(), device_phase().table, d_done.as(), d_act.as<float>(),
                               d_pair.as<float>(), all_rows.shape, stream);
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
