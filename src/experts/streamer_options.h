// The options of expert streaming (experts/streamer.h), apart from the streamer itself so
// that the model loader's options can carry them without pulling in the IO engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include "experts/policy.h"
#include "format/pack.h"

namespace sluice {

enum class IoMode { direct, buffered };  // O_DIRECT reads, or through the page cache
// How a host thread waits for the device (CUDA streamer): spinning on the signal saves
// microseconds per layer; blocking (short sleeps between looks) keeps a core cool.
enum class WaitMode { spin, block };

struct StreamerOptions {
  uint64_t cache_bytes = 0;      // --expert-cache: slots = cache_bytes / slot bytes
  int32_t slots = 0;             // --expert-slots (takes precedence over cache_bytes)
  PolicyKind policy = kDefaultPolicy;
  IoMode io_mode = IoMode::direct;
  int io_depth = 8;              // reads in flight
  uint64_t host_cache_bytes = 0; // --host-cache: a RAM tier of evicted records (0: none)
  bool lookahead = false;
  double cut = 0;                // deadline cut below this routing weight, in (0, 1]; 0: off
  // Deadline cut relative to the token's routing (--profile fast): a late miss goes when its
  // weight is below cut_share x the uniform share of its row (the row's top-k weight over k),
  // in (0, 1]; 0: off. Unlike `cut`, it means the same at any top-k (top-1 is never cut) and
  // for routers whose top-k weights are not renormalized. `cut` wins when both are set.
  double cut_share = 0;
  std::optional<DType> miss_kind;  // the low-bit copy a late miss may use instead
  bool verify_reads = false;     // check every record read against its manifest checksum
  std::chrono::milliseconds io_timeout{30000};  // one read; a step waits at most 2x + 5 s
  // CUDA streamer: the longest any host wait on the device (or the device on the host) may
  // take before the run fails with an error naming the layer and the signal.
  std::chrono::milliseconds wait_timeout{30000};
  WaitMode wait_mode = WaitMode::spin;  // CUDA streamer's host waits (--wait spin|block)
  // Developer option (--fake-experts): misses are not read; their slots are used with
  // whatever bytes they hold, to measure the compute-only bound. Results are meaningless.
  bool fake_experts = false;
  // Benchmarks (--host-cache-preload, CUDA streamer): fill the host tier from the pack at
  // start-up (the first records up to its size), so a run measures experts served from RAM.
  bool host_cache_preload = false;
  // Measurement only: every miss counts as late at the deadline and every low-bit copy as
  // landed (the reads still happen), so the cost of --cut / --miss-kind is measured for the
  // worst case and reproducibly, whatever the disk's speed.
  bool deadline_worst_case = false;
  // A prefill split into sub-batches: 1 bank (default on the CPU) plans each sub-batch after
  // the previous one retired; 2 banks give each sub-batch half the cache and issue sub-batch
  // i+1's reads while i computes. Measured on the CPU (bench_streaming --prefill-banks,
  // bench/RESULTS.md) two banks lose: the CPU streamer already computes a sub-batch's experts
  // as their reads land, so its reads hide behind its own compute, and halving the sub-batches
  // re-reads more records. The device path, which computes a sub-batch only once all of it
  // landed, is where the second bank pays.
  int prefill_banks = 1;
  // Tests only: (record, the OS's answer to a read: bytes or -errno) -> the answer to act on
  // (IoEngineOptions::fault_injection).
  std::function<int64_t(int64_t record, int64_t result)> io_fault_injection;
  // Tests only (CUDA streamer): the service thread waits this long before it publishes the
  // first table of the run (a host that answers late), so that the device's own wait times out.
  uint32_t test_publish_delay_us = 0;

  bool enabled() const { return cache_bytes > 0 || slots > 0; }
  // Whether a step may differ from the exact (resident) one: a deadline cut or a low-bit copy
  // standing in for a miss. Lookahead, the policy, the host tier and the cache size never change
  // a result (the layer is combined in routing-rank order).
  bool lossy() const { return cut > 0 || cut_share > 0 || miss_kind.has_value(); }
  bool cuts() const { return cut > 0 || cut_share > 0; }
};

}  // namespace sluice
