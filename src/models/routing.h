// Routing: the experts a MoE layer chose for a batch of rows, strongest first, and a hook
// that lets tools observe every routing decision (trace export, statistics).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace sluice {

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
};

using RoutingObserver = std::function<void(const RoutingEvent&)>;

}  // namespace sluice
