// Routing: a MoE layer's router (softmax top-k, as transformers computes it), the experts it
// chose for a batch of rows, strongest first, and a hook that lets tools observe every
// routing decision (trace export, statistics).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/router_scoring.h"

namespace sluice {

struct RouterSpec {
  int64_t n_expert = 0, n_expert_used = 0;
  bool norm_topk_prob = false;  // renormalize the chosen k weights to sum to 1 (softmax, sigmoid_grouped)
  RouterScoring scoring = RouterScoring::softmax;
  GroupedRouting grouped = {};  // sigmoid_grouped only
};

// Chosen experts of n rows, strongest first: ids/weights[row * k + rank].
struct Routing {
  int64_t n_rows = 0, k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;  // as applied to the expert outputs
};

struct RoutingEvent {
  int64_t layer = 0;           // model layer index
  int64_t first_position = 0;  // sequence position of row 0 (rows are consecutive positions)
  const Routing* routing = nullptr;
  // With lookahead on: the lookahead router's top-k for the next MoE layer (model layer
  // next_layer) over the same rows, as the streamer predicts it; null otherwise.
  const Routing* predicted_next = nullptr;
  int64_t next_layer = -1;
};

using RoutingObserver = std::function<void(const RoutingEvent&)>;

// Top-k over softmax(logits[n, n_expert]) as transformers does (f32 softmax; ties keep the
// lower expert id first), or over the logits with sigmoid weights (RouterScoring::sigmoid),
// or group-limited over sigmoid scores plus the layer's correction bias score_bias
// ([n_expert]; RouterScoring::sigmoid_grouped, core/router_group.h's arithmetic: equal values
// keep the lower group and the lower expert first; the chosen strongest first by s + bias).
Routing route_topk(const RouterSpec& spec, std::span<const float> logits, int64_t n_rows,
                   std::span<const float> score_bias = {});

}  // namespace sluice
