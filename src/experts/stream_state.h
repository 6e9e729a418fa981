// StreamState: what every streamer holds, whatever memory its slots live in: the pack and
// the kinds in use, the cache's layout, the residency of the slots and of the host tier,
// the IO engine over the pack's expert files, and the per-layer statistics. The CPU streamer
// (streamer.h) and the CUDA streamer (cuda/streamer_impl.h) each own one and add their
// memory; neither sets any of this up on its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "experts/io_engine.h"
#include "experts/plan.h"
#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/streamer_options.h"
#include "format/pack.h"

namespace sluice {

// Reads in flight by their IO tag: the entry of a completion's tag, removed (nothing when the
// tag is not one of these reads).
template <typename Read>
std::optional<Read> take_in_flight(std::unordered_map<uint64_t, Read>& in_flight, uint64_t tag) {
  auto it = in_flight.find(tag);
  if (it == in_flight.end()) return std::nullopt;
  Read r = std::move(it->second);
  in_flight.erase(it);
  return r;
}

struct StreamState {
  // Checks the options against the pack (check_streaming_options), lays the cache out
  // (plan_cache_layout), makes the residencies (the slots' with `on_evict`, and the tier's
  // when --host-cache asks for one) and opens the expert files of the kinds in use. Throws
  // invalid_argument for a cache below top_k slots (the message states the minimum), a miss
  // kind the pack lacks, bad options.
  StreamState(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k, const StreamerOptions& opt,
              std::function<void(int32_t slot, int64_t record, DType kind)> on_evict = {});

  std::shared_ptr<const Pack> pack;
  DType kind;
  int64_t top_k;
  StreamerOptions opt;
  int64_t n_expert = 0, n_layers = 0;      // experts per MoE layer, MoE layers
  uint64_t slot_bytes = 0;                 // the largest record stride of the kinds in use
  CacheLayout layout;
  std::unique_ptr<Residency> residency;    // the slots
  std::unique_ptr<Residency> host;         // the host tier (LRU), or null
  std::unique_ptr<IoEngine> io;
  std::map<DType, int32_t> files;     // IO engine file index per kind in use
  std::vector<LayerStats> layers[2];       // [phase][n_layers]: StreamPhase order (prefill, decode)
  IoCounters io_base;                      // IO counters at the last reset

  // Layer L's counters of a phase.
  LayerStats& layer_stats(int64_t L, StreamPhase phase) {
    return layers[static_cast<size_t>(phase)][static_cast<size_t>(L)];
  }
  // "expert record R (layer L, expert E of kind K)", for messages.
  std::string describe(int64_t record, DType k) const;
  // The read of (record, k) into dest (record_stride bytes at the record's offset).
  ReadRequest read_request(int64_t record, DType k, void* dest, uint64_t tag, IoPriority priority) const;
  // What is wrong with a read of (record, k) that completed into `bytes`: the IO engine's error,
  // or with --verify-reads a checksum mismatch (corrupt) naming the record, the file and the
  // offset. Nothing when the record is good.
  std::optional<Error> landed_error(const ReadCompletion& c, int64_t record, DType k, const uint8_t* bytes) const;
  // The cache's, the options' and the IO engine's part of the statistics (layers included).
  RunStats run_stats() const;
  // Forgets the per-layer counters and takes the IO counters as the new base.
  void reset_counters();
  // The options' IO engine settings.
  static IoEngineOptions io_options(const StreamerOptions& opt);
};

}  // namespace sluice
