// RoutingTraceWriter: writes every routing decision as JSON lines in the format of
// shared/traces (problem_id, layer, token_idx, experts strongest first, gating_probs), so a
// model's real routing can be replayed by `sluice simulate`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "models/routing.h"

namespace sluice {

class RoutingTraceWriter {
 public:
  explicit RoutingTraceWriter(const std::filesystem::path& path, std::string dataset = "sluice");
  ~RoutingTraceWriter();
  RoutingTraceWriter(const RoutingTraceWriter&) = delete;
  RoutingTraceWriter& operator=(const RoutingTraceWriter&) = delete;

  void set_problem(int64_t problem_id) { problem_id_ = problem_id; }
  void write(const RoutingEvent& event);
  RoutingObserver observer() {
    return [this](const RoutingEvent& e) { write(e); };
  }

 private:
  std::FILE* file_ = nullptr;
  std::string path_, dataset_;
  int64_t problem_id_ = 0;
  std::mutex mutex_;
};

}  // namespace sluice
