// The routed half of a MoE layer, shared by the decoders (decoder.cpp, hybrid_decoder.cpp):
// router logits, then one of three paths, all with the same result:
//   - device: every expert resident in an ExpertTable of the backend and nobody observing the
//     routing: Backend::moe_routed routes and computes on the device, no host round trip;
//   - provider (the streamer): routes on the device itself when it says so, else gets the
//     routing computed on the host;
//   - host: the logits are copied to the host, route_topk, then routed_experts (experts/expert_math.h).
// A routing observer (--trace-routing) always gets the host routing, and with
// observe_prediction the next layer's predicted top-k (h through next_router, as lookahead
// computes it; a second matmul, paid only while tracing).
// With a replayed routing (refs.replay, benchmarks) the call takes the replay's next rows
// and they stand where the router's top-k would: the host routing is the replay's rows, a
// provider routing on the device and the device path replay them there (MoeLayerCall::replay,
// Backend::moe_routed's ReplayRows), and the observer gets them with the replay's predictions.
// The router's logits are still computed (what the step costs stays the same).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>


#include "backends/backend.h"
#include "experts/expert_math.h"
#include "experts/expert_provider.h"
#include "experts/routing.h"

namespace sluice {

struct MoeLayerRefs {
  int64_t layer = 0;                                 // model layer index
  int64_t moe_layer = 0;                             // index among the MoE layers
  int64_t first_position = 0;                        // sequence position of row 0
  const RouterSpec* router = nullptr;
  Tensor router_w;                                   // [n_expert, n_embd]
  Tensor router_bias;                                // [n_expert] added to the logits (gpt-oss), or empty
  Tensor next_router;                                // the next MoE layer's router, or empty
  Tensor next_router_bias;                           // its bias, or empty
  const std::vector<ExpertWeights>* experts = nullptr;  // resident experts ([n_expert]) or empty
  const ExpertTable* table = nullptr;                // the backend's table over them, or null
  ExpertMath math;                                   // what one expert computes
  StreamPhase phase = StreamPhase::prefill;          // of the forward pass (statistics)
  int64_t next_layer = -1;                           // model layer index of next_router's layer
  bool observe_prediction = false;                   // the observer also gets the lookahead prediction
  Tensor logits;                                     // [n, n_expert] router logits the family computed
                                                     // itself (Gemma 4), or empty: h . router_w^T (+ bias)
  std::vector<float> expert_scale;                   // [n_expert] multiplies each chosen expert's
                                                     // routing weight (Gemma 4), or empty
  Tensor score_bias = {};                            // [n_expert] f32 correction bias of the choice
                                                     // (RouterScoring::sigmoid_grouped), or empty
  Tensor next_score_bias = {};                       // the next MoE layer's, or empty
  RoutingReplay* replay = nullptr;                   // a replayed routing (--replay-routing) in
                                                     // place of the router's top-k, or null
};

// y[n, n_embd] = the routed experts' sum for h[n, n_embd].
void moe_routed_half(Backend& be, const MoeLayerRefs& refs, ExpertProvider* provider, const RoutingObserver& observer,
                     const Tensor& h, const Tensor& y);

// A tensor's f32 values on the host (a router's correction bias; empty for an empty tensor).
std::vector<float> host_values(Backend& be, const Tensor& t);

// The backend's tables over every layer's resident experts ([n_layer], null where a layer has
// none, or the backend routes on the host, also because its kernels do not compute `math`
// or route as `router` says). A layer's correction bias (router_score_bias, where the layer
// weights have one) goes into its table.
template <typename LayerWeights>
std::vector<std::unique_ptr<ExpertTable>> make_expert_tables(Backend& be, const std::vector<LayerWeights>& layers,
                                                             const RouterSpec& router, const ExpertMath& math) {
  std::vector<std::unique_ptr<ExpertTable>> tables(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    if (router.n_expert <= 0 || static_cast<int64_t>(layers[l].experts.size()) != router.n_expert) continue;
    std::vector<float> bias;
    if constexpr (requires { layers[l].router_score_bias; }) bias = host_values(be, layers[l].router_score_bias);
    tables[l] = be.make_expert_table(layers[l].experts, math, TableRouting{router.scoring, {}, router.grouped, bias, router.n_expert_used});
  }
  return tables;
}

}  // namespace sluice
