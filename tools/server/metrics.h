// The server's figures in the Prometheus text format (GET /metrics) and as the chat page's
// JSON (GET /v1/cache): requests, tokens, queue depth, live sequences, time to first token,
// tokens per second, the prompt cache (tokens resumed, memory, entries), and with streamed
// experts the expert cache's hit rate (per layer for the page) and the bytes read per tier.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"
#include "experts/stats.h"

namespace sluice::server {

class ServerMetrics {
 public:
  // One HTTP answer: its route ("/v1/completions", or "other") and status.
  void count_response(const std::string& route, int status);
  // The streamer's statistics (taken on the engine thread).
  void set_cache_stats(const RunStats& stats);

  // Prometheus text exposition format, version 0.0.4.
  std::string prometheus(const BatchEngineCounters& engine) const;
  // For the page: tokens/s over the last interval, per-layer hit rates and read rates.
  nlohmann::json live_json(const BatchEngineCounters& engine);

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;  // (route, status) -> count
  std::optional<RunStats> cache_;
  // The page's rates: the previous sample.
  double last_time_ = -1;
  uint64_t last_generated_ = 0, last_disk_bytes_ = 0, last_host_bytes_ = 0;
};

}  // namespace sluice::server
