// The routed half of a MoE layer (moe_layer.h).
#include "models/moe_layer.h"

#include <optional>

namespace sluice {

std::vector<float> host_values(Backend& be, const Tensor& t) {
  if (t.empty()) return {};
  SLUICE_CHECK(t.dtype == DType::f32, Status::internal, "host_values: ", dtype_name(t.dtype), " tensor");
  std::vector<float> out(static_cast<size_t>(t.numel()));
  be.to_host(t, out.data());
  return out;
}

namespace {
// The device's form of a replayed call's rows (none without a replay).
ReplayRows device_replay(Backend& be, const MoeLayerRefs& refs, const ReplayedRows& replay) {
  if (!replay) return {};
  const RoutingReplayTable* table = replay.replay->device(be);
  SLUICE_CHECK(table != nullptr, Status::internal, be.name(), ": a device table of experts but no replay table");
  return {table, refs.moe_layer, replay.first, refs.router->norm_topk_prob};
}
}  // namespace

void moe_routed_half(Backend& be, const MoeLayerRefs& refs, ExpertProvider* provider, const RoutingObserver& observer,
                     const Tensor& h, const Tensor& y) {
  const RouterSpec& spec = *refs.router;
  const int64_t n = h.rows(), E = spec.n_expert;
  Tensor logits = refs.logits;  // [n, n_expert]
  if (logits.empty()) {
    logits = be.alloc(DType::f32, {n, E});
    be.matmul(h, refs.router_w, logits);
    if (!refs.router_bias.empty()) be.add_bias(logits, refs.router_bias);
  }

  const StreamPhase phase = refs.phase;
  // A replayed routing: this call's rows of the replay (taken whatever path computes them).
  const ReplayedRows replay{refs.replay, refs.replay ? refs.replay->take(refs.moe_layer, n) : 0};
  // Per-expert routing scales (Gemma 4) are applied after the top-k: by a table (built with
  // them: Backend::make_expert_table) or a provider that routes on the device, else on the host.
  const bool device_routes = provider ? provider->routes_on_device(refs.math, spec) : refs.table != nullptr;
  if (device_routes && !observer) {
    if (provider)
      provider->moe(be, {refs.moe_layer, nullptr, h, y, &spec, refs.next_router, refs.next_router_bias, logits,
                         refs.math, refs.expert_scale, phase, refs.score_bias, refs.next_score_bias, replay});
    else be.moe_routed(*refs.table, logits, spec.n_expert_used, spec.norm_topk_prob, h, y, device_replay(be, refs, replay));
    return;
  }

  Routing routing;
  if (replay) {
    routing = replay.replay->rows(refs.moe_layer, replay.first, n, spec.norm_topk_prob);
  } else {
    std::vector<float> host_logits(n * E);
    be.to_host(logits, host_logits.data());
    routing = route_topk(spec, host_logits, n, host_values(be, refs.score_bias));
  }
  if (!refs.expert_scale.empty())  // Gemma 4: after the renormalization, w *= per_expert_scale[id]
    for (size_t p = 0; p < routing.ids.size(); ++p)
      routing.weights[p] *= refs.expert_scale[static_cast<size_t>(routing.ids[p])];
  if (observer) {
    std::optional<Routing> predicted;
    if (refs.observe_prediction && !refs.next_router.empty()) {
      if (replay) {
        predicted = replay.replay->predicted(refs.moe_layer, replay.first, n);
      } else {
        Tensor next_logits = be.alloc(DType::f32, {n, E});  // [n, n_expert] of the next MoE layer
        be.matmul(h, refs.next_router, next_logits);
        if (!refs.next_router_bias.empty()) be.add_bias(next_logits, refs.next_router_bias);
        std::vector<float> host_next(n * E);
        be.to_host(next_logits, host_next.data());
        predicted = route_topk(spec, host_next, n, host_values(be, refs.next_score_bias));
      }
    }
    observer({refs.layer, refs.first_position, &routing, predicted ? &*predicted : nullptr, refs.next_layer});
  }
  if (provider) {
    provider->moe(be, {refs.moe_layer, device_routes ? nullptr : &routing, h, y, &spec, refs.next_router,
                       refs.next_router_bias, logits, refs.math,
                       device_routes ? std::span<const float>(refs.expert_scale) : std::span<const float>(), phase,
                       refs.score_bias, refs.next_score_bias, replay});
    return;
  }
  SLUICE_CHECK(refs.experts && static_cast<int64_t>(refs.experts->size()) == E, Status::internal, "layer ",
               refs.layer, ": no resident experts and no expert provider (a streamed model without its streamer)");
  routed_experts(be, refs.math, routing, h, y, [&](int32_t e) -> const ExpertWeights& { return (*refs.experts)[e]; });
}

}  // namespace sluice
