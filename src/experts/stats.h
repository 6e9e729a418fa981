// Statistics of expert streaming (DESIGN.md, "Statistics"): counters per MoE layer, kept by
// the streamer on its hot path (plain additions, no logging), and per-run figures; written
// as JSON by `--stats FILE` and summarized in one line at the end of `sluice run`.
//
// Conventions (the consistency checks below rely on them):
//   steps    plan-and-read rounds (sub-batches): one per layer per forward call, more when
//            a prefill's rows are split into sub-batches whose expert union fits the cache
//   rows     tokens over the steps (rows / steps: tokens per sub-batch)
//   overlapped  sub-batches whose reads went out while the previous one still computed (the
//            two-bank pipeline of a streamed prefill)
//   routed   (row, rank) pairs routed to experts of this layer
//   unique   distinct experts per step, summed over steps (the union over the batch rows)
//   hits     unique experts found in the cache, resident or already loading (pending_hits
//            counts the loading ones; they cost a wait but no read)
//   misses   unique experts that had to be read: hits + misses = unique
//   host_hits     misses the host tier answered (no disk read; still counted in bytes)
//   low_bit_reads reads of low-bit copies (--miss-kind) issued beside the misses
//   bytes_demand  bytes read for misses (misses x the record stride of their kind, plus
//                 low_bit_reads x the low-bit kind's stride)
//   prefetch_*    lookahead: predictions issued as reads, predictions already in the cache,
//                 and demand accesses that found a prefetched record (confirmed predictions)
//   cut           misses dropped by the deadline (--cut); low_bit of them were replaced by a
//                 landed low-bit copy (--miss-kind)
//   compute_seconds  the model thread computing experts (CPU streamer; 0 on CUDA, where the
//                 device computes)
// The counters are kept per phase too: prefill (a forward call of several rows of one
// sequence: a prompt chunk) and decode (one token per sequence).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice {

struct LayerStats {
  uint64_t steps = 0;               // plan-and-read rounds (see above)
  uint64_t rows = 0;                // tokens over the steps
  uint64_t overlapped = 0;          // steps planned (reads issued) while the previous one computed
  uint64_t routed = 0, unique = 0;
  uint64_t hits = 0, pending_hits = 0, misses = 0;
  uint64_t host_hits = 0, low_bit_reads = 0;
  uint64_t bytes_demand = 0, bytes_prefetch = 0;
  uint64_t prefetch_requests = 0;   // reads issued for predictions
  uint64_t prefetch_already = 0;    // predictions already resident or loading
  uint64_t prefetch_hits = 0;       // demand accesses that found a prefetched record
  uint64_t cut = 0, low_bit = 0;
  double demand_wait_seconds = 0;   // waiting for demand reads to land
  double prefetch_wait_seconds = 0; // waiting for prefetched records still loading
  double service_wall_seconds = 0;  // the streamer's own work: plan, acquire, issue, publish
  double service_cpu_seconds = 0;   // the same, in thread CPU time
  double compute_seconds = 0;       // computing experts on the model thread (CPU streamer)

  LayerStats& operator+=(const LayerStats& o);
  double hit_rate() const { return unique ? static_cast<double>(hits) / static_cast<double>(unique) : 0; }
};

enum class StreamPhase : uint8_t { prefill, decode };
std::string_view stream_phase_name(StreamPhase p);  // "prefill", "decode"

// --kl-check (engine/kl_check.h): how far the lossy decode steps (--cut, --miss-kind) were from
// the exact steps, KL(exact || lossy) in nats per token over the checked steps.
struct KlCheckStats {
  bool on = false;                    // --kl-check was asked for
  bool by_construction = false;       // no lossy option: every step is exact, nothing checked
  int64_t steps = 0;                  // decode steps checked
  int64_t decode_steps = 0;           // decode steps run (the pool the checked ones came from)
  double mean_nats = 0, max_nats = 0;
  double seconds = 0;                 // the exact passes' wall time (left out of decode_seconds)
  nlohmann::json to_json() const;     // null when off
};

// Where a run's routing came from: the model's routers, or a recorded trace replayed in their
// place (--replay-routing, experts/routing_replay.h). Every report of a replayed run says so.
struct RoutingSource {
  bool replayed = false;
  std::string trace;    // the trace's file name
  std::string mapping;  // "ids" or "fit"
  std::string rule;     // the mapping in words
  std::string fit;      // the generator's fit (mapping fit), else empty
  // "model" or "replay:routing-model-128e-code/ids" (the trace's name without .jsonl[.xz]).
  std::string short_label() const;
  nlohmann::json to_json() const;  // {"replayed": false} or every field
};

struct RunStats {
  std::vector<LayerStats> layers;   // one per MoE layer, both phases
  LayerStats prefill, decode;       // every layer's counters of one phase

  // Tokens and the wall time of the forward calls that processed them.
  uint64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;

  // The cache and how it was run.
  uint64_t cache_bytes = 0, slot_bytes = 0, host_cache_bytes = 0;
  int64_t slots = 0, speculative_slots = 0;
  std::string policy, kind, miss_kind;  // miss_kind empty: misses use `kind`
  bool lookahead = false;
  double cut = 0;                       // 0: off
  double cut_share = 0;                 // the relative cut (--profile fast); 0: off

  // The IO engine (its counters: io_engine.h).
  std::string io_mode;                  // "direct" or "buffered" (what the files got)
  bool io_uring = false;
  int io_depth = 0;
  uint64_t io_reads = 0, io_bytes = 0;
  double io_busy_seconds = 0;           // wall time with at least one read in flight
  uint64_t h2d_bytes = 0;               // bytes copied into device slots (CUDA streamer; 0 on the CPU)

  KlCheckStats kl_check;                // filled by the front end (sluice run --kl-check)
  RoutingSource routing;                // filled by the front end (--replay-routing)

  LayerStats totals() const;
  double hit_rate() const { return totals().hit_rate(); }
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0; }
  // Achieved read bandwidth, bytes per second of busy IO time.
  double read_bytes_per_second() const { return io_busy_seconds > 0 ? io_bytes / io_busy_seconds : 0; }
  // The share of busy IO time the forward pass did not wait for (reads hidden behind
  // compute): 1 - (demand + prefetch waits) / busy time, clamped to [0, 1].
  double read_hidden_share() const;

  nlohmann::json to_json() const;
  void write_json(const std::filesystem::path& path) const;  // atomic replace
  // "decode 5.31 tok/s | expert cache 512.0 MiB (80 slots, lrfu) | hit rate 0.734 | read 1.23 GB at 1.61 GB/s",
  // with a replayed routing "decode 5.31 tok/s (replayed routing: TRACE, ids) | ...",
  // and when a prefill was streamed in more sub-batches than layers:
  // " | prefill 3.0 sub-batches a layer of 21.3 tokens, hit rate 0.512, read 0.80 GB, waited 1.20 s, computed 2.10 s"
  std::string summary() const;

  // Violations of the conventions above, one line each (empty when consistent).
  // record_stride > 0 also checks bytes_demand = misses x stride + low_bit_reads x
  // low_bit_stride, and bytes_prefetch = prefetch_requests x stride.
  std::vector<std::string> consistency_errors(uint64_t record_stride = 0, uint64_t low_bit_stride = 0) const;
};

// CPU time of the calling thread, in seconds.
double thread_cpu_seconds();

}  // namespace sluice
