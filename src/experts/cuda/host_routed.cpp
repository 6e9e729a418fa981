// CudaStreamer's path for experts its device kernels do not compute: gpt-oss's biased,
// clamped SwiGLU, Llama 4's input-scaled experts under sigmoid routing, Gemma 4's GeGLU with
// per-expert scales. The model routed the call on the host (route_topk and the family's
// scales, as for the CPU streamer), so the device decides nothing here. Rows are grouped as
// in grouped.cpp, each group's union fitting the cache; a group is planned, its misses read
// and copied into their slots on the stream, and each expert computed as soon as it is
// resident (the resident ones first, the misses as they land, while later reads are in
// flight) by expert_pairs_forward: the family's ExpertMath on the backend's ops over views of the
// slots (expert_view: the kind's record layout at a device address), the CPU streamer's
// computation. Then one combine in rank order. Synchronous and without a deadline (--cut and
// --miss-kind do not apply); lookahead prefetches the next layer's predicted experts after
// each group's demand reads, as the CPU streamer does.
#include "backends/cuda/cuda_check.h"
#include "core/log.h"
#include "experts/cuda/streamer_impl.h"
#include "experts/expert_math.h"

namespace sluice {

void CudaStreamer::Impl::host_routed(Backend& be, const MoeLayerCall& c) {
  const Routing& r = *c.routing;
  const int64_t L = c.moe_layer, n = r.n_rows, k = r.k;
  barrier();
  throw_if_failed();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::lock_guard<std::mutex> g(mu);
  retire();  // the device is idle
  if (observer) observer({model_layer(L), -1, &r});
  if (opt.lossy() && !warned_lossy_host_routed) {
    warned_lossy_host_routed = true;
    LOG_WARN("cuda expert streaming: --cut, --miss-kind and --profile fast do not apply to experts routed on the host "
             "(gpt-oss, Llama 4, Gemma 4 on the cuda backend): every step is computed exactly");
  }
  LayerStats& ls = layer_stats(L, c.phase);
  const PackKindInfo& info = pack->kind(kind);
  Tensor expert_out = be.alloc(DType::f32, {n * k, n_embd});  // [n * k, n_embd], row = pair
  // Each expert as it lands.
  auto take_now = [](size_t, size_t) { return true; };
  for (int64_t row0 = 0; row0 < n;) {
    const int64_t row1 = row_group_end(r.ids, k, row0, n, residency->n_slots(), n_expert);
    const StepPlan plan = plan_group(c, r.ids, r.weights, row0, row1, ls);
    land_group(plan, L, ls, take_now, [&](std::span<const size_t> experts) {
      for (size_t i : experts) {
        const PlannedExpert& w = plan.experts[i];
        expert_pairs_forward(be, c.math, expert_view(info, slot_ptr(w.slot)), c.h, w.pairs, k, r.weights, expert_out);
      }
    });
    retire_group();
    row0 = row1;
  }
  std::vector<float> ones;
  be.moe_combine(expert_out, combine_weights(c.math, r.weights, ones), k, c.out);
}

}  // namespace sluice
