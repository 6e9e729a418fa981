// RoutingTraceWriter: one JSON object per routed row.
#include "engine/routing_trace.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sluice {

RoutingTraceWriter::RoutingTraceWriter(const std::filesystem::path& path, std::string dataset)
    : file_(path), dataset_(std::move(dataset)) {}

void RoutingTraceWriter::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  file_.commit();
}

void RoutingTraceWriter::write(const RoutingEvent& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Routing& r = *e.routing;
  for (int64_t row = 0; row < r.n_rows; ++row) {
    nlohmann::json j = {{"dataset", dataset_}, {"problem_id", problem_id_}, {"layer", e.layer},
                        {"token_idx", e.first_position + row}};
    j["experts"] = std::vector<int32_t>(r.ids.begin() + row * r.k, r.ids.begin() + (row + 1) * r.k);
    j["gating_probs"] = std::vector<float>(r.weights.begin() + row * r.k, r.weights.begin() + (row + 1) * r.k);
    if (e.predicted_next) {
      const Routing& p = *e.predicted_next;
      j["next_layer"] = e.next_layer;
      j["predicted_next"] = std::vector<int32_t>(p.ids.begin() + row * p.k, p.ids.begin() + (row + 1) * p.k);
    }
    file_.write(j.dump() + "\n");
  }
}

}  // namespace sluice
