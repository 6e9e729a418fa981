// RunStats: totals, the JSON document of --stats, the summary line, consistency checks.
#include "experts/stats.h"

#include <time.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/units.h"
#include "format/file_io.h"

namespace sluice {

LayerStats& LayerStats::operator+=(const LayerStats& o) {
  steps += o.steps;
  rows += o.rows;
  overlapped += o.overlapped;
  routed += o.routed;
  unique += o.unique;
  hits += o.hits;
  pending_hits += o.pending_hits;
  misses += o.misses;
  host_hits += o.host_hits;
  low_bit_reads += o.low_bit_reads;
  bytes_demand += o.bytes_demand;
  bytes_prefetch += o.bytes_prefetch;
  prefetch_requests += o.prefetch_requests;
  prefetch_already += o.prefetch_already;
  prefetch_hits += o.prefetch_hits;
  cut += o.cut;
  low_bit += o.low_bit;
  demand_wait_seconds += o.demand_wait_seconds;
  prefetch_wait_seconds += o.prefetch_wait_seconds;
  service_wall_seconds += o.service_wall_seconds;
  service_cpu_seconds += o.service_cpu_seconds;
  compute_seconds += o.compute_seconds;
  return *this;
}

std::string_view stream_phase_name(StreamPhase p) { return p == StreamPhase::prefill ? "prefill" : "decode"; }

LayerStats RunStats::totals() const {
  LayerStats t;
  for (const LayerStats& l : layers) t += l;
  return t;
}

namespace {

nlohmann::json layer_json(const LayerStats& l) {
  return {
      {"steps", l.steps},
      {"rows", l.rows},
      {"overlapped", l.overlapped},
      {"routed", l.routed},
      {"unique", l.unique},
      {"hits", l.hits},
      {"pending_hits", l.pending_hits},
      {"misses", l.misses},
      {"host_hits", l.host_hits},
      {"low_bit_reads", l.low_bit_reads},
      {"hit_rate", l.hit_rate()},
      {"bytes_read_demand", l.bytes_demand},
      {"bytes_read_prefetch", l.bytes_prefetch},
      {"prefetch_requests", l.prefetch_requests},
      {"prefetch_already_resident", l.prefetch_already},
      {"prefetch_hits", l.prefetch_hits},
      {"cut", l.cut},
      {"cut_low_bit", l.low_bit},
      {"demand_wait_seconds", l.demand_wait_seconds},
      {"prefetch_wait_seconds", l.prefetch_wait_seconds},
      {"service_wall_seconds", l.service_wall_seconds},
      {"service_cpu_seconds", l.service_cpu_seconds},
      {"compute_seconds", l.compute_seconds},
  };
}

}  // namespace

nlohmann::json KlCheckStats::to_json() const {
  if (!on) return nullptr;
  return {{"steps", steps},
          {"decode_steps", decode_steps},
          {"mean_nats", mean_nats},
          {"max_nats", max_nats},
          {"by_construction", by_construction},
          {"seconds", seconds}};
}

std::string RoutingSource::short_label() const {
  if (!replayed) return "model";
  std::string name = trace;
  for (const char* ext : {".xz", ".jsonl", ".json"})
    if (name.size() > std::string_view(ext).size() && name.ends_with(ext)) name.resize(name.size() - std::string_view(ext).size());
  return "replay:" + name + "/" + mapping;
}

nlohmann::json RoutingSource::to_json() const {
  if (!replayed) return {{"replayed", false}};
  return {{"replayed", true}, {"trace", trace}, {"mapping", mapping}, {"rule", rule},
          {"fit", fit.empty() ? nlohmann::json(nullptr) : nlohmann::json(fit)}};
}

nlohmann::json RunStats::to_json() const {
  nlohmann::json layers_json = nlohmann::json::array();
  for (size_t i = 0; i < layers.size(); ++i) {
    nlohmann::json j = layer_json(layers[i]);
    j["moe_layer"] = i;
    layers_json.push_back(std::move(j));
  }
  const LayerStats t = totals();
  return {
      {"run",
       {
           {"prefill_tokens", prefill_tokens},
           {"prefill_seconds", prefill_seconds},
           {"prefill_tokens_per_second", prefill_tokens_per_second()},
           {"decode_tokens", decode_tokens},
           {"decode_seconds", decode_seconds},
           {"decode_tokens_per_second", decode_tokens_per_second()},
           {"hit_rate", t.hit_rate()},
           {"bytes_read", io_bytes},
           {"read_bytes_per_second", read_bytes_per_second()},
           {"read_hidden_share", read_hidden_share()},
           {"cache",
            {{"bytes", cache_bytes},
             {"slots", slots},
             {"slot_bytes", slot_bytes},
             {"speculative_slots", speculative_slots},
             {"host_cache_bytes", host_cache_bytes},
             {"policy", policy}}},
           {"options",
            {{"kind", kind},
             {"miss_kind", miss_kind.empty() ? nlohmann::json(nullptr) : nlohmann::json(miss_kind)},
             {"lookahead", lookahead},
             {"cut", cut > 0 ? nlohmann::json(cut) : nlohmann::json(nullptr)},
             {"cut_share", cut_share > 0 ? nlohmann::json(cut_share) : nlohmann::json(nullptr)}}},
           {"io",
            {{"mode", io_mode},
             {"io_uring", io_uring},
             {"depth", io_depth},
             {"reads", io_reads},
             {"bytes", io_bytes},
             {"busy_seconds", io_busy_seconds},
             {"h2d_bytes", h2d_bytes}}},
           {"kl_check", kl_check.to_json()},
           {"routing", routing.to_json()},
           {"totals", layer_json(t)},
           {"phases", {{"prefill", layer_json(prefill)}, {"decode", layer_json(decode)}}},
           {"sub_batches_per_layer", layers.empty() ? 0.0 : static_cast<double>(prefill.steps) / layers.size()},
           {"tokens_per_sub_batch", prefill.steps ? static_cast<double>(prefill.rows) / prefill.steps : 0.0},
       }},
      {"layers", std::move(layers_json)},
  };
}

void RunStats::write_json(const std::filesystem::path& path) const {
  const std::string text = to_json().dump(2) + "\n";
  const std::span<const uint8_t> part(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_file_atomic(path, std::span<const std::span<const uint8_t>>(&part, 1));
}

std::string RunStats::summary() const {
  char buf[320];
  // A run without decode steps (logits, perplexity) reports its prefill speed instead.
  const bool decode = decode_tokens > 0;
  const std::string replayed =
      routing.replayed ? str(" (replayed routing: ", routing.trace, ", ", routing.mapping, ")") : std::string();
  std::snprintf(buf, sizeof buf,
                "%s %.2f tok/s%s | expert cache %s (%lld slots, %s) | hit rate %.3f | read %.2f GB at %.2f GB/s",
                decode ? "decode" : "prefill", decode ? decode_tokens_per_second() : prefill_tokens_per_second(),
                replayed.c_str(), byte_size_text(cache_bytes).c_str(),
                static_cast<long long>(slots), policy.c_str(), hit_rate(), static_cast<double>(io_bytes) / 1e9,
                read_bytes_per_second() / 1e9);
  std::string s = buf;
  // The streamed prefill, when its rows were split into sub-batches (more steps than layers).
  if (!layers.empty() && prefill.steps > layers.size()) {
    std::snprintf(buf, sizeof buf,
                  " | prefill %.1f sub-batches a layer of %.1f tokens, hit rate %.3f, read %.2f GB, waited %.2f s, "
                  "computed %.2f s",
                  static_cast<double>(prefill.steps) / static_cast<double>(layers.size()),
                  static_cast<double>(prefill.rows) / static_cast<double>(prefill.steps), prefill.hit_rate(),
                  static_cast<double>(prefill.bytes_demand + prefill.bytes_prefetch) / 1e9, prefill.demand_wait_seconds,
                  prefill.compute_seconds);
    s += buf;
  }
  return s;
}

double RunStats::read_hidden_share() const {
  if (io_busy_seconds <= 0) return 0;
  const LayerStats t = totals();
  const double waited = t.demand_wait_seconds + t.prefetch_wait_seconds;
  return std::clamp(1.0 - waited / io_busy_seconds, 0.0, 1.0);
}

std::vector<std::string> RunStats::consistency_errors(uint64_t record_stride, uint64_t low_bit_stride) const {
  std::vector<std::string> errs;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerStats& l = layers[i];
    const std::string at = str("moe layer ", i, ": ");
    if (l.hits + l.misses != l.unique) errs.push_back(str(at, "hits ", l.hits, " + misses ", l.misses, " != unique ", l.unique));
    if (l.unique > l.routed) errs.push_back(str(at, "unique ", l.unique, " > routed ", l.routed));
    if (l.pending_hits > l.hits) errs.push_back(str(at, "pending hits ", l.pending_hits, " > hits ", l.hits));
    if (l.cut > l.misses + l.pending_hits) errs.push_back(str(at, "cut ", l.cut, " > misses and pending hits"));
    if (l.low_bit > l.cut) errs.push_back(str(at, "low-bit substitutes ", l.low_bit, " > cut ", l.cut));
    if (l.prefetch_hits > l.hits) errs.push_back(str(at, "prefetch hits ", l.prefetch_hits, " > hits ", l.hits));
    if (l.host_hits > l.misses + l.prefetch_requests)
      errs.push_back(str(at, "host-tier hits ", l.host_hits, " > misses and prefetch requests"));
    if (l.overlapped > l.steps) errs.push_back(str(at, "overlapped steps ", l.overlapped, " > steps ", l.steps));
    if (l.steps > 0 && l.routed == 0) errs.push_back(str(at, l.steps, " steps but nothing routed"));
    if (record_stride > 0) {
      if (l.bytes_demand != l.misses * record_stride + l.low_bit_reads * low_bit_stride)
        errs.push_back(str(at, "demand bytes ", l.bytes_demand, " != misses ", l.misses, " x stride ", record_stride,
                           l.low_bit_reads ? str(" + low-bit reads ", l.low_bit_reads, " x ", low_bit_stride) : ""));
      if (l.bytes_prefetch != l.prefetch_requests * record_stride)
        errs.push_back(str(at, "prefetch bytes ", l.bytes_prefetch, " != requests ", l.prefetch_requests, " x stride ",
                           record_stride));
    }
    for (double s : {l.demand_wait_seconds, l.prefetch_wait_seconds, l.service_wall_seconds, l.service_cpu_seconds,
                     l.compute_seconds})
      if (!(s >= 0)) errs.push_back(str(at, "negative or NaN time ", s));
  }
  const LayerStats t = totals();
  // The layers account a whole stride per read at issue; the disk delivers at most that (a
  // record's used bytes, or nothing when a RAM tier answers).
  if (io_bytes > t.bytes_demand + t.bytes_prefetch)
    errs.push_back(str("run: the IO engine read ", io_bytes, " bytes, more than the layers account for (",
                       t.bytes_demand + t.bytes_prefetch, ")"));
  if (slots > 0 && speculative_slots >= slots)
    errs.push_back(str("run: speculative slots ", speculative_slots, " >= slots ", slots));
  return errs;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace sluice
