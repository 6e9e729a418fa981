// ExpertProvider: where a MoE layer's routed experts come from when they are not resident in
// the model's weights. The shared decoders (models/decoder.cpp, models/hybrid_decoder.cpp)
// route, then hand the routing to the provider, which computes the routed half of the layer;
// a model without a provider computes it from its resident expert weights (routed_experts in
// expert_math.h). The streamers (streamer.h, cuda/cuda_streamer.h) are the providers that
// read experts from a pack on demand.
#pragma once

#include <cstdint>
#include <span>

#include "backends/backend.h"
#include "experts/expert_math.h"
#include "experts/routing.h"
#include "experts/routing_replay.h"
#include "experts/stats.h"

namespace sluice {

struct MoeLayerCall {
  int64_t moe_layer = 0;                // index among the MoE layers (the pack's record numbering)
  const Routing* routing = nullptr;     // ids/weights [rows * k], strongest first; null when
                                        // the provider routes on the device (routes_on_device)
  Tensor h;                             // [rows, n_embd] f32, the layer's normalized input
  Tensor out;                           // [rows, n_embd] f32, receives the routed sum
  const RouterSpec* router = nullptr;   // the model's router (top-k, normalization)
  Tensor next_router;                   // [n_expert, n_embd] router of the next MoE layer, or
                                        // empty at the last one (lookahead predicts with it)
  Tensor next_router_bias;              // [n_expert] its bias (gpt-oss), or empty
  Tensor router_logits;                 // [rows, n_expert] f32 on the backend
  ExpertMath math;                      // what one expert computes (the family's)
  std::span<const float> expert_scale;  // [n_expert] (Gemma 4's per_expert_scale): a provider that
                                        // routes on the device multiplies each chosen expert's
                                        // weight by it after the top-k; empty: none (a host
                                        // routing has it applied already)
  StreamPhase phase = StreamPhase::decode;  // prefill: rows of one sequence's prompt chunk;
                                            // decode: one token per sequence
  Tensor score_bias = {};               // [n_expert] f32 on the backend: the layer's correction bias
                                        // (RouterScoring::sigmoid_grouped), or empty
  Tensor next_score_bias = {};          // the next MoE layer's (lookahead), or empty
  ReplayedRows replay;                  // a replayed routing (benchmarks): its rows [first, first
                                        // + rows) are the routing (call.routing holds them when
                                        // the model routed on the host; a provider that routes on
                                        // the device replays them there), and lookahead predicts
                                        // with the replay's predictions. Empty: the router routes.
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // out = sum over ranks r of weights[row, r] * expert[ids[row, r]](h[row]), accumulated per
  // row in rank order (Backend::moe_combine), so the result never depends on which experts
  // were resident or in which order they were computed.
  virtual void moe(Backend& be, const MoeLayerCall& call) = 0;
  // True: for a layer of this expert math and router, moe() takes call.router_logits and
  // routes on the device itself (call.routing is null), so the model enqueues the layer
  // without a host round trip. False: the model copies the logits to the host and routes
  // there (route_topk, then any per-expert scale of the family) before calling moe().
  virtual bool routes_on_device(const ExpertMath& /*math*/, const RouterSpec& /*router*/) const { return false; }
  // Called by the model after a forward's logits reached the host. A provider that works
  // asynchronously (the CUDA streamer's service thread) reports a failure of that forward
  // here, as an exception on the model's thread.
  virtual void forward_done() {}
  // True: the model may enqueue a forward before the one before it reached the host (a greedy
  // decode step enqueued ahead, models/decoder.cpp). After a forward whose result reached the
  // host while the next one is in flight the model calls forward_checked instead of
  // forward_done: a failure so far is raised there, without waiting for the next forward.
  virtual bool forwards_overlap() const { return false; }
  virtual void forward_checked() {}
};

}  // namespace sluice
