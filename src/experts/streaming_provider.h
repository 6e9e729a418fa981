// StreamingProvider: an ExpertProvider that streams a pack's routed experts through a bounded
// expert cache, as the front ends see it (statistics, draining, the cache's shape). Two
// implementations: ExpertStreamer (experts/streamer.h, the CPU backend: slots in host memory)
// and the CUDA streamer (backends/cuda/cuda_streamer.h: slots in device memory, the
// four-signal handshake), built by make_cuda_streamer, which is defined only in CUDA builds.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "experts/residency.h"
#include "experts/stats.h"
#include "experts/streamer_options.h"
#include "format/pack.h"
#include "experts/expert_provider.h"

namespace sluice {

class StreamingProvider : public ExpertProvider {
 public:
  // The per-layer figures, the cache and the IO engine since construction or the last
  // reset_stats() (tokens and their seconds are the caller's to fill in).
  virtual RunStats stats() const = 0;
  virtual void reset_stats() = 0;
  // Waits (bounded) until no read or copy is in flight and lands what arrived. False when the
  // wait ran out.
  virtual bool drain(std::chrono::milliseconds wait) = 0;
  virtual int32_t n_slots() const = 0;
  virtual uint64_t slot_bytes() const = 0;
  virtual ExpertKind kind() const = 0;
  virtual const StreamerOptions& options() const = 0;
  // The device (or CPU) cache's residency; read it only between forward calls.
  virtual const Residency& residency() const = 0;
};

// The CUDA streamer on `backend` (which must be a CUDA backend); top_k: experts per token.
// In a build without CUDA: an unsupported error.
std::shared_ptr<StreamingProvider> make_cuda_streamer(std::shared_ptr<const Pack> pack, ExpertKind kind, int64_t top_k,
                                                      Backend& backend, const StreamerOptions& opt);

}  // namespace sluice
