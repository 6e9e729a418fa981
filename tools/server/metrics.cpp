// ServerMetrics (metrics.h).
#include "metrics.h"

#include <chrono>
#include <cstdio>

namespace sluice::server {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One metric family: HELP, TYPE and its samples.
void family(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  out += name;
  out += buf;
}

// Bytes the host tier served: a record's stride each (slot_bytes, the largest stride).
uint64_t host_tier_bytes(const RunStats& s) { return s.totals().host_hits * s.slot_bytes; }

}  // namespace

void ServerMetrics::count_response(const std::string& route, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++responses_[{route, status}];
}

void ServerMetrics::set_cache_stats(const RunStats& stats) {
  std::lock_guard<std::mutex> lk(mu_);
  cache_ = stats;
}

std::string ServerMetrics::prometheus(const BatchEngineCounters& e) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  family(out, "sluice_http_responses_total", "counter", "HTTP responses by route and status code.");
  for (const auto& [key, n] : responses_)
    sample(out, "sluice_http_responses_total{route=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"}",
           static_cast<double>(n));
  family(out, "sluice_requests_total", "counter", "Completion requests by how they ended.");
  sample(out, "sluice_requests_total{state=\"submitted\"}", static_cast<double>(e.requests_submitted));
  sample(out, "sluice_requests_total{state=\"done\"}", static_cast<double>(e.requests_done));
  sample(out, "sluice_requests_total{state=\"cancelled\"}", static_cast<double>(e.requests_cancelled));
  sample(out, "sluice_requests_total{state=\"failed\"}", static_cast<double>(e.requests_failed));
  sample(out, "sluice_requests_total{state=\"refused\"}", static_cast<double>(e.requests_refused));
  family(out, "sluice_prompt_tokens_total", "counter", "Prompt tokens admitted.");
  sample(out, "sluice_prompt_tokens_total", static_cast<double>(e.prompt_tokens));
  family(out, "sluice_generated_tokens_total", "counter", "Tokens generated.");
  sample(out, "sluice_generated_tokens_total", static_cast<double>(e.generated_tokens));
  family(out, "sluice_tokens_per_second", "gauge", "Generated tokens per second of the engine's busy time.");
  sample(out, "sluice_tokens_per_second", e.busy_seconds > 0 ? static_cast<double>(e.generated_tokens) / e.busy_seconds : 0);
  family(out, "sluice_queue_depth", "gauge", "Requests waiting for a sequence.");
  sample(out, "sluice_queue_depth", static_cast<double>(e.queued));
  family(out, "sluice_active_sequences", "gauge", "Requests holding a sequence.");
  sample(out, "sluice_active_sequences", static_cast<double>(e.live_sequences));
  family(out, "sluice_sequence_slots", "gauge", "Sequence states (KV slots): in use and in all.");
  sample(out, "sluice_sequence_slots{state=\"in_use\"}", static_cast<double>(e.slots_in_use));
  sample(out, "sluice_sequence_slots{state=\"total\"}", static_cast<double>(e.n_parallel));
  family(out, "sluice_decode_steps_total", "counter", "Batched decode steps and the sequences they carried.");
  sample(out, "sluice_decode_steps_total", static_cast<double>(e.decode_steps));
  sample(out, "sluice_decode_rows_total", static_cast<double>(e.decode_rows));
  family(out, "sluice_time_to_first_token_seconds", "summary", "Time from a request's arrival to its first token.");
  sample(out, "sluice_time_to_first_token_seconds_sum", e.first_token_seconds_sum);
  sample(out, "sluice_time_to_first_token_seconds_count", static_cast<double>(e.first_token_count));
  const PromptCacheCounters& pc = e.prompt_cache;
  family(out, "sluice_prompt_tokens_cached_total", "counter",
         "Prompt tokens resumed from the prompt cache instead of prefilled.");
  sample(out, "sluice_prompt_tokens_cached_total", static_cast<double>(pc.cached_tokens));
  family(out, "sluice_prompt_cache_requests_total", "counter",
         "Prompts looked up in the prompt cache, and those that resumed after at least one token.");
  sample(out, "sluice_prompt_cache_requests_total{result=\"looked_up\"}", static_cast<double>(pc.requests));
  sample(out, "sluice_prompt_cache_requests_total{result=\"hit\"}", static_cast<double>(pc.hits));
  sample(out, "sluice_prompt_cache_requests_total{result=\"host_hit\"}", static_cast<double>(pc.host_hits));
  family(out, "sluice_prompt_cache_bytes", "gauge",
         "Memory of the prompt cache's copies and snapshots: held and budget, on the backend and in the host tier.");
  sample(out, "sluice_prompt_cache_bytes{state=\"held\"}", static_cast<double>(pc.bytes));
  sample(out, "sluice_prompt_cache_bytes{state=\"budget\"}", static_cast<double>(pc.budget_bytes));
  sample(out, "sluice_prompt_cache_bytes{state=\"host_held\"}", static_cast<double>(pc.host_bytes));
  sample(out, "sluice_prompt_cache_bytes{state=\"host_budget\"}", static_cast<double>(pc.host_budget_bytes));
  family(out, "sluice_prompt_cache_entries", "gauge",
         "Prefixes copied out of the sequences (besides what they hold), on the backend and in the host tier.");
  sample(out, "sluice_prompt_cache_entries{tier=\"device\"}", static_cast<double>(pc.entries));
  sample(out, "sluice_prompt_cache_entries{tier=\"host\"}", static_cast<double>(pc.host_entries));
  family(out, "sluice_prompt_cache_snapshots", "gauge", "Recurrent-state snapshots held (hybrid families).");
  sample(out, "sluice_prompt_cache_snapshots", static_cast<double>(pc.snapshots));
  family(out, "sluice_prompt_cache_evictions_total", "counter",
         "Prefixes evicted from the backend's prompt cache for room (to the host tier where it has room).");
  sample(out, "sluice_prompt_cache_evictions_total", static_cast<double>(pc.evictions));
  if (cache_) {
    const LayerStats t = cache_->totals();
    family(out, "sluice_expert_cache_hit_rate", "gauge", "Routed experts found in the expert cache, over all found or read.");
    sample(out, "sluice_expert_cache_hit_rate", t.hit_rate());
    family(out, "sluice_expert_cache_slots", "gauge", "Slots of the expert cache.");
    sample(out, "sluice_expert_cache_slots", static_cast<double>(cache_->slots));
    family(out, "sluice_expert_bytes_read_total", "counter", "Expert bytes brought into the cache, per tier they came from.");
    sample(out, "sluice_expert_bytes_read_total{tier=\"disk\"}", static_cast<double>(cache_->io_bytes));
    sample(out, "sluice_expert_bytes_read_total{tier=\"host\"}", static_cast<double>(host_tier_bytes(*cache_)));
  }
  return out;
}

nlohmann::json ServerMetrics::live_json(const BatchEngineCounters& e) {
  std::lock_guard<std::mutex> lk(mu_);
  const double t = now_seconds();
  const uint64_t disk = cache_ ? cache_->io_bytes : 0, host = cache_ ? host_tier_bytes(*cache_) : 0;
  double tok_s = 0, disk_bs = 0, host_bs = 0;
  if (last_time_ > 0 && t > last_time_) {
    const double dt = t - last_time_;
    tok_s = static_cast<double>(e.generated_tokens - last_generated_) / dt;
    disk_bs = static_cast<double>(disk - std::min(disk, last_disk_bytes_)) / dt;
    host_bs = static_cast<double>(host - std::min(host, last_host_bytes_)) / dt;
  }
  last_time_ = t;
  last_generated_ = e.generated_tokens;
  last_disk_bytes_ = disk;
  last_host_bytes_ = host;
  nlohmann::json layers = nlohmann::json::array();
  if (cache_)
    for (const LayerStats& l : cache_->layers) layers.push_back({{"hit_rate", l.hit_rate()}, {"unique", l.unique}});
  return {{"streaming", cache_.has_value()},
          {"tokens_per_second", tok_s},
          {"disk_bytes_per_second", disk_bs},
          {"host_bytes_per_second", host_bs},
          {"hit_rate", cache_ ? cache_->totals().hit_rate() : 0.0},
          {"active_sequences", e.live_sequences},
          {"queued", e.queued},
          {"generated_tokens", e.generated_tokens},
          {"layers", layers}};
}

}  // namespace sluice::server
