// RoutingTraceWriter: writes every routing decision as JSON lines in
// the routing-trace format (docs/trace-format.md: problem_id, layer, token_idx, experts strongest first, gating_probs), so a
// model's real routing can be replayed by `sluice simulate`. The file is an OutputFile
// (format/output_file.h): whole lines only, and it appears (or replaces the old one) at
// close(); a writer destroyed without close() leaves no file behind (a FIFO or device keeps
// the lines already written). With the lookahead prediction on (Model::set_routing_observer),
// each line also has "next_layer" and "predicted_next" (that layer's predicted experts,
// strongest first), which `sluice simulate` hands to prediction-aware policies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>

#include "format/output_file.h"
#include "experts/routing.h"

namespace sluice {

class RoutingTraceWriter {
 public:
  explicit RoutingTraceWriter(const std::filesystem::path& path, std::string dataset = "sluice");
  RoutingTraceWriter(const RoutingTraceWriter&) = delete;
  RoutingTraceWriter& operator=(const RoutingTraceWriter&) = delete;

  void set_problem(int64_t problem_id) { problem_id_ = problem_id; }
  void write(const RoutingEvent& event);
  // Writes what is buffered and puts the file in place; the trace's last line is whole.
  void close();
  RoutingObserver observer() {
    return [this](const RoutingEvent& e) { write(e); };
  }

 private:
  OutputFile file_;
  std::string dataset_;
  int64_t problem_id_ = 0;
  std::mutex mutex_;
};

}  // namespace sluice
