// StreamingProvider: an ExpertProvider that streams a pack's routed experts through a bounded
// expert cache, as the front ends see it (statistics, draining, the cache's shape). Two
// implementations, picked for a backend by make_streamer: ExpertStreamer (experts/streamer.h,
// the CPU backend: slots in host memory) and CudaStreamer (experts/cuda/cuda_streamer.h:
// slots in device memory, the four-signal handshake; in CUDA builds).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/streamer_options.h"
#include "format/pack.h"
#include "experts/expert_provider.h"

namespace sluice {

class StreamingProvider : public ExpertProvider {
 public:
  StreamingProvider() = default;
  // A streamer owns slots, reads in flight and threads: it is never copied.
  StreamingProvider(const StreamingProvider&) = delete;
  StreamingProvider& operator=(const StreamingProvider&) = delete;

  // The per-layer figures, the cache and the IO engine since construction or the last
  // reset_stats() (tokens and their seconds are the caller's to fill in).
  virtual RunStats stats() const = 0;
  virtual void reset_stats() = 0;
  // Waits (bounded) until no read or copy is in flight and lands what arrived. False when the
  // wait ran out.
  virtual bool drain(std::chrono::milliseconds wait) = 0;
  virtual int32_t n_slots() const = 0;
  virtual uint64_t slot_bytes() const = 0;
  virtual DType kind() const = 0;
  virtual const StreamerOptions& options() const = 0;
  // The device (or CPU) cache's residency; read it only between forward calls.
  virtual const Residency& residency() const = 0;
};

// Lookahead's prediction made on the host: the next MoE layer's router (call.next_router and
// its bias) over rows [row0, row1) of call.h, routed as call.router routes (route_topk), as
// the predicted union (predicted_union order). For the host-routed steps of both streamers.
std::vector<std::pair<float, int32_t>> predict_next_union(Backend& be, const MoeLayerCall& call, int64_t row0,
                                                          int64_t row1, int64_t n_expert);

// Lookahead's prediction of the next MoE layer for rows [row0, row1) of a call, made on the
// host: with a replayed routing (call.replay) the replay's predictions of those rows (empty
// when it has none for this layer), else predict_next_union.
std::vector<std::pair<float, int32_t>> lookahead_union(Backend& be, const MoeLayerCall& call, int64_t row0,
                                                       int64_t row1, int64_t n_expert);

// The streamer for `backend`: CudaStreamer on a CUDA backend, ExpertStreamer otherwise.
// top_k: experts per token (the fewest slots a cache may have). Throws invalid_argument for a
// cache below top_k slots (the message states the minimum), a miss kind the pack lacks, bad
// options; out_of_memory when the slots do not fit.
std::shared_ptr<StreamingProvider> make_streamer(std::shared_ptr<const Pack> pack, DType kind, int64_t top_k,
                                                 Backend& backend, const StreamerOptions& opt);

}  // namespace sluice
