// The host/device handshake of the CUDA streamer (DESIGN.md, "The streamed decode step"):
// five monotonic 64-bit signals per MoE layer in host-mapped memory, written and awaited by
// the device (a handshake kernel, expert_copy.h's PhaseHandshake, through device_signals), and
// read and written by the host's service thread with plain atomic loads and stores:
//
//   router_ready    device -> host   the layer's top-k ids and weights are in host memory
//   resident_ready  host -> device   the phase-1 table (resident experts) is published
//   resident_done   device -> host   phase 1 finished: the deadline boundary
//   misses_ready    host -> device   the phase-2 table (landed misses) is published
//   hits_taken      device -> host   (before router_ready) every routed expert was resident in
//                                    the host's slot map: the device took them without waiting,
//                                    the host only plans the layer behind it
//
// A layer's n-th call uses the value n for all of them, so a value never has to be reset and a
// late reader can never mistake an old call for a new one.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>

namespace sluice::cuda {

enum class Signal : int { router_ready = 0, resident_ready = 1, resident_done = 2, misses_ready = 3, hits_taken = 4 };
constexpr int kSignalCount = 5;
const char* signal_name(Signal s);

class Handshake {
 public:
  // Signals for n_layers MoE layers, all 0.
  explicit Handshake(int64_t n_layers);
  ~Handshake();
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  // The layer's kSignalCount signals as the device addresses them (the device-side waits of
  // expert_copy.h's PhaseHandshake).
  uint64_t* device_signals(int64_t layer) const {
    return reinterpret_cast<uint64_t*>(dev_) + layer * kSignalCount;
  }

  // Host side.
  uint64_t load(int64_t layer, Signal sig) const;             // acquire
  void store(int64_t layer, Signal sig, uint64_t value) const;  // after a full fence

 private:
  uint64_t* at(int64_t layer, Signal sig) const { return host_ + layer * kSignalCount + static_cast<int>(sig); }

  int64_t n_layers_ = 0;
  uint64_t* host_ = nullptr;  // [n_layers][kSignalCount], host-mapped
  uint64_t dev_ = 0;          // the same memory as the device sees it
};

enum class HostWait { spin, block };
// One idle step of a host polling loop: a pause instruction (spin) or a 20 us sleep (block).
void host_idle(HostWait mode);

}  // namespace sluice::cuda
